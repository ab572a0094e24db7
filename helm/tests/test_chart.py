"""Tests of the Helm chart helm/shoal, run by helm/tests/run.sh (and so by scripts/test.sh).

Helm itself is the Helm v4 Go SDK through PyPI `helm-python-sdk` (import `helm_python`: a
ctypes binding to libhelm_c, no `helm` binary): `helm.lint` is `helm lint`, `Chart.render` is
`helm template` (offline, values.schema.json enforced). Rendered objects are checked against
the Kubernetes OpenAPI schemas shipped by PyPI `kubernetes-validate`, in strict mode (unknown
fields fail), for the newest Kubernetes version the package has.

Everything the chart says about the binaries is checked against the binaries themselves
(target/debug/shoal-server and shoal-ingester, or SHOAL_BIN_DIR): every flag and SHOAL_*
variable a container gets must be one `--help` lists, the rendered arguments must parse, and
the probe paths must answer 200 on a running server's admin port.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from contextlib import ExitStack, contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "shoal"
EXAMPLES = CHART / "examples"
BIN_DIR = Path(os.environ.get("SHOAL_BIN_DIR", REPO / "target" / "debug"))
MESH_EXAMPLE = REPO / "docs" / "examples" / "mesh"

RELEASE = "shoal"
NAMESPACE = "shoal-system"
KUBE_VERSION = kubernetes_validate.latest_version()

BINARIES = {"server": "shoal-server", "ingester": "shoal-ingester"}

# ingester.binarySupport switch -> the design's flag it turns on. A switch stays off until the
# shoal-ingester binary accepts the flag (see test_ingester_design_flags_pending).
DESIGN_INGESTER_FLAGS = {
    "adminAddr": "--admin-addr",
    "systemNamespace": "--system-namespace",
    "watchConfig": "--watch-config",
    "meshConfig": "--mesh-config",
    "remoteClusterTimeout": "--remote-cluster-timeout",
}

# What the ingester lists and watches, per API group: its ClusterRole must be exactly this.
INGESTER_CLUSTER_RULES = {
    "": {"namespaces", "services", "pods", "nodes"},
    "discovery.k8s.io": {"endpointslices"},
    "networking.istio.io": {
        "gateways",
        "virtualservices",
        "destinationrules",
        "sidecars",
        "serviceentries",
        "workloadentries",
    },
    "security.istio.io": {
        "peerauthentications",
        "authorizationpolicies",
        "requestauthentications",
    },
    "gateway.networking.k8s.io": {
        "gatewayclasses",
        "gateways",
        "httproutes",
        "grpcroutes",
        "tcproutes",
        "tlsroutes",
        "referencegrants",
    },
    "apiextensions.k8s.io": {"customresourcedefinitions"},
}
READ_VERBS = {"get", "list", "watch"}
# The only writes: the status subresource of the Istio kinds it reads (a rejected object's
# reason) and of the Gateway API kinds (their conditions), never their spec; and, with the workload CA on, the root-certificate ConfigMap
# (istio-ca-root-cert) in every namespace: create and update, never delete.
STATUS_VERBS = {"update", "patch"}
CONFIG_MAP_VERBS = {"get", "list", "watch", "create", "update"}
# gateways.deployment: what the leader writes for each Gateway API Gateway.
DEPLOY_RULES = [
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "create", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["services", "serviceaccounts"], "verbs": ["get", "create", "patch", "delete"]},
]
INGESTER_STATUS_RULES = {
    group: {f"{kind}/status" for kind in INGESTER_CLUSTER_RULES[group] if kind != "referencegrants"}
    for group in ("networking.istio.io", "security.istio.io", "gateway.networking.k8s.io")
}

CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "Namespace", "CustomResourceDefinition"}


# --- values sets ---------------------------------------------------------------------------


def values_file(name: str) -> dict[str, Any]:
    # Parsed by Helm's own YAML reader, as `helm template -f FILE` would.
    return helm.values_from_yaml((EXAMPLES / name).read_text())


def everything_on() -> dict[str, Any]:
    """Optional features on (the binary flags stay as values.yaml has them)."""
    return {
        "nats": {
            "url": "nats://a:4222,nats://b:4222",
            "replicas": 3,
            "credentialsSecret": {"name": "nats-creds", "key": "user.creds"},
            "tls": {"enabled": True, "secret": "nats-tls"},
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "image": {"digest": "sha256:" + "a" * 64},
        "server": {
            "autoscaling": {"enabled": False},
            "replicaCount": 3,
            "podDisruptionBudget": {"maxUnavailable": 1},
            "extraArgs": ["--cluster-id=Kubernetes"],
            "extraEnv": [{"name": "SHOAL_LOG_FORMAT", "value": "text"}],
            "podAnnotations": {"example.com/a": "b"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-cluster-critical",
        },
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "gateways": {
            "credentials": {"enabled": True},
            "deployment": {"enabled": True, "proxyImage": "example.com/proxy:1"},
        },
    }


def design() -> dict[str, Any]:
    """Two fleets with every switchable ingester flag on, whatever values.yaml says."""
    vals = values_file("two-fleets-values.yaml")
    vals["ingester"] = {"binarySupport": {k: True for k in DESIGN_INGESTER_FLAGS}}
    vals["serviceMonitor"] = {"enabled": True}
    return vals


def older_ingester() -> dict[str, Any]:
    """An image whose ingester has none of the switchable flags."""
    return {"ingester": {"binarySupport": {k: False for k in DESIGN_INGESTER_FLAGS}}}


VALUE_SETS: dict[str, Any] = {
    "default": lambda: None,
    "older-ingester": older_ingester,
    "two-fleets": lambda: values_file("two-fleets-values.yaml"),
    "nats-cluster": lambda: values_file("nats-cluster-values.yaml"),
    "nats-secure": lambda: values_file("nats-secure-values.yaml"),
    "everything-on": everything_on,
    "design": design,
}
# Value sets whose container args must be accepted by today's binaries.
DEPLOYABLE = ["default", "older-ingester", "two-fleets", "nats-cluster", "nats-secure", "everything-on"]


# --- rendering -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chart():
    with helm.Chart.load(CHART) as c:
        yield c


@cache
def _render_raw(value_set: str) -> tuple[tuple[str, str], ...]:
    with helm.Chart.load(CHART) as c:
        out = c.render(VALUE_SETS[value_set](), name=RELEASE, namespace=NAMESPACE)
    return tuple(sorted(out.items()))


@cache
def _merged_json(value_set: str) -> str:
    with helm.Chart.load(CHART) as c:
        return json.dumps(c.merge_values(VALUE_SETS[value_set]()))


def merged(value_set: str) -> dict[str, Any]:
    """The values an install with this value set would use (defaults coalesced by Helm)."""
    return json.loads(_merged_json(value_set))


def render(value_set: str) -> list[dict[str, Any]]:
    """The objects `helm template` would print, in template order."""
    return objects_of(_render_raw(value_set))


def render_values(chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of one render with these values."""
    return objects_of(sorted(chart.render(values, name=RELEASE, namespace=NAMESPACE).items()))


def objects_of(rendered) -> list[dict[str, Any]]:
    """The objects of rendered (template path, text) pairs."""
    objects = []
    for path, text in rendered:
        if not path.endswith(".yaml"):
            continue  # NOTES.txt
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["__template__"] = path
                objects.append(doc)
    return objects


def strip(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != "__template__"}


def of_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def one(objects, kind, name=None):
    found = [o for o in of_kind(objects, kind) if name is None or o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def component(obj) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


def deployments(objects, comp):
    return [d for d in of_kind(objects, "Deployment") if component(d) == comp]


def pod_spec(deployment):
    return deployment["spec"]["template"]["spec"]


def containers(objects):
    for d in of_kind(objects, "Deployment"):
        for c in pod_spec(d)["containers"]:
            yield d, c


def binary_of(container) -> str:
    cmd = container["command"][0]
    name = os.path.basename(cmd)
    assert name in BINARIES.values(), f"unexpected command {cmd}"
    return name


def arg_value(container, flag) -> str | None:
    for a in container.get("args", []):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def container_port(container, port) -> int:
    if isinstance(port, int):
        return port
    for p in container.get("ports", []):
        if p["name"] == port:
            return p["containerPort"]
    raise AssertionError(f"container {container['name']} has no port named {port}")


def mounted_config_map_file(objects, deployment, container, path: str):
    """The ConfigMap key a container sees at path: (its volumeMount, the ConfigMap, the text)."""
    mount = next(
        (m for m in container.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")),
        None,
    )
    assert mount, f"{container['name']}: {path} is on no volume mount"
    volume = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"])
    assert "configMap" in volume, f"{container['name']}: {path} is not on a ConfigMap volume"
    cm = one(objects, "ConfigMap", volume["configMap"]["name"])
    rel = path[len(mount["mountPath"].rstrip("/")) + 1:]
    key = next((i["key"] for i in volume["configMap"].get("items", []) if i["path"] == rel), rel)
    assert key in cm.get("data", {}), f"ConfigMap {cm['metadata']['name']} has no key {key}"
    return mount, cm, cm["data"][key]


# --- the binaries --------------------------------------------------------------------------


class Help:
    """What a binary's `--help` says it accepts."""

    def __init__(self, path: Path):
        self.path = path
        self.text = subprocess.run(
            [str(path), "--help"], capture_output=True, text=True, check=True, timeout=30
        ).stdout
        self.flags: set[str] = set()
        self.env: dict[str, str] = {}  # SHOAL_* -> flag
        current = None
        for line in self.text.splitlines():
            # Option lines are indented 2-6 spaces; descriptions deeper.
            m = re.match(r"^\s{2,6}(?:-\w, )?(--[a-z0-9][a-z0-9-]*)", line)
            if m:
                current = m.group(1)
                self.flags.add(current)
            for env in re.findall(r"\[env: ([A-Z0-9_]+)=", line):
                assert current, f"env {env} before any flag in {path} --help"
                self.env[env] = current


@cache
def help_of(binary: str) -> Help:
    path = BIN_DIR / binary
    if not path.exists():
        pytest.fail(f"{path} is missing: build it (cargo build -p shoal-server -p shoal-ingester --bins)")
    return Help(path)


def parse_check(binary: str, args: list[str]) -> subprocess.CompletedProcess:
    """Runs `binary ARGS --help`: clap parses (and validates) every argument before the trailing
    --help prints the usage, so exit 0 means the arguments are accepted and nothing runs."""
    return subprocess.run(
        [str(BIN_DIR / binary), *args, "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "")},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def wait_for_200(url: str, proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    last: tuple[int, str] = (0, "no answer")
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before {url} answered 200")
        try:
            last = http_get(url)
            if last[0] == 200:
                return last
            if last[0] == 404:
                raise AssertionError(f"{url}: no such route (404): {last[1][:200]}")
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
            last = (0, str(e))
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered 200 in {timeout}s; last: {last}")


# --- lint ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", ["default", "two-fleets", "nats-cluster", "nats-secure", "everything-on"])
def test_helm_lint_strict(value_set):
    report = helm.lint(
        CHART,
        VALUE_SETS[value_set](),
        strict=True,
        namespace=NAMESPACE,
        kube_version=f"v{KUBE_VERSION}",
    )
    assert report["total_charts_linted"] == 1
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not problems and not report["errors"], json.dumps(report, indent=2)
    for m in report["messages"]:
        print(f"lint info: {m['path']}: {m['error']}")


# --- rendering and Kubernetes schemas --------------------------------------------------------


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_render_is_deterministic(value_set):
    # Except the generated xDS certificate and workload CA: new on every render without a
    # cluster (`helm install`/`upgrade` find the existing Secrets with lookup and keep them;
    # GitOps renderers must set server.xds.tls.secretName and ca.secretExists, as the
    # chart's README says).
    # Likewise the generated gateway credential key.
    generated = [
        "shoal/templates/server/xds-tls-secret.yaml",
        "shoal/templates/server/ca-secret.yaml",
        "shoal/templates/credential-key-secret.yaml",
    ]
    with helm.Chart.load(CHART) as c:
        first = c.render(VALUE_SETS[value_set](), name=RELEASE, namespace=NAMESPACE)
        second = c.render(VALUE_SETS[value_set](), name=RELEASE, namespace=NAMESPACE)
    data = lambda text: re.sub(r"(?m)^(  [a-z.-]+: )\S+$", r"\1<generated>", text)
    for path in generated:
        if path in first:
            assert data(first.pop(path)) == data(second.pop(path))
    assert first == second


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_objects_validate_against_kubernetes_schemas(value_set):
    objects = render(value_set)
    assert objects
    checked = 0
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: test_service_monitor
        try:
            kubernetes_validate.validate(strip(obj), KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} ({obj['__template__']}): {path}: {e.message}")
        checked += 1
    print(f"{checked} objects valid against Kubernetes {KUBE_VERSION} (strict)")


# kubernetes-validate ships only the built-in kinds. The ServiceMonitor is checked against the
# fields of monitoring.coreos.com/v1 ServiceMonitor the chart uses (from the prometheus-operator
# CRD), strict, with metadata and the selector against the real Kubernetes definitions.
PROM_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
SERVICE_MONITOR_SCHEMA = {
    "$id": "https://kubernetes.io/api/servicemonitor-monitoring-v1.json",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"$ref": "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector"],
            "properties": {
                "selector": {"$ref": "/api/_definitions.json#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector"},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": PROM_DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": PROM_DURATION},
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("value_set", ["everything-on", "design"])
def test_service_monitor(value_set):
    import jsonschema
    from referencing import Registry, Resource

    print(
        "ServiceMonitor: kubernetes-validate has no CRD schemas; checked against the "
        "prometheus-operator fields the chart uses plus Kubernetes' ObjectMeta/LabelSelector"
    )
    objects = render(value_set)
    sm = one(objects, "ServiceMonitor")
    defs_dir = f"v{KUBE_VERSION}-local-strict"
    defs = kubernetes_validate.utils.schema_contents(
        f"kubernetes-json-schema/{defs_dir}/_definitions.json", KUBE_VERSION
    )
    registry = Resource.from_contents(defs) @ Registry()
    jsonschema.Draft202012Validator(SERVICE_MONITOR_SCHEMA, registry=registry).validate(strip(sm))

    # It selects the shoal Services, on a port they have.
    selector = sm["spec"]["selector"]["matchLabels"]
    selected = [
        s for s in of_kind(objects, "Service")
        if all(s["metadata"]["labels"].get(k) == v for k, v in selector.items())
    ]
    assert any(component(s) == "server" for s in selected)
    for s in selected:
        names = {p["name"] for p in s["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            assert ep["port"] in names, f"Service {s['metadata']['name']} has no port {ep['port']}"
            assert ep["path"] == "/metrics"
    assert sm["metadata"]["labels"].get("release") == (
        "prometheus" if value_set == "everything-on" else None
    )


def test_service_monitor_off_by_default():
    assert not of_kind(render("default"), "ServiceMonitor")


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_labels_and_namespaces(value_set):
    system_ns = merged(value_set)["global"]["systemNamespace"]
    for obj in render(value_set):
        meta = obj["metadata"]
        labels = meta.get("labels", {})
        for key in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/part-of",
            "helm.sh/chart",
        ]:
            assert key in labels, f"{obj['kind']}/{meta['name']} lacks label {key}"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta
        elif obj["kind"] in ("Role", "RoleBinding"):
            assert meta["namespace"] == system_ns
        else:
            assert meta["namespace"] == NAMESPACE, f"{obj['kind']}/{meta['name']} in {meta.get('namespace')}"


# --- server --------------------------------------------------------------------------------


def test_server_service_named_shoal_with_istio_port_names():
    objects = render("default")
    svc = one(objects, "Service", "shoal")
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    # TLS xDS only by default (istiod's 15012, which istiod names https-dns): the plaintext
    # port authenticates nothing.
    assert ports["https-dns"]["port"] == 15012
    assert "grpc-xds" not in ports
    assert ports["http-monitoring"]["port"] == 15014
    (server,) = deployments(objects, "server")
    pod_labels = server["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items())
    (c,) = pod_spec(server)["containers"]
    assert container_port(c, ports["https-dns"]["targetPort"]) == 15012
    assert container_port(c, ports["http-monitoring"]["targetPort"]) == 15014
    assert arg_value(c, "--xds-tls-addr") == "0.0.0.0:15012"
    assert arg_value(c, "--xds-addr") is None
    assert arg_value(c, "--token-audiences") == "istio-ca"
    assert "--debug-from-anywhere" not in c["args"]


def test_server_tls_certificate_is_issued_from_the_workload_ca_by_default(chart):
    objects = render("default")
    # No second CA: the servers issue the certificate from the workload CA, and proxies
    # verify it with istio-ca-root-cert.
    assert not [o for o in of_kind(objects, "Secret") if o["metadata"]["name"].endswith("xds-tls")]
    (server,) = deployments(objects, "server")
    (c,) = pod_spec(server)["containers"]
    assert arg_value(c, "--ca-dir") == "/etc/cacerts"
    assert arg_value(c, "--xds-tls-cert") is None and arg_value(c, "--xds-tls-key") is None
    assert arg_value(c, "--xds-dns-names") == ",".join([
        "shoal", f"shoal.{NAMESPACE}", f"shoal.{NAMESPACE}.svc", f"shoal.{NAMESPACE}.svc.cluster.local",
    ])
    assert "xds-tls" not in {v["name"] for v in pod_spec(server)["volumes"]}
    assert "xds-tls" not in {m["name"] for m in c["volumeMounts"]}

    # Extra names (e.g. Istio's default discoveryAddress) come after the Service's, once.
    extra = render_values(chart, {"server": {
        "service": {"name": "istiod"},
        "xds": {"tls": {"extraDnsNames": ["istiod.istio-system.svc", f"istiod.{NAMESPACE}.svc"]}},
    }})
    (server,) = deployments(extra, "server")
    (c,) = pod_spec(server)["containers"]
    assert arg_value(c, "--xds-dns-names") == ",".join([
        "istiod", f"istiod.{NAMESPACE}", f"istiod.{NAMESPACE}.svc",
        f"istiod.{NAMESPACE}.svc.cluster.local", "istiod.istio-system.svc",
    ])


def test_server_tls_certificate_is_generated_and_mounted_without_the_workload_ca(chart):
    import base64

    objects = render_values(chart, {"ca": {"enabled": False}})
    (server,) = deployments(objects, "server")
    (c,) = pod_spec(server)["containers"]
    assert arg_value(c, "--xds-dns-names") is None
    secret = one(objects, "Secret", "shoal-server-xds-tls")
    assert secret["type"] == "kubernetes.io/tls"
    pems = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert pems["tls.crt"].startswith("-----BEGIN CERTIFICATE-----")
    assert pems["ca.crt"].startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY" in pems["tls.key"]
    # The certificate names the Service proxies dial.
    with tempfile.NamedTemporaryFile("w", suffix=".crt") as f:
        f.write(pems["tls.crt"])
        f.flush()
        text = subprocess.run(
            ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", f.name],
            capture_output=True, text=True, check=True,
        ).stdout
    assert f"DNS:shoal.{NAMESPACE}.svc" in text, text
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["xds-tls"]["mountPath"] == "/etc/shoal/xds-tls"
    assert "subPath" not in mounts["xds-tls"], "a subPath mount never sees a renewed certificate"
    assert arg_value(c, "--xds-tls-cert") == "/etc/shoal/xds-tls/tls.crt"
    assert arg_value(c, "--xds-tls-key") == "/etc/shoal/xds-tls/tls.key"
    volumes = {v["name"]: v for v in pod_spec(server)["volumes"]}
    assert volumes["xds-tls"]["secret"]["secretName"] == "shoal-server-xds-tls"

    given = render_values(chart, {"server": {"xds": {
        "tls": {"secretName": "xds-cert"},
        "clientCA": {"secretName": "mesh-root", "key": "root-cert.pem"},
        "plaintext": True,
        "tokenAudiences": ["istio-ca", "shoal"],
    }, "debugFromAnywhere": True}})
    assert not [o for o in of_kind(given, "Secret") if o["metadata"]["name"].endswith("xds-tls")]
    (server,) = deployments(given, "server")
    (c,) = pod_spec(server)["containers"]
    volumes = {v["name"]: v for v in pod_spec(server)["volumes"]}
    # A given Secret wins over the workload CA (still on by default, for proxies' certificates).
    assert volumes["xds-tls"]["secret"]["secretName"] == "xds-cert"
    assert arg_value(c, "--xds-tls-cert") == "/etc/shoal/xds-tls/tls.crt"
    assert arg_value(c, "--ca-dir") == "/etc/cacerts"
    assert arg_value(c, "--xds-dns-names") is None
    assert volumes["xds-client-ca"]["secret"]["secretName"] == "mesh-root"
    assert arg_value(c, "--xds-client-ca") == "/etc/shoal/xds-client-ca/root-cert.pem"
    assert arg_value(c, "--xds-addr") == "0.0.0.0:15010"
    assert arg_value(c, "--token-audiences") == "istio-ca,shoal"
    assert "--debug-from-anywhere" in c["args"]
    svc = one(given, "Service", "shoal")
    assert {p["name"] for p in svc["spec"]["ports"]} == {"https-dns", "grpc-xds", "http-monitoring"}


def pem_of(secret, key: str) -> str:
    import base64

    return base64.b64decode(secret["data"][key]).decode()


def openssl_x509(pem: str, *args: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(pem)
        f.flush()
        return subprocess.run(
            ["openssl", "x509", "-noout", *args, "-in", f.name],
            capture_output=True, text=True, check=True,
        ).stdout


def ca_mounts(objects):
    """The server's CA volume and --ca-dir, and each ingester's root volume and flag."""
    (server,) = deployments(objects, "server")
    (c,) = pod_spec(server)["containers"]
    volumes = {v["name"]: v for v in pod_spec(server)["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    server_side = (volumes.get("cacerts"), mounts.get("cacerts"), arg_value(c, "--ca-dir"))
    ingester_side = []
    for d in deployments(objects, "ingester"):
        (ic,) = pod_spec(d)["containers"]
        ivolumes = {v["name"]: v for v in pod_spec(d)["volumes"]}
        imounts = {m["name"]: m for m in ic["volumeMounts"]}
        ingester_side.append((ivolumes.get("ca-root"), imounts.get("ca-root"), arg_value(ic, "--ca-root-cert")))
    return server_side, ingester_side


def test_workload_ca_generated_by_default():
    objects = render("default")
    secret = one(objects, "Secret", "shoal-ca")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # Istio's cacerts layout, the root signing itself: ca-cert.pem = root-cert.pem.
    assert set(secret["data"]) == {"ca-cert.pem", "ca-key.pem", "root-cert.pem"}
    assert pem_of(secret, "ca-cert.pem") == pem_of(secret, "root-cert.pem")
    assert "PRIVATE KEY" in pem_of(secret, "ca-key.pem")
    root = pem_of(secret, "root-cert.pem")
    text = openssl_x509(root, "-text")
    assert "CA:TRUE" in text, text
    assert "Public-Key: (2048 bit)" in text, text
    # Ten years, like istiod's self-signed root.
    dates = openssl_x509(root, "-startdate", "-enddate")
    start, end = [time.strptime(line.split("=", 1)[1], "%b %d %H:%M:%S %Y %Z") for line in dates.splitlines()]
    days = (time.mktime(end) - time.mktime(start)) / 86400
    assert 3649 <= days <= 3651, dates

    (volume, mount, ca_dir), ingesters = ca_mounts(objects)
    assert volume["secret"] == {"secretName": "shoal-ca"}
    assert "subPath" not in mount, "a subPath mount never sees a rotated CA"
    assert mount["readOnly"] is True
    assert ca_dir == mount["mountPath"] == "/etc/cacerts"
    assert ingesters
    for volume, mount, flag in ingesters:
        # The ingester gets the root's public certificate only, never the key.
        assert volume["secret"] == {
            "secretName": "shoal-ca",
            "items": [{"key": "root-cert.pem", "path": "root-cert.pem"}],
        }
        assert "subPath" not in mount and mount["readOnly"] is True
        assert flag == mount["mountPath"] + "/root-cert.pem"


def test_workload_ca_plugged_in_secret_is_mounted_whole(chart):
    # ca.secretExists stands for what lookup finds at install/upgrade (offline renders see
    # no cluster): the plugged-in Secret is mounted, nothing is generated.
    objects = render_values(chart, {"ca": {"secretName": "my-cacerts", "secretExists": True}})
    assert not [o for o in of_kind(objects, "Secret") if o["metadata"]["name"] == "shoal-ca"]
    (volume, mount, ca_dir), ingesters = ca_mounts(objects)
    assert volume["secret"] == {"secretName": "my-cacerts"}
    assert "subPath" not in mount and ca_dir == "/etc/cacerts"
    for volume, _, flag in ingesters:
        assert volume["secret"]["secretName"] == "my-cacerts"
        assert volume["secret"]["items"] == [{"key": "root-cert.pem", "path": "root-cert.pem"}]
        assert flag == "/etc/shoal/ca-root/root-cert.pem"


@pytest.fixture
def kube_api():
    """A Kubernetes API test server (the shoal-kubeapi binary): (kubeconfig, create), where
    create(path, object) POSTs an object to it, as kubectl create would."""
    proc = subprocess.Popen([str(BIN_DIR / "shoal-kubeapi")], stdout=subprocess.PIPE, text=True)
    try:
        lines = []
        while (line := proc.stdout.readline()).strip():
            lines.append(line)
        kubeconfig = "".join(lines)
        server = yaml.safe_load(kubeconfig)["clusters"][0]["cluster"]["server"]

        def create(path: str, obj: dict[str, Any]) -> dict[str, Any]:
            req = urllib.request.Request(
                server + path,
                data=json.dumps(obj).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.load(r)

        yield kubeconfig, create
    finally:
        proc.kill()
        proc.wait()


def test_workload_ca_follows_the_cluster_through_lookup(chart, kube_api):
    # A cluster-aware render (what `helm install`/`upgrade` do): lookup meets a real API.
    kubeconfig, create = kube_api
    create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})

    def install_render():
        with helm.Config(kubeconfig_content=kubeconfig, namespace=NAMESPACE) as cfg:
            return objects_of(sorted(cfg.render(chart, None, name=RELEASE, namespace=NAMESPACE).items()))

    # No cacerts: a root is generated...
    first = one(install_render(), "Secret", "shoal-ca")
    create(f"/api/v1/namespaces/{NAMESPACE}/secrets", strip(first))
    # ...and kept by the next upgrade.
    upgraded = install_render()
    assert one(upgraded, "Secret", "shoal-ca")["data"] == first["data"]
    (volume, _, _), _ = ca_mounts(upgraded)
    assert volume["secret"]["secretName"] == "shoal-ca"

    # A plugged-in CA appears (Istio's cacerts): the next upgrade mounts it, generates nothing.
    create(f"/api/v1/namespaces/{NAMESPACE}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cacerts"},
        "data": {k: first["data"][k] for k in ("ca-cert.pem", "ca-key.pem", "root-cert.pem")},
    })
    plugged = install_render()
    assert not [o for o in of_kind(plugged, "Secret") if o["metadata"]["name"] == "shoal-ca"]
    (volume, _, _), ingesters = ca_mounts(plugged)
    assert volume["secret"]["secretName"] == "cacerts"
    assert all(v["secret"]["secretName"] == "cacerts" for v, _, _ in ingesters)


def test_workload_ca_disabled(chart):
    objects = render_values(chart, {"ca": {"enabled": False}})
    assert not [o for o in of_kind(objects, "Secret") if o["metadata"]["name"] == "shoal-ca"]
    (volume, mount, ca_dir), ingesters = ca_mounts(objects)
    assert (volume, mount, ca_dir) == (None, None, None)
    assert all(side == (None, None, None) for side in ingesters)
    for role in of_kind(objects, "ClusterRole"):
        assert not [r for r in role["rules"] if "configmaps" in r["resources"]], role


def test_ingester_may_read_the_service_account_issuer():
    objects = render("default")
    bindings = [
        b for b in of_kind(objects, "ClusterRoleBinding")
        if b["roleRef"]["name"] == "system:service-account-issuer-discovery"
    ]
    assert len(bindings) == 1
    (subject,) = bindings[0]["subjects"]
    assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE


def test_server_scaling_objects():
    objects = render("default")
    (server,) = deployments(objects, "server")
    # The HPA owns the replica count: the Deployment must not reset it on every upgrade.
    assert "replicas" not in server["spec"]
    hpa = one(objects, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": server["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] >= 2
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu" and metric["resource"]["target"]["type"] == "Utilization"

    pdbs = [p for p in of_kind(objects, "PodDisruptionBudget") if component(p) == "server"]
    (pdb,) = pdbs
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["minAvailable"] == 1
    pod_labels = server["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())

    spread = pod_spec(server)["topologySpreadConstraints"]
    assert [t["topologyKey"] for t in spread] == ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]
    for t in spread:
        assert t["whenUnsatisfiable"] == "ScheduleAnyway"
        assert all(pod_labels.get(k) == v for k, v in t["labelSelector"]["matchLabels"].items())

    # Without the HPA, replicaCount counts; maxUnavailable replaces minAvailable.
    objects = render("everything-on")
    (server,) = deployments(objects, "server")
    assert server["spec"]["replicas"] == 3
    assert not of_kind(objects, "HorizontalPodAutoscaler")
    (pdb,) = [p for p in of_kind(objects, "PodDisruptionBudget") if component(p) == "server"]
    assert pdb["spec"] == {**pdb["spec"], "maxUnavailable": 1} and "minAvailable" not in pdb["spec"]


def duration_seconds(text: str) -> float:
    m = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", text)
    assert m, text
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


@pytest.mark.parametrize("value_set", DEPLOYABLE)
def test_server_termination_leaves_time_to_drain(value_set):
    for server in deployments(render(value_set), "server"):
        spec = pod_spec(server)
        (c,) = spec["containers"]
        pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        drain = duration_seconds(arg_value(c, "--drain-duration") or "0s")
        assert spec["terminationGracePeriodSeconds"] > pre_stop + drain, (
            "terminationGracePeriodSeconds must exceed preStop sleep + --drain-duration"
        )


@pytest.mark.parametrize("value_set", DEPLOYABLE)
def test_servers_wait_for_every_fleet_of_the_release(value_set):
    """A fresh install serves no empty mesh: the servers expect exactly the fleets the
    release's ingesters publish as (--expect-fleets), bounded by --sync-timeout."""
    objects = render(value_set)
    fleets = sorted(
        arg_value(c, "--fleet")
        for d in deployments(objects, "ingester")
        for c in pod_spec(d)["containers"]
    )
    assert fleets, "every value set runs at least one fleet"
    for server in deployments(objects, "server"):
        (c,) = pod_spec(server)["containers"]
        expected = arg_value(c, "--expect-fleets")
        assert expected is not None, "--expect-fleets is set"
        assert sorted(expected.split(",")) == fleets
        assert duration_seconds(arg_value(c, "--sync-timeout") or "") > 0


def server_mesh_config(objects) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The server's --mesh-config file as the pod sees it: (volumeMount, ConfigMap, text)."""
    (server,) = deployments(objects, "server")
    (c,) = pod_spec(server)["containers"]
    path = arg_value(c, "--mesh-config")
    assert path, "the server gets no --mesh-config"
    return mounted_config_map_file(objects, server, c, path)


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_server_mesh_config_is_a_mounted_config_map(value_set):
    """--mesh-config names a file of the server's own ConfigMap, mounted read-only and whole
    (a subPath mount never sees updates), carrying server.meshConfig with the root namespace
    defaulted to global.systemNamespace. The server polls the file, so no checksum annotation
    restarts the pods when it changes."""
    objects = render(value_set)
    values = merged(value_set)
    mount, cm, text = server_mesh_config(objects)
    assert mount["readOnly"] is True
    assert "subPath" not in mount and "subPathExpr" not in mount
    assert component(cm) == "server"
    mesh = values["server"]["meshConfig"]
    assert yaml.safe_load(text) == {
        "outboundTrafficPolicy": {"mode": mesh["outboundTrafficPolicy"]["mode"]},
        "rootNamespace": mesh["rootNamespace"] or values["global"]["systemNamespace"],
    }
    (server,) = deployments(objects, "server")
    annotations = server["spec"]["template"]["metadata"].get("annotations", {})
    assert not [k for k in annotations if "checksum" in k], annotations


@pytest.mark.parametrize(
    "values, expected",
    [
        (
            {"server": {"meshConfig": {"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}}},
            {"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}, "rootNamespace": "istio-system"},
        ),
        (
            {"global": {"systemNamespace": "mesh-system"}},
            {"outboundTrafficPolicy": {"mode": "ALLOW_ANY"}, "rootNamespace": "mesh-system"},
        ),
        (
            {"global": {"systemNamespace": "mesh-system"}, "server": {"meshConfig": {"rootNamespace": "mesh-root"}}},
            {"outboundTrafficPolicy": {"mode": "ALLOW_ANY"}, "rootNamespace": "mesh-root"},
        ),
        # A namespace YAML would read as a boolean stays a string.
        (
            {"server": {"meshConfig": {"rootNamespace": "true"}}},
            {"outboundTrafficPolicy": {"mode": "ALLOW_ANY"}, "rootNamespace": "true"},
        ),
    ],
)
def test_server_mesh_config_values(chart, values, expected):
    _, _, text = server_mesh_config(render_values(chart, values))
    assert yaml.safe_load(text) == expected


# --- security ------------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_security_context(value_set):
    for d, c in containers(render(value_set)):
        pod = pod_spec(d).get("securityContext", {})
        sc = c.get("securityContext", {})

        def setting(key):
            return sc.get(key, pod.get(key))

        where = f"{d['metadata']['name']}/{c['name']}"
        assert setting("runAsNonRoot") is True, where
        assert setting("runAsUser") == 65532, where
        assert sc.get("readOnlyRootFilesystem") is True, where
        assert sc.get("allowPrivilegeEscalation") is False, where
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], where
        assert not sc.get("capabilities", {}).get("add"), where
        assert setting("seccompProfile") == {"type": "RuntimeDefault"}, where
        assert not sc.get("privileged"), where


# --- RBAC ----------------------------------------------------------------------------------


def service_account_of(objects, comp) -> str:
    names = {pod_spec(d)["serviceAccountName"] for d in deployments(objects, comp)}
    assert len(names) == 1, names
    return names.pop()


def local_cluster(container) -> bool:
    value = arg_value(container, "--local-cluster")
    assert value in ("true", "false"), f"{container['name']}: --local-cluster={value}"
    return value == "true"


def ingester_service_accounts(objects) -> tuple[set[str], set[str]]:
    """The ServiceAccounts of the fleets with the local cluster, and of the others."""
    local, remote = set(), set()
    for d in deployments(objects, "ingester"):
        (c,) = pod_spec(d)["containers"]
        (local if local_cluster(c) else remote).add(pod_spec(d)["serviceAccountName"])
    return local, remote


def binds(binding, sa_name) -> bool:
    return any(
        s["kind"] == "ServiceAccount" and s["name"] == sa_name and s.get("namespace") == NAMESPACE
        for s in binding.get("subjects", [])
    )


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_rbac_least_privilege(value_set):
    objects = render(value_set)
    system_ns = merged(value_set)["global"]["systemNamespace"]

    # One ServiceAccount for the server, one for the fleet with the local cluster, one for
    # fleets that serve only remote clusters.
    server_sa = service_account_of(objects, "server")
    local_sas, remote_sas = ingester_service_accounts(objects)
    assert len(local_sas) <= 1 and len(remote_sas) <= 1, (local_sas, remote_sas)
    assert not local_sas & remote_sas
    ingester_sas = local_sas | remote_sas
    assert server_sa not in ingester_sas
    sas = {s["metadata"]["name"]: s for s in of_kind(objects, "ServiceAccount")}
    assert set(sas) == {server_sa} | ingester_sas

    # No ClusterRole mentions Secrets (unless gateways.credentials.enabled: then the
    # ingester's reads them) or wildcards; all are read-only but for the status
    # subresources of the Istio kinds.
    credentials = merged(value_set)["gateways"]["credentials"]["enabled"]
    deploy = merged(value_set)["gateways"]["deployment"]["enabled"]
    for role in of_kind(objects, "ClusterRole"):
        for rule in role["rules"]:
            if rule in DEPLOY_RULES:
                assert deploy, f"ClusterRole {role['metadata']['name']} grants gateway deployment"
                continue
            if "secrets" in rule.get("resources", []):
                assert credentials, f"ClusterRole {role['metadata']['name']} grants secrets"
                assert rule == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}, rule
            assert "*" not in rule.get("resources", []) + rule.get("apiGroups", []) + rule["verbs"]
            if rule["resources"] == ["configmaps"]:
                assert rule["apiGroups"] == [""] and set(rule["verbs"]) == CONFIG_MAP_VERBS, rule
            elif set(rule["verbs"]) - READ_VERBS:
                assert set(rule["verbs"]) == STATUS_VERBS, rule
                assert rule["apiGroups"] in (["networking.istio.io"], ["security.istio.io"], ["gateway.networking.k8s.io"]), rule
                assert all(r.endswith("/status") for r in rule["resources"]), rule
            assert not rule.get("nonResourceURLs")

    # The ClusterRole of the fleet with the local cluster: exactly the kinds it watches,
    # get/list/watch. A fleet without the local cluster has no ClusterRole at all.
    # Besides it, only Kubernetes' own read-only issuer discovery role (its token keys, for
    # the servers' offline verification of proxy tokens).
    for ingester_sa in local_sas:
        bound = [b for b in of_kind(objects, "ClusterRoleBinding") if binds(b, ingester_sa)]
        discovery = [b for b in bound if b["roleRef"]["name"] == "system:service-account-issuer-discovery"]
        assert len(discovery) == 1, bound
        (crb,) = [b for b in bound if b not in discovery]
        cluster_role = one(objects, "ClusterRole", crb["roleRef"]["name"])
        granted: dict[str, set[str]] = {}
        status_granted: dict[str, set[str]] = {}
        config_maps = [r for r in cluster_role["rules"] if r["resources"] == ["configmaps"]]
        assert len(config_maps) == int(merged(value_set)["ca"]["enabled"]), config_maps
        deploy_rules = [r for r in cluster_role["rules"] if r in DEPLOY_RULES]
        assert deploy_rules == (DEPLOY_RULES if deploy else []), deploy_rules
        for rule in cluster_role["rules"]:
            if rule in config_maps or rule in DEPLOY_RULES:
                continue
            assert set(rule["verbs"]) in (READ_VERBS, STATUS_VERBS), rule
            into = granted if set(rule["verbs"]) == READ_VERBS else status_granted
            for group in rule["apiGroups"]:
                into.setdefault(group, set()).update(rule["resources"])
        expected = {g: set(r) for g, r in INGESTER_CLUSTER_RULES.items()}
        if credentials:
            expected[""] = expected[""] | {"secrets"}
        assert granted == expected
        # Exactly the status subresources of the Istio kinds and of the Gateway API kinds
        # (ReferenceGrant has none): update/patch, nothing else.
        assert status_granted == INGESTER_STATUS_RULES
        assert len(INGESTER_STATUS_RULES["networking.istio.io"]) == 6
    for ingester_sa in remote_sas:
        for b in of_kind(objects, "ClusterRoleBinding"):
            assert not binds(b, ingester_sa), f"remote-only fleets are bound to {b['metadata']['name']}"
    if not local_sas:
        assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ClusterRoleBinding")

    # Secrets: a Role in the system namespace, read-only, bound to the ingester.
    secret_roles = [
        r for r in of_kind(objects, "Role") if any("secrets" in rule["resources"] for rule in r["rules"])
    ]
    (role,) = secret_roles
    assert role["metadata"]["namespace"] == system_ns
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}]
    (rb,) = [b for b in of_kind(objects, "RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert rb["metadata"]["namespace"] == system_ns
    assert rb["roleRef"]["kind"] == "Role"
    for ingester_sa in ingester_sas:
        assert binds(rb, ingester_sa)
    for b in of_kind(objects, "RoleBinding"):
        assert b is rb or not any(binds(b, sa) for sa in remote_sas)

    # The server: no token, bound to nothing.
    assert sas[server_sa].get("automountServiceAccountToken") is False
    for d in deployments(objects, "server"):
        assert pod_spec(d).get("automountServiceAccountToken") is False
    for b in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding"):
        assert not binds(b, server_sa), f"{b['kind']} {b['metadata']['name']} binds the server"


def test_gateway_credentials_key_and_rbac(chart):
    """gateways.credentials: off, no Secret is read outside the system namespace and no key
    exists; on, a generated 32-byte key (or the given Secret) is mounted into every ingester
    and server, and the local fleet's ClusterRole reads Secrets."""
    import base64

    def key_env(objects):
        return {
            (d["metadata"]["name"], c["name"]): env_of(c).get("SHOAL_CREDENTIAL_KEY_FILE")
            for d, c in containers(objects)
        }

    off = render("default")
    assert not [o for o in of_kind(off, "Secret") if "credential" in o["metadata"]["name"]]
    assert set(key_env(off).values()) == {None}

    on = render_values(chart, {"gateways": {"credentials": {"enabled": True}}})
    secret = one(on, "Secret", f"{RELEASE}-credential-key")
    key = base64.b64decode(secret["data"]["credential.key"]).decode()
    assert len(base64.b64decode(key.strip())) == 32
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert set(key_env(on).values()) == {"/etc/shoal/credential-key/credential.key"}
    for d, c in containers(on):
        volumes = {v["name"]: v for v in pod_spec(d)["volumes"]}
        assert volumes["credential-key"]["secret"]["secretName"] == f"{RELEASE}-credential-key"
        assert {m["name"] for m in c["volumeMounts"]} >= {"credential-key"}
    rules = [r for role in of_kind(on, "ClusterRole") for r in role["rules"]]
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]} in rules

    given = render_values(chart, {"gateways": {"credentials": {"enabled": True, "existingSecret": "my-key"}}})
    assert not [o for o in of_kind(given, "Secret") if "credential" in o["metadata"]["name"]]
    for d, _ in containers(given):
        volumes = {v["name"]: v for v in pod_spec(d)["volumes"]}
        assert volumes["credential-key"]["secret"]["secretName"] == "my-key"


def test_gateway_deployment_flag_and_rbac(chart):
    """gateways.deployment: off, no ingester gets --gateway-deployment and no ClusterRole
    writes deployments, services or serviceaccounts; on, the fleet with watchConfig gets the
    flag (and the proxy image) and its ClusterRole exactly the deployment rules."""
    off = render("default")
    assert all(arg_value(c, "--gateway-deployment") is None for _, c in containers(off))
    rules = [r for role in of_kind(off, "ClusterRole") for r in role["rules"]]
    assert not [r for r in rules if r in DEPLOY_RULES]

    on = render_values(
        chart,
        {"gateways": {"deployment": {"enabled": True, "proxyImage": "example.com/proxy:1"}}},
    )
    ingesters = [c for d, c in containers(on) if d in deployments(on, "ingester")]
    assert ingesters
    for c in ingesters:
        assert arg_value(c, "--gateway-deployment") == "true", c["args"]
        assert arg_value(c, "--gateway-proxy-image") == "example.com/proxy:1", c["args"]
    rules = [r for role in of_kind(on, "ClusterRole") for r in role["rules"]]
    assert [r for r in rules if r in DEPLOY_RULES] == DEPLOY_RULES


def test_secrets_role_follows_system_namespace(chart):
    out = chart.render({"global": {"systemNamespace": "mesh-system"}}, name=RELEASE, namespace=NAMESPACE)
    docs = [d for d in yaml.safe_load_all(out["shoal/templates/ingester/rbac.yaml"]) if d]
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] in ("Role", "RoleBinding")} == {"mesh-system"}


# --- ingester fleets -----------------------------------------------------------------------


def test_one_deployment_and_mesh_config_per_fleet():
    objects = render("design")
    vals = values_file("two-fleets-values.yaml")
    fleets = {f["name"]: f for f in vals["ingesters"]}
    ing = {d["metadata"]["labels"]["shoal-fleet"]: d for d in deployments(objects, "ingester")}
    assert set(ing) == set(fleets) == {"primary", "edge"}
    config_maps = {cm["metadata"]["name"]: cm for cm in of_kind(objects, "ConfigMap")}
    for name, d in ing.items():
        assert d["spec"]["replicas"] == fleets[name].get("replicas", 2) == 2
        (c,) = pod_spec(d)["containers"]
        assert arg_value(c, "--fleet") == name
        assert arg_value(c, "--cluster-id") == fleets[name].get("clusterId", "Kubernetes")
        # Explicit either way: the binary defaults to true.
        assert arg_value(c, "--watch-config") == str(fleets[name]["watchConfig"]).lower()
        assert arg_value(c, "--local-cluster") == str(fleets[name]["localCluster"]).lower()
        assert arg_value(c, "--unlabelled-secrets") == str(fleets[name].get("unlabelledSecrets", False)).lower()
        assert arg_value(c, "--handover-timeout") == "30s"
        # The mesh config file the flag names is the fleet's ConfigMap, mounted.
        _, cm, text = mounted_config_map_file(objects, d, c, arg_value(c, "--mesh-config"))
        assert cm["metadata"]["name"] in config_maps
        assert yaml.safe_load(text) == fleets[name]["meshConfig"]
        assert arg_value(c, "--system-namespace") == "istio-system"
        # Ingester pods watch the API: they need their token.
        assert pod_spec(d).get("automountServiceAccountToken", True) is True

    pdbs = [p for p in of_kind(objects, "PodDisruptionBudget") if component(p) == "ingester"]
    assert len(pdbs) == 2 and all(p["spec"]["maxUnavailable"] == 1 for p in pdbs)


def test_fleet_validation(chart):
    with pytest.raises(helm.HelmError, match="only one fleet may set watchConfig"):
        chart.render(
            {"ingesters": [{"name": "a", "watchConfig": True}, {"name": "b", "watchConfig": True}]},
            name=RELEASE,
            namespace=NAMESPACE,
        )
    with pytest.raises(helm.HelmError, match="listed twice"):
        chart.render({"ingesters": [{"name": "a"}, {"name": "a"}]}, name=RELEASE, namespace=NAMESPACE)
    # Two fleets, both with the local cluster (the default): it would be published twice.
    with pytest.raises(helm.HelmError, match="only one fleet may set localCluster"):
        chart.render({"ingesters": [{"name": "a"}, {"name": "b"}]}, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(helm.HelmError, match="sets watchConfig but not localCluster"):
        chart.render(
            {"ingesters": [{"name": "a", "watchConfig": True, "localCluster": False}]},
            name=RELEASE,
            namespace=NAMESPACE,
        )
    with pytest.raises(helm.HelmError, match="without a shoal.io/fleet label"):
        chart.render(
            {"ingesters": [{"name": "default"}, {"name": "b", "localCluster": False, "unlabelledSecrets": True}]},
            name=RELEASE,
            namespace=NAMESPACE,
        )


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_local_cluster_and_unlabelled_secrets_go_to_one_fleet(value_set):
    """The default values and every example give the local cluster to exactly one fleet (the
    one that reads the Istio config), and unlabelled Secrets to exactly one fleet."""
    containers_by_fleet = {}
    for d in deployments(render(value_set), "ingester"):
        (c,) = pod_spec(d)["containers"]
        containers_by_fleet[arg_value(c, "--fleet")] = c
    local = [f for f, c in containers_by_fleet.items() if local_cluster(c)]
    unlabelled = [f for f, c in containers_by_fleet.items() if arg_value(c, "--unlabelled-secrets") == "true"]
    # (an image without --watch-config reads the config: the binary's default)
    config = [f for f, c in containers_by_fleet.items() if arg_value(c, "--watch-config") in ("true", None)]
    assert len(local) == 1, local
    assert len(unlabelled) == 1, unlabelled
    assert config == local


def test_a_remote_only_fleet_reads_only_secrets_here(chart):
    """A fleet without the local cluster runs as its own ServiceAccount, bound only to the
    Secrets Role in the system namespace; the default fleet's account keeps its ClusterRole."""
    objects = render("two-fleets")
    edge = next(d for d in deployments(objects, "ingester") if d["metadata"]["labels"]["shoal-fleet"] == "edge")
    sa = pod_spec(edge)["serviceAccountName"]
    assert sa.endswith("-remote")
    bound = [b for b in of_kind(objects, "RoleBinding") + of_kind(objects, "ClusterRoleBinding") if binds(b, sa)]
    assert [(b["kind"], b["roleRef"]["kind"]) for b in bound] == [("RoleBinding", "Role")]
    role = one(objects, "Role", bound[0]["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}]
    # Only remote-only fleets: no ClusterRole is rendered at all.
    only_remote = render_values(
        chart, {"ingesters": [{"name": "edge", "localCluster": False, "watchConfig": False}]}
    )
    assert not of_kind(only_remote, "ClusterRole")
    (account,) = of_kind(only_remote, "ServiceAccount") and [
        s for s in of_kind(only_remote, "ServiceAccount") if component(s) == "ingester"
    ]
    assert account["metadata"]["name"].endswith("-remote")


# --- NATS ----------------------------------------------------------------------------------


def env_of(container) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


NATS_SECRET_MOUNTS = {
    "credentialsSecret": ("SHOAL_NATS_CREDS", "/etc/shoal/nats-creds", "name", "key"),
    "nkeySecret": ("SHOAL_NATS_NKEY", "/etc/shoal/nats-nkey", "name", "key"),
    "userPassword": ("SHOAL_NATS_PASSWORD_FILE", "/etc/shoal/nats-password", "secret", "passwordKey"),
    "tokenSecret": ("SHOAL_NATS_TOKEN_FILE", "/etc/shoal/nats-token", "name", "key"),
}


def assert_file_from_secret(d, c, env_name: str, secret: str, key: str):
    """env_name points at `key` of Secret `secret`, mounted read-only in this container."""
    env = env_of(c)
    path = Path(env[env_name])
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(d)["volumes"]}
    mount = mounts[str(path.parent)]
    assert mount["readOnly"] is True
    vol = volumes[mount["name"]]["secret"]
    assert vol["secretName"] == secret
    assert {"key": key, "path": path.name} in vol["items"]


def has_auth(v: dict[str, Any]) -> bool:
    return any(v[method][name_field] for method, (_, _, name_field, _) in NATS_SECRET_MOUNTS.items())


def nats_of(nats: dict[str, Any], comp: str) -> dict[str, Any]:
    """The NATS settings one component's pods get, by the chart's rule: the component's own
    authentication, when it sets a method, replaces the shared one whole; its tls.secret
    replaces nats.tls.secret with its own keys; tls.enabled and mountPath stay shared."""
    own = nats[comp]
    auth = own if has_auth(own) else nats
    out = {method: auth[method] for method in NATS_SECRET_MOUNTS}
    out["tls"] = dict(nats["tls"])
    if own["tls"]["secret"]:
        out["tls"].update({k: own["tls"][k] for k in ("secret", "caKey", "certKey", "keyKey")})
    return out


def nats_secret_refs(d, c) -> set[str]:
    """Every Secret a shoal container reads for NATS: its nats-* volumes and secretKeyRefs."""
    refs = {v["secret"]["secretName"] for v in pod_spec(d)["volumes"] if v["name"].startswith("nats-")}
    for e in c.get("env", []):
        if e["name"].startswith("SHOAL_NATS_") and "valueFrom" in e:
            refs.add(e["valueFrom"]["secretKeyRef"]["name"])
    return refs


@pytest.mark.parametrize("value_set", ["default", "nats-cluster", "nats-secure", "everything-on"])
def test_nats_settings(value_set):
    values = merged(value_set)["nats"]
    for d, c in containers(render(value_set)):
        nats = nats_of(values, component(d))
        env = env_of(c)
        assert env["SHOAL_NATS_URL"] == values["url"]
        assert env["SHOAL_NATS_REPLICAS"] == str(values["replicas"])
        for value, (env_name, _, name_field, key_field) in NATS_SECRET_MOUNTS.items():
            secret = nats[value][name_field]
            if secret:
                assert_file_from_secret(d, c, env_name, secret, nats[value][key_field])
            else:
                assert env_name not in env
        tls = nats["tls"]
        if tls["enabled"]:
            assert env["SHOAL_NATS_TLS_REQUIRED"] == "true"
            if tls["secret"]:
                assert_file_from_secret(d, c, "SHOAL_NATS_TLS_CA", tls["secret"], tls["caKey"])
                assert_file_from_secret(d, c, "SHOAL_NATS_TLS_CERT", tls["secret"], tls["certKey"])
                assert_file_from_secret(d, c, "SHOAL_NATS_TLS_KEY", tls["secret"], tls["keyKey"])
        else:
            assert not [e for e in env if e.startswith("SHOAL_NATS_TLS")]
        # No secret is ever a literal value in the Deployment.
        assert "SHOAL_NATS_PASSWORD" not in env and "SHOAL_NATS_TOKEN" not in env
    if value_set == "nats-cluster":
        assert values["replicas"] == 3 and len(values["url"].split(",")) == 3


def test_nats_secure_example_gives_each_component_its_own_user():
    """The example operators copy is the recommended split: the servers log in as their
    (read-only) user, every ingester as the writing one; neither pod can read the other's."""
    for d, c in containers(render("nats-secure")):
        own, other = ("nats-shoal-server", "nats-shoal-ingester")[:: 1 if component(d) == "server" else -1]
        assert nats_secret_refs(d, c) == {own, "nats-shoal-tls"}, d["metadata"]["name"]
        user = next(e for e in c["env"] if e["name"] == "SHOAL_NATS_USER")
        assert user["valueFrom"]["secretKeyRef"] == {"name": own, "key": "username"}
        assert other not in json.dumps(strip(d))


def split_nats(server_method: str, ingester_method: str) -> dict[str, Any]:
    """Per-component credentials of the given methods and per-component client certificates;
    nothing shared but TLS being on."""

    def auth(method, secret):
        _, _, name_field, key_field = NATS_SECRET_MOUNTS[method]
        return {method: {name_field: secret, key_field: f"{secret}.key"}}

    return {
        "tls": {"enabled": True},
        "server": {**auth(server_method, "srv-auth"), "tls": {"secret": "srv-tls", "caKey": "ca.pem"}},
        "ingester": {**auth(ingester_method, "ing-auth"), "tls": {"secret": "ing-tls", "certKey": "c.pem", "keyKey": "k.pem"}},
    }


@pytest.mark.parametrize(
    "server_method, ingester_method",
    [(m, m) for m in NATS_SECRET_MOUNTS] + [("userPassword", "nkeySecret"), ("credentialsSecret", "tokenSecret")],
)
def test_nats_per_component_credentials(chart, server_method, ingester_method):
    """With nats.server and nats.ingester, the server Deployment mounts and reads only the
    server's Secrets and every ingester fleet's Deployment only the ingester's."""
    objects = render_values(chart, two_fleets_with(split_nats(server_method, ingester_method)))
    expected = {
        "server": (server_method, "srv-auth", "srv-tls", ("ca.pem", "tls.crt", "tls.key")),
        "ingester": (ingester_method, "ing-auth", "ing-tls", ("ca.crt", "c.pem", "k.pem")),
    }
    seen = {"server": 0, "ingester": 0}
    for d, c in containers(objects):
        comp = component(d)
        seen[comp] += 1
        method, auth_secret, tls_secret, (ca, cert, key) = expected[comp]
        assert nats_secret_refs(d, c) == {auth_secret, tls_secret}, d["metadata"]["name"]
        env = env_of(c)
        for other, (env_name, _, _, _) in NATS_SECRET_MOUNTS.items():
            if other == method:
                assert_file_from_secret(d, c, env_name, auth_secret, f"{auth_secret}.key")
            else:
                assert env_name not in env
        if method == "userPassword":
            user = next(e for e in c["env"] if e["name"] == "SHOAL_NATS_USER")
            assert user["valueFrom"]["secretKeyRef"] == {"name": auth_secret, "key": "username"}
        else:
            assert "SHOAL_NATS_USER" not in env
        assert_file_from_secret(d, c, "SHOAL_NATS_TLS_CA", tls_secret, ca)
        assert_file_from_secret(d, c, "SHOAL_NATS_TLS_CERT", tls_secret, cert)
        assert_file_from_secret(d, c, "SHOAL_NATS_TLS_KEY", tls_secret, key)
        # The other component's Secrets appear nowhere in this Deployment.
        other_secrets = {s for k, v in expected.items() if k != comp for s in v[1:3]}
        text = json.dumps(strip(d))
        assert not [s for s in other_secrets if f'"{s}"' in text]
    assert seen == {"server": 1, "ingester": 2}


def test_nats_server_user_beside_shared_credentials(chart):
    """The way from shared credentials to the split: keep the shared user (now the
    ingesters') and add nats.server; the ingesters render as before, the servers switch."""
    shared = {
        "userPassword": {"secret": "nats-user"},
        "tls": {"enabled": True, "secret": "nats-tls"},
    }
    before = render_values(chart, two_fleets_with(shared))
    after = render_values(
        chart,
        two_fleets_with({**shared, "server": {"nkeySecret": {"name": "srv-nkey"}, "tls": {"secret": "srv-tls"}}}),
    )
    assert [strip(d) for d in deployments(after, "ingester")] == [strip(d) for d in deployments(before, "ingester")]
    for d, c in containers(after):
        if component(d) == "server":
            assert nats_secret_refs(d, c) == {"srv-nkey", "srv-tls"}
            assert_file_from_secret(d, c, "SHOAL_NATS_NKEY", "srv-nkey", "nkey.seed")
            assert not {"SHOAL_NATS_USER", "SHOAL_NATS_PASSWORD_FILE"} & set(env_of(c))
        else:
            assert nats_secret_refs(d, c) == {"nats-user", "nats-tls"}


def test_nats_shared_credentials_render_the_same_for_both_components(chart):
    """Existing installs: only the shared nats.* credentials, and the server and every
    ingester get exactly the same NATS environment and volumes as before the split."""
    for shared in (
        {"credentialsSecret": {"name": "nats-creds", "key": "u.creds"}, "tls": {"enabled": True, "secret": "nats-tls"}},
        {"userPassword": {"secret": "nats-user", "userKey": "u", "passwordKey": "p"}},
        {"nkeySecret": {"name": "nats-nkey"}, "tls": {"enabled": True, "secret": "nats-tls", "certKey": "", "keyKey": ""}},
        {"tokenSecret": {"name": "nats-token"}},
    ):
        nats_parts = set()
        for d, c in containers(render_values(chart, two_fleets_with(shared))):
            env = [e for e in c["env"] if e["name"].startswith("SHOAL_NATS_")]
            mounts = [m for m in c["volumeMounts"] if m["name"].startswith("nats-") or m["name"] == "tmp"]
            volumes = [v for v in pod_spec(d)["volumes"] if v["name"].startswith("nats-") or v["name"] == "tmp"]
            nats_parts.add(json.dumps([env, mounts, volumes], sort_keys=True))
        assert len(nats_parts) == 1, shared


def notes_of(chart, values: dict[str, Any]) -> str:
    return next(t for p, t in chart.render(values, name=RELEASE, namespace=NAMESPACE).items() if p.endswith("NOTES.txt"))


def test_notes_warn_while_servers_share_the_ingesters_nats_identity(chart):
    warning = "the servers and the ingesters connect to NATS with the same"
    assert warning in notes_of(chart, {"nats": {"userPassword": {"secret": "u"}}})
    assert warning in notes_of(chart, {"nats": {"tls": {"enabled": True, "secret": "t"}}})
    assert warning not in notes_of(chart, {})
    assert warning not in notes_of(chart, {"nats": {"userPassword": {"secret": "u"}, "server": {"tokenSecret": {"name": "t"}}}})
    assert warning not in notes_of(chart, values_file("nats-secure-values.yaml"))


def two_fleets_with(nats: dict[str, Any]) -> dict[str, Any]:
    vals = values_file("two-fleets-values.yaml")
    vals["nats"] = nats
    return vals


def test_nats_user_password_and_tls_on_every_deployment(chart):
    objects = render_values(
        chart,
        two_fleets_with(
            {
                "userPassword": {"secret": "nats-user", "userKey": "user", "passwordKey": "pw"},
                "tls": {"enabled": True, "secret": "nats-tls", "caKey": "ca.pem", "certKey": "c.pem", "keyKey": "k.pem"},
            }
        ),
    )
    seen = {"server": 0, "ingester": 0}
    for d, c in containers(objects):
        seen[component(d)] += 1
        user = next(e for e in c["env"] if e["name"] == "SHOAL_NATS_USER")
        assert user == {"name": "SHOAL_NATS_USER", "valueFrom": {"secretKeyRef": {"name": "nats-user", "key": "user"}}}
        assert_file_from_secret(d, c, "SHOAL_NATS_PASSWORD_FILE", "nats-user", "pw")
        env = env_of(c)
        assert env["SHOAL_NATS_TLS_CA"] == "/etc/shoal/nats-tls/ca.pem"
        assert env["SHOAL_NATS_TLS_CERT"] == "/etc/shoal/nats-tls/c.pem"
        assert env["SHOAL_NATS_TLS_KEY"] == "/etc/shoal/nats-tls/k.pem"
        assert_file_from_secret(d, c, "SHOAL_NATS_TLS_CA", "nats-tls", "ca.pem")
    assert seen == {"server": 1, "ingester": 2}


def test_nats_tls_ca_only_and_system_roots(chart):
    objects = render_values(chart, {"nats": {"tls": {"enabled": True, "secret": "nats-tls", "certKey": "", "keyKey": ""}}})
    for d, c in containers(objects):
        env = env_of(c)
        assert env["SHOAL_NATS_TLS_REQUIRED"] == "true"
        assert_file_from_secret(d, c, "SHOAL_NATS_TLS_CA", "nats-tls", "ca.crt")
        assert "SHOAL_NATS_TLS_CERT" not in env and "SHOAL_NATS_TLS_KEY" not in env
        tls_volume = next(v for v in pod_spec(d)["volumes"] if v["name"] == "nats-tls")
        assert tls_volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # No secret: TLS required, the server verified against the image's roots; nothing mounted.
    objects = render_values(chart, {"nats": {"tls": {"enabled": True}}})
    for d, c in containers(objects):
        env = env_of(c)
        assert env["SHOAL_NATS_TLS_REQUIRED"] == "true"
        assert not {"SHOAL_NATS_TLS_CA", "SHOAL_NATS_TLS_CERT", "SHOAL_NATS_TLS_KEY"} & set(env)
        assert "nats-tls" not in {v["name"] for v in pod_spec(d)["volumes"]}


def test_nats_token_and_nkey_are_mounted_files(chart):
    for value, env_name in [("tokenSecret", "SHOAL_NATS_TOKEN_FILE"), ("nkeySecret", "SHOAL_NATS_NKEY")]:
        objects = render_values(chart, {"nats": {value: {"name": "nats-auth", "key": "k"}}})
        for d, c in containers(objects):
            assert_file_from_secret(d, c, env_name, "nats-auth", "k")


@pytest.mark.parametrize(
    "nats, message",
    [
        (
            {"credentialsSecret": {"name": "a"}, "tokenSecret": {"name": "b"}},
            "one authentication method at most, got credentialsSecret, tokenSecret",
        ),
        (
            {"userPassword": {"secret": "a"}, "nkeySecret": {"name": "b"}},
            "one authentication method at most, got nkeySecret, userPassword",
        ),
        ({"tls": {"enabled": True, "secret": "t", "keyKey": ""}}, "certKey and keyKey go together"),
        ({"tls": {"enabled": False, "secret": "t"}}, "nats.tls.enabled is false"),
        ({"tls": {"enabled": True, "secret": "t", "caKey": "", "certKey": "", "keyKey": ""}}, "nothing in nats.tls.secret"),
        (
            {"server": {"credentialsSecret": {"name": "a"}, "tokenSecret": {"name": "b"}}},
            "nats.server: one authentication method at most, got credentialsSecret, tokenSecret",
        ),
        (
            {"userPassword": {"secret": "s"}, "ingester": {"userPassword": {"secret": "a"}, "nkeySecret": {"name": "b"}}},
            "nats.ingester: one authentication method at most, got nkeySecret, userPassword",
        ),
        (
            {"tokenSecret": {"name": "t"}, "server": {"nkeySecret": {"name": "a"}}, "ingester": {"nkeySecret": {"name": "b"}}},
            "no pod uses the shared one",
        ),
        (
            {"tls": {"enabled": True, "secret": "t"}, "server": {"tls": {"secret": "a"}}, "ingester": {"tls": {"secret": "b"}}},
            "nats.tls.secret: nats.server.tls.secret and nats.ingester.tls.secret both replace it",
        ),
        ({"server": {"tls": {"secret": "a"}}}, "nats.server.tls.secret is set but nats.tls.enabled is false"),
        ({"tls": {"enabled": True}, "ingester": {"tls": {"secret": "a", "keyKey": ""}}}, "nats.ingester.tls: certKey and keyKey go together"),
        (
            {"tls": {"enabled": True}, "server": {"tls": {"secret": "a", "caKey": "", "certKey": "", "keyKey": ""}}},
            "nothing in nats.server.tls.secret",
        ),
    ],
)
def test_nats_contradictions_fail_the_render(chart, nats, message):
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        chart.render({"nats": nats}, name=RELEASE, namespace=NAMESPACE)


# --- probes against the binaries ---------------------------------------------------------------


def probe_targets(d, c):
    """(readiness path, liveness path, probe port, port of --admin-addr)."""
    ready = c["readinessProbe"]["httpGet"]
    live = c["livenessProbe"]["httpGet"]
    assert ready["port"] == live["port"]
    admin = arg_value(c, "--admin-addr")
    assert admin, f"{d['metadata']['name']}: probes but no --admin-addr"
    return ready["path"], live["path"], container_port(c, ready["port"]), int(admin.rsplit(":", 1)[1])


@pytest.mark.parametrize("value_set", list(VALUE_SETS))
def test_probes_match_admin_routes(value_set):
    objects = render(value_set)
    values = merged(value_set)
    for d, c in containers(objects):
        if component(d) == "ingester" and not values["ingester"]["binarySupport"]["adminAddr"]:
            # No admin server to probe until the ingester binary has --admin-addr.
            assert "readinessProbe" not in c and "livenessProbe" not in c and "--admin-addr" not in " ".join(c["args"])
            continue
        ready, live, port, admin_port = probe_targets(d, c)
        assert (ready, live) == ("/ready", "/healthz")
        assert port == admin_port


@contextmanager
def process(args: list[str], log):
    """Runs a process for the duration of the block; stops it (SIGTERM, then SIGKILL) after."""
    proc = subprocess.Popen([str(a) for a in args], stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def nats_server():
    """A throwaway JetStream nats-server on a free port; yields its URL."""
    exe = shutil.which("nats-server") or next(
        (p for p in ["/usr/sbin/nats-server"] if os.path.exists(p)), None
    )
    if not exe:
        pytest.skip("nats-server is not installed (scripts/test.sh installs it)")
    port = free_port()
    with tempfile.TemporaryDirectory() as store, process(
        [exe, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store], subprocess.DEVNULL
    ) as proc:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("nats-server did not start")
                time.sleep(0.1)
        yield f"nats://127.0.0.1:{port}"


def server_has_standalone() -> bool:
    """Whether shoal-server was built with its default `standalone` feature."""
    try:
        result = subprocess.run(
            [str(BIN_DIR / "shoal-server"), "--standalone", "/nonexistent-shoal-dir",
             "--xds-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=10,
        )
    except subprocess.TimeoutExpired:
        return True  # it started serving: standalone mode exists
    return "no standalone mode" not in result.stdout + result.stderr


def print_log(log) -> None:
    log.seek(0)
    print(log.read().decode(errors="replace")[-4000:])


@contextmanager
def running_server(log, *args):
    """The real server on the example mesh with these extra arguments; yields (process, admin
    port).

    Standalone mode (`--standalone docs/examples/mesh`) when the binary has it; a server built
    without the `standalone` feature reads the same mesh through a real nats-server, written
    there by shoal-ingester's file source."""
    help_of("shoal-server")
    xds, admin = free_port(), free_port()
    with ExitStack() as stack:
        if server_has_standalone():
            state = ["--standalone", MESH_EXAMPLE]
        else:
            print("shoal-server has no standalone mode in this build: using nats-server + shoal-ingester")
            url = stack.enter_context(nats_server())
            stack.enter_context(
                process([BIN_DIR / "shoal-ingester", "--source", f"file:{MESH_EXAMPLE}", "--nats-url", url], log)
            )
            state = ["--nats-url", url]
        proc = stack.enter_context(
            process(
                [BIN_DIR / "shoal-server", *state,
                 "--xds-addr", f"127.0.0.1:{xds}", "--admin-addr", f"127.0.0.1:{admin}", *args],
                log,
            )
        )
        yield proc, admin


def write_atomically(path: Path, text: str) -> None:
    """Replaces the file in one rename, as the kubelet swaps a ConfigMap volume's contents."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_server_probe_paths_answer_on_a_running_server():
    """Starts the real server on the example mesh, with the admin port where the rendered
    --admin-addr puts it and the rendered mesh config file, and GETs the rendered probe paths:
    200 once ready."""
    objects = render("default")
    (server,) = deployments(objects, "server")
    (c,) = pod_spec(server)["containers"]
    ready_path, live_path, _, _ = probe_targets(server, c)
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as log:
        mesh = Path(tmp) / "mesh.yaml"
        mesh.write_text(server_mesh_config(objects)[2])
        with running_server(log, "--mesh-config", mesh) as (proc, admin):
            try:
                wait_for_200(f"http://127.0.0.1:{admin}{ready_path}", proc)
                assert http_get(f"http://127.0.0.1:{admin}{live_path}")[0] == 200
                status, metrics = http_get(f"http://127.0.0.1:{admin}/metrics")
                assert status == 200 and "shoal_ready 1" in metrics
            except AssertionError:
                print_log(log)
                raise


def test_server_serves_its_tls_port_with_a_certificate_from_the_generated_ca():
    """The real server with the rendered default arguments for the TLS port (--ca-dir, the
    chart-generated root, --xds-dns-names): a client trusting only that root (what
    istio-ca-root-cert holds) verifies the port under the Service's name."""
    objects = render("default")
    (server,) = deployments(objects, "server")
    (c,) = pod_spec(server)["containers"]
    names = arg_value(c, "--xds-dns-names")
    secret = one(objects, "Secret", "shoal-ca")
    tls = free_port()
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as log:
        cacerts = Path(tmp) / "cacerts"
        cacerts.mkdir()
        for key in secret["data"]:
            (cacerts / key).write_text(pem_of(secret, key))
        args = ["--ca-dir", cacerts, f"--xds-dns-names={names}", "--xds-tls-addr", f"127.0.0.1:{tls}"]
        with running_server(log, *args) as (proc, admin):
            try:
                wait_for_200(f"http://127.0.0.1:{admin}/ready", proc)
                host = f"shoal.{NAMESPACE}.svc"
                out = subprocess.run(
                    ["openssl", "s_client", "-connect", f"127.0.0.1:{tls}", "-servername", host,
                     "-verify_hostname", host, "-CAfile", cacerts / "root-cert.pem",
                     "-verify_return_error", "-alpn", "h2"],
                    input="", capture_output=True, encoding="utf-8", errors="replace", timeout=30,
                )
                assert "Verify return code: 0 (ok)" in out.stdout, out.stdout + out.stderr
            except AssertionError:
                print_log(log)
                raise


def mesh_settings_logged(log, message: str) -> list[str]:
    """The `settings` field of the server's JSON log lines with this message, in order."""
    log.seek(0)
    found = []
    for line in log.read().decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        fields = entry.get("fields", {}) if isinstance(entry, dict) else {}
        if fields.get("message") == message:
            found.append(fields.get("settings", ""))
    return found


def test_server_reads_and_polls_the_rendered_mesh_config(chart):
    """The real server loads a rendered server mesh config (REGISTRY_ONLY, a root namespace)
    at startup, and picks up the default render written over it without a restart: the reason
    the chart rolls no pods when the ConfigMap changes."""
    custom = {"server": {"meshConfig": {"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}, "rootNamespace": "mesh-root"}}}
    first = server_mesh_config(render_values(chart, custom))[2]
    second = server_mesh_config(render("default"))[2]
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile() as log:
        mesh = Path(tmp) / "mesh.yaml"
        mesh.write_text(first)
        with running_server(log, "--mesh-config", mesh, "--log-format", "json") as (proc, admin):
            try:
                wait_for_200(f"http://127.0.0.1:{admin}/ready", proc)
                (settings,) = mesh_settings_logged(log, "mesh settings")
                assert "RegistryOnly" in settings and 'root_namespace: "mesh-root"' in settings, settings
                write_atomically(mesh, second)
                deadline = time.monotonic() + 15  # the server polls every 2 s
                while not mesh_settings_logged(log, "mesh config changed"):
                    assert proc.poll() is None, "the server exited"
                    assert time.monotonic() < deadline, "the server did not pick up the new mesh config"
                    time.sleep(0.2)
                (changed,) = mesh_settings_logged(log, "mesh config changed")
                assert "AllowAny" in changed and 'root_namespace: "istio-system"' in changed, changed
                assert proc.poll() is None
            except AssertionError:
                print_log(log)
                raise


def test_ingester_probe_paths_answer_on_a_running_ingester():
    """Once shoal-ingester has --admin-addr: the same with the ingester, publishing the example
    mesh to a throwaway nats-server."""
    if "--admin-addr" not in help_of("shoal-ingester").flags:
        pytest.skip("shoal-ingester has no --admin-addr yet (ingester.binarySupport.adminAddr stays false)")
    d = deployments(render("design"), "ingester")[0]
    (c,) = pod_spec(d)["containers"]
    ready_path, live_path, _, _ = probe_targets(d, c)
    admin = free_port()
    with tempfile.TemporaryFile() as log, nats_server() as url, process(
        [BIN_DIR / "shoal-ingester", "--source", f"file:{MESH_EXAMPLE}", "--nats-url", url,
         "--admin-addr", f"127.0.0.1:{admin}"],
        log,
    ) as proc:
        try:
            wait_for_200(f"http://127.0.0.1:{admin}{live_path}", proc)
            wait_for_200(f"http://127.0.0.1:{admin}{ready_path}", proc)
        except AssertionError:
            print_log(log)
            raise


# --- flags and environment against the binaries ------------------------------------------------


def flags_in(args: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


@pytest.mark.parametrize("value_set", DEPLOYABLE)
def test_every_flag_and_env_is_accepted_by_the_binary(value_set):
    for d, c in containers(render(value_set)):
        binary = binary_of(c)
        h = help_of(binary)
        where = f"{d['metadata']['name']}/{c['name']} ({binary})"
        unknown = [f for f in flags_in(c.get("args", [])) if f not in h.flags]
        assert not unknown, f"{where}: {binary} does not accept {unknown}; it accepts {sorted(h.flags)}"
        shoal_env = [e["name"] for e in c.get("env", []) if e["name"].startswith("SHOAL_")]
        unknown_env = [e for e in shoal_env if e not in h.env]
        assert not unknown_env, f"{where}: {binary} reads no {unknown_env}; it reads {sorted(h.env)}"


@pytest.mark.parametrize("comp", ["server", "ingester"])
@pytest.mark.parametrize("value_set", DEPLOYABLE)
def test_rendered_arguments_parse(value_set, comp):
    """The values must parse too: clap checks each argument (and its value) before a trailing
    --help stops it, so `binary ARGS --help` exits 0 only if all of ARGS is accepted. SHOAL_*
    variables are passed as the flags they stand for, so their values are checked the same way."""
    pending = []
    checked = 0
    for d in deployments(render(value_set), comp):
        for c in pod_spec(d)["containers"]:
            binary = binary_of(c)
            h = help_of(binary)
            args = list(c.get("args", []))
            for e in c.get("env", []):
                flag = h.env.get(e["name"])
                # A flag on the command line wins over its variable, as in clap.
                if flag and "value" in e and flag not in flags_in(args):
                    args.append(f"{flag}={e['value']}")
            result = parse_check(binary, args)
            where = f"{d['metadata']['name']}/{c['name']}"
            if result.returncode != 0 and "not implemented yet" in result.stderr and "'--source" in result.stderr:
                # A source the binary does not implement yet (kube): check everything else
                # with a source it has, and report the source as pending.
                pending.append(f"{where}: {result.stderr.strip().splitlines()[0]}")
                args = [a for a in args if not a.startswith("--source=")] + ["--source=file:/nonexistent"]
                result = parse_check(binary, args)
            assert result.returncode == 0, f"{where}: {binary} {' '.join(args)}\n{result.stderr}"
            checked += 1
    assert checked
    if pending:
        pytest.skip("all other arguments parse; waiting on the binary for: " + "; ".join(pending))


def test_ingester_design_flags_pending():
    """Reports which design flags still wait on the ingester binary, and warns when the binary
    has one the chart still leaves out. The design values render only design flags."""
    h = help_of("shoal-ingester")
    defaults = merged("default")["ingester"]["binarySupport"]
    assert set(defaults) == set(DESIGN_INGESTER_FLAGS)
    for switch, flag in DESIGN_INGESTER_FLAGS.items():
        if flag in h.flags and not defaults[switch]:
            warnings.warn(
                f"shoal-ingester now accepts {flag}: set ingester.binarySupport.{switch}: true "
                "in helm/shoal/values.yaml",
                stacklevel=1,
            )
    for d, c in containers(render("design")):
        binary = binary_of(c)
        known = help_of(binary).flags | (set(DESIGN_INGESTER_FLAGS.values()) if binary == "shoal-ingester" else set())
        unknown = [f for f in flags_in(c["args"]) if f not in known]
        assert not unknown, f"{d['metadata']['name']}: {unknown} are neither accepted nor design flags"
    missing = sorted(f for f in DESIGN_INGESTER_FLAGS.values() if f not in h.flags)
    if missing:
        pytest.skip(f"shoal-ingester does not accept {missing} yet; their binarySupport switches stay off")


# --- values.schema.json ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"server": {"replicaCount": "two"}}, "/server/replicaCount"),
        ({"server": {"replicas": 2}}, "replicas"),
        ({"nats": {"replicas": "3"}}, "/nats/replicas"),
        ({"nats": {"server": {"tokenSecret": {"nmae": "t"}}}}, "nmae"),
        ({"nats": {"ingester": {"tls": {"enabled": True}}}}, "enabled"),
        ({"nats": {"proxy": {}}}, "proxy"),
        ({"ingesters": [{"name": "Not_A_Label"}]}, "/ingesters/0/name"),
        ({"ingesters": [{"fleet": "x"}]}, "name"),
        ({"server": {"logFormat": "xml"}}, "/server/logFormat"),
        ({"server": {"debounceAfter": "soon"}}, "/server/debounceAfter"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        (
            {"server": {"meshConfig": {"outboundTrafficPolicy": {"mode": "DENY_ALL"}}}},
            "/server/meshConfig/outboundTrafficPolicy/mode",
        ),
        ({"server": {"meshConfig": {"outboundTrafficPolicy": {"mode": "registry_only"}}}}, "/server/meshConfig/outboundTrafficPolicy/mode"),
        ({"server": {"meshConfig": {"rootNamespace": "Istio_System"}}}, "/server/meshConfig/rootNamespace"),
        ({"server": {"meshConfig": {"rootNamepsace": "istio-system"}}}, "rootNamepsace"),
    ],
)
def test_schema_rejects_bad_values(chart, bad, message):
    with pytest.raises(helm.HelmValuesError) as err:
        chart.render(bad, name=RELEASE, namespace=NAMESPACE)
    assert message in str(err.value)
    report = helm.lint(CHART, bad, strict=True, namespace=NAMESPACE)
    assert report["errors"], "helm lint accepted values the schema rejects"


def test_schema_is_draft07_and_types_every_value(chart):
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False

    def resolve(node):
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
        return node

    def typed(node):
        node = resolve(node)
        return "type" in node or "enum" in node or "const" in node or all(
            typed(n) for n in node.get("oneOf", node.get("anyOf", [])) or [{}]
        )

    def walk(value, node, path):
        node = resolve(node)
        assert typed(node), f"{path or '/'} has no type in values.schema.json"
        if isinstance(value, dict):
            props = node.get("properties", {})
            for k, v in value.items():
                if k in props:
                    walk(v, props[k], f"{path}/{k}")
                else:
                    # Free-form objects (Kubernetes structures the chart passes through, such
                    # as affinity, checked after rendering) leave additionalProperties open.
                    extra = node.get("additionalProperties", True)
                    assert extra is not False, f"{path}/{k} is not in values.schema.json"
                    if isinstance(extra, dict):
                        walk(v, extra, f"{path}/{k}")
        elif isinstance(value, list) and "items" in node:
            for i, v in enumerate(value):
                walk(v, node["items"], f"{path}/{i}")

    for name, make in VALUE_SETS.items():
        walk(chart.merge_values(make()), schema, "")
        chart.validate_schema(make())
