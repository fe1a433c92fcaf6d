#!/usr/bin/env bash
# colibri's whole test suite:
#   1. the browser engine (colibri-wasm for wasm32-unknown-unknown + wasm-bindgen), twice:
#      web/pkg/ without threads (stable) and web/pkg-threads/ with wasm threads (the
#      pinned nightly of tools/wasm-threads-toolchain.toml, installed by build-web.sh if
#      missing), which also proves the engine and its WebGPU backend compile for both;
#   2. every crate's unit and integration tests, GPU kernels included (wgpu on Vulkan:
#      Mesa lavapipe where there is no GPU; a missing adapter is a failure here);
#   3. the browser end-to-end tests: headless Chromium (WebGPU on SwiftShader) against a
#      real `coli serve`, driven by playwright-core.
# Needs: rustup target wasm32-unknown-unknown, wasm-bindgen-cli (installed by
# build-web.sh if missing), mesa-vulkan-drivers, chromium, node + `npm ci` in tests/e2e.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== browser engine (wasm32)"
./tools/build-web.sh

echo "== cargo tests"
# NODEVICE_SELECT: Mesa's device-select layer warns about XDG_RUNTIME_DIR without a display.
COLIBRI_REQUIRE_GPU=1 NODEVICE_SELECT=1 cargo test --workspace --locked

echo "== browser end-to-end tests"
if [ ! -d tests/e2e/node_modules/playwright-core ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund)
fi
COLI="${CARGO_TARGET_DIR:-$PWD/target}/debug/coli" node --test tests/e2e/
