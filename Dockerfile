# syntax=docker/dockerfile:1
# mpush-server: built with the pinned Rust and the locked dependencies, run as
# a non-root user on a small image (distroless: glibc, OpenSSL's libcrypto for
# the RSA handshake, CA certificates, no shell). Build: docker build -t mpush-server .
# Run the 3-node cluster: see deploy/README.md.

FROM rust:1.95.0-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p mpush-server \
 && cp target/release/mpush-server /mpush-server

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /mpush-server /usr/local/bin/mpush-server
# 65532: distroless's "nonroot" user.
USER 65532:65532
# TCP gateway, WebSocket gateway, HTTP API, node-to-node port (cluster mode).
EXPOSE 3000 8088 9999 3001
ENTRYPOINT ["/usr/local/bin/mpush-server"]
