# The kleym image: one static-ish binary, `kleym` (hub, spoke, report, crds, credential
# plugins), on a distroless base with no shell, running as the distroless `nonroot` user.
#
#   docker build -t kleym:dev .
#
# Not built in this repository's CI (no container engine there); see docs/README.md.

# --- build ---------------------------------------------------------------------------------
FROM rust:1.89-bookworm AS build
WORKDIR /src
# Cache mounts keep the registry and target dir between builds (BuildKit). The `dist` profile
# (Cargo.toml) is the release build without debug info and symbols: the image gets a stripped
# binary, while local `--release` builds keep line tables for backtraces.
# jemalloc (the binary's allocator, see hub/Cargo.toml) fixes the page size it supports when it
# is built: on arm64, where kernels run with 4, 16 or 64 KiB pages, it is built for up to
# 64 KiB so the image starts on all of them.
ARG TARGETARCH
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    if [ "$TARGETARCH" = "arm64" ]; then export JEMALLOC_SYS_WITH_LG_PAGE=16; fi \
 && cargo build --profile dist --locked -p kleym-hub --bin kleym \
 && install -D -m 0755 target/dist/kleym /out/kleym \
 && jemalloc_copying="$(find /usr/local/cargo/registry/src -path '*/tikv-jemalloc-sys-*/jemalloc/COPYING' | sort -V | tail -n 1)" \
 && install -D -m 0644 "$jemalloc_copying" /out/licenses/jemalloc/COPYING

# --- run -----------------------------------------------------------------------------------
# distroless/cc: glibc and libgcc for the Rust binary; TLS is rustls (no OpenSSL), CA roots
# come with the image.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/kleym /usr/local/bin/kleym
# jemalloc is linked into the binary; its BSD licence asks binary copies to carry its notice.
COPY --from=build /out/licenses/ /usr/share/licenses/
# 65532 = distroless nonroot; the chart and deploy/ also set runAsNonRoot.
USER 65532:65532
EXPOSE 8080 8443
# No init in front: as PID 1, kleym forks an init of its own that reaps orphaned processes (a
# killed credential plugin's children) and passes signals on (hub/src/init.rs).
ENTRYPOINT ["/usr/local/bin/kleym"]
CMD ["--help"]
