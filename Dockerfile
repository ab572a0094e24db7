# syntax=docker/dockerfile:1
# One image, both binaries: /usr/local/bin/shoal-server and /usr/local/bin/shoal-ingester.
# The server is built without the `standalone` feature, so it does not link the ingester
# (and its Kubernetes client): in the chart, the ingesters read the clusters.
#
#   docker build -t <registry>/shoal:0.1.0 .
#
# The Helm chart (helm/shoal) runs the same image for the server and the ingesters, picking the
# binary with `command`.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
# The whole workspace (see .dockerignore): cargo needs every member's manifest.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p shoal-server --no-default-features \
 && cargo build --release --locked -p shoal-ingester \
 && install -D -m 0755 target/release/shoal-server /out/shoal-server \
 && install -D -m 0755 target/release/shoal-ingester /out/shoal-ingester

# glibc, libgcc_s and CA certificates; no shell, no package manager. The :nonroot tag runs as
# 65532:65532, which the chart's securityContext also asks for.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/shoal-server /out/shoal-ingester /usr/local/bin/
USER 65532:65532
# 15010: gRPC ADS (server). 15014: admin HTTP, /ready /healthz /metrics (server, ingester).
EXPOSE 15010 15014
ENTRYPOINT ["/usr/local/bin/shoal-server"]
