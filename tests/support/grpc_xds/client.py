"""A proxyless gRPC client (gRPC's own xDS client, from the grpcio wheel) driven over HTTP,
for tests/tests/grpc_proxyless.rs.

Usage: GRPC_XDS_BOOTSTRAP=bootstrap.json client.py CONTROL_PORT

GET http://127.0.0.1:CONTROL_PORT/call?target=xds:///echo:7070&n=20&header=x-version:v2
makes n calls of /echo.Echo/Call on one channel per target and credentials (kept across
requests, so xDS updates reach a live channel; `creds=xds`, the default: xDS credentials,
mutual TLS where the cluster says so; `creds=insecure`: plaintext always) and answers JSON: {"backends": {name: count}, "errors":
{"CODE: details": count}}. GET /csds answers the xDS clients' status (CSDS
ClientStatusResponse, protobuf).
"""

import collections
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import grpc
import grpc.experimental
from grpc._cython import cygrpc

CHANNELS = {}
LOCK = threading.Lock()


def channel(target, creds):
    with LOCK:
        ch = CHANNELS.get((target, creds))
        if ch is None:
            if creds == "xds":
                # Mutual TLS where the cluster says so (certificates from the bootstrap's
                # certificate providers), else plaintext.
                fallback = grpc.experimental.insecure_channel_credentials()
                ch = grpc.secure_channel(target, grpc.xds_channel_credentials(fallback))
            else:
                ch = grpc.insecure_channel(target)
            CHANNELS[(target, creds)] = ch
        return ch


def calls(target, creds, n, headers, timeout):
    # No serializers: requests and responses are bytes.
    rpc = channel(target, creds).unary_unary("/echo.Echo/Call")
    backends = collections.Counter()
    errors = collections.Counter()
    for _ in range(n):
        try:
            backends[rpc(b"", timeout=timeout, metadata=headers).decode()] += 1
        except grpc.RpcError as e:
            # The next calls would most likely fail the same way: answer now, so a
            # polling test sees the error within its HTTP timeout.
            errors[f"{e.code().name}: {e.details()}"] += 1
            break
    return {"backends": backends, "errors": errors}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/csds":
            # The xDS clients' own view (CSDS ClientStatusResponse, serialized), as the
            # grpcio-csds service would serve it.
            self.reply("application/octet-stream", cygrpc.dump_xds_configs())
            return
        q = parse_qs(url.query)
        if url.path != "/call" or "target" not in q:
            self.send_error(404)
            return
        headers = [tuple(h.split(":", 1)) for h in q.get("header", [])]
        out = calls(
            q["target"][0],
            q.get("creds", ["xds"])[0],
            int(q.get("n", ["1"])[0]),
            headers,
            float(q.get("timeout", ["2"])[0]),
        )
        self.reply("application/json", json.dumps(out).encode())

    def reply(self, content_type, body):
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
