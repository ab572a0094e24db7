"""Plain (non-xDS) gRPC servers that say who answered, for tests/tests/grpc_proxyless.rs.

Usage: backend.py [xds:]NAME=HOST:PORT [...]

Each server answers the unary method /echo.Echo/Call with its NAME (bytes in, bytes out:
no protobuf code generation needed); the first call carrying `x-fail-once: KEY` fails
with UNAVAILABLE instead. Prints "ready" once every server is started. An
`xds:` server is xDS-enabled (xDS credentials, plaintext fallback): it takes its listener
`xds.istio.io/grpc/lds/inbound/HOST:PORT` from the control plane in GRPC_XDS_BOOTSTRAP
and serves only once it has it.
"""

import sys
import threading
from concurrent import futures

import grpc


# Keys of `x-fail-once` already failed (shared by every server of the process, so a
# retry on another pod succeeds too).
FAILED = set()
FAILED_LOCK = threading.Lock()


def handler_for(name):
    def call(_request, context):
        # `x-fail-once: KEY`: the first call with KEY fails UNAVAILABLE (retries).
        for key, value in context.invocation_metadata():
            if key == "x-fail-once":
                with FAILED_LOCK:
                    first = value not in FAILED
                    FAILED.add(value)
                if first:
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"{name}: failing {value} once")
        return name.encode()

    return grpc.method_handlers_generic_handler(
        "echo.Echo", {"Call": grpc.unary_unary_rpc_method_handler(call)}
    )


def main():
    servers = []
    for spec in sys.argv[1:]:
        xds = spec.startswith("xds:")
        name, addr = spec.removeprefix("xds:").split("=", 1)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), xds=xds)
        server.add_generic_rpc_handlers((handler_for(name),))
        if xds:
            # xDS server credentials: mutual TLS when the listener says so (certificates
            # from the bootstrap's certificate providers), else plaintext.
            creds = grpc.xds_server_credentials(grpc.insecure_server_credentials())
            bound = server.add_secure_port(addr, creds)
        else:
            bound = server.add_insecure_port(addr)
        if bound == 0:
            sys.exit(f"cannot listen on {addr}")
        server.start()
        servers.append(server)
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
