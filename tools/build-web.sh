#!/usr/bin/env bash
# Builds the browser engine twice, then wasm-bindgen (the CLI must be exactly the
# wasm-bindgen version the crate pins) into the folders the helper serves next to
# web/colibri.js; web/colibri-worker.js picks one per page:
#   web/pkg/          one thread, stable Rust: pages that are not cross-origin isolated
#                     (a widget on another site) cannot share wasm memory between workers;
#   web/pkg-threads/  wasm threads (atomics, shared memory, the engine's rayon pool on Web
#                     Workers via wasm-bindgen-rayon) and relaxed SIMD: the pinned nightly of
#                     tools/wasm-threads-toolchain.toml, std rebuilt with -Z build-std.
# COLIBRI_WEB_THREADS=0 skips the threaded build (the engine then runs on one thread).
set -euo pipefail
cd "$(dirname "$0")/.."

WB_VERSION=$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' wasm/Cargo.toml)
if ! command -v wasm-bindgen >/dev/null || [ "$(wasm-bindgen --version | awk '{print $2}')" != "$WB_VERSION" ]; then
  echo "== installing wasm-bindgen-cli $WB_VERSION"
  cargo install wasm-bindgen-cli --version "$WB_VERSION"
fi
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true

TARGET_DIR=${CARGO_TARGET_DIR:-target}
echo "== one-thread engine -> web/pkg/"
CARGO_PROFILE_RELEASE_DEBUG=0 cargo build -p colibri-wasm --locked --target wasm32-unknown-unknown --release
rm -rf web/pkg
wasm-bindgen --target web --no-typescript --out-dir web/pkg \
  "$TARGET_DIR/wasm32-unknown-unknown/release/colibri_wasm.wasm"
ls -l web/pkg

if [ "${COLIBRI_WEB_THREADS:-1}" = 0 ]; then
  echo "== threaded engine skipped (COLIBRI_WEB_THREADS=0)"
  rm -rf web/pkg-threads
  exit 0
fi
NIGHTLY=$(sed -n 's/^channel = "\(.*\)"/\1/p' tools/wasm-threads-toolchain.toml)
if ! rustup run "$NIGHTLY" rustc --version >/dev/null 2>&1 \
  || ! rustup component list --toolchain "$NIGHTLY" --installed | grep -q '^rust-src' \
  || ! rustup target list --toolchain "$NIGHTLY" --installed | grep -q '^wasm32-unknown-unknown'; then
  echo "== installing $NIGHTLY (rust-src, wasm32) for the threaded engine"
  rustup toolchain install "$NIGHTLY" --profile minimal --component rust-src --target wasm32-unknown-unknown
fi
echo "== threaded engine ($NIGHTLY, -Z build-std) -> web/pkg-threads/"
# Its own target folder: other flags and another std, so the two builds do not evict each
# other. The flags replace .cargo/config.toml's (+simd128 is repeated here). The linker is
# asked for the shared memory itself (this nightly's rustc no longer adds it for +atomics)
# and the thread-local-storage exports wasm-bindgen's thread support looks for; a shared
# memory must declare a maximum: 4 GiB, the wasm32 limit, as the one-thread build may grow to.
LINK="--shared-memory --import-memory --max-memory=4294967296 --export=__wasm_init_tls --export=__tls_size --export=__tls_align --export=__tls_base"
RUSTFLAGS="-C target-feature=+atomics,+bulk-memory,+mutable-globals,+simd128,+relaxed-simd$(printf -- ' -C link-arg=%s' $LINK)" \
  CARGO_PROFILE_RELEASE_DEBUG=0 cargo "+$NIGHTLY" build -p colibri-wasm --features threads --locked \
  --target wasm32-unknown-unknown --release -Z build-std=panic_abort,std --target-dir "$TARGET_DIR/wasm-threads"
rm -rf web/pkg-threads
wasm-bindgen --target web --no-typescript --out-dir web/pkg-threads \
  "$TARGET_DIR/wasm-threads/wasm32-unknown-unknown/release/colibri_wasm.wasm"
# A module without a shared memory would load and then fail to start its pool: refuse it here.
grep -q "shared: *true" web/pkg-threads/colibri_wasm.js || { echo "web/pkg-threads: the wasm memory is not shared" >&2; exit 1; }
ls -lR web/pkg-threads
