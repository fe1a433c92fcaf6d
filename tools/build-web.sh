#!/usr/bin/env bash
# Builds the browser engine: colibri-wasm for wasm32-unknown-unknown, then wasm-bindgen
# (the CLI must be exactly the wasm-bindgen version the crate pins) into web/pkg/, which
# the helper serves next to web/colibri.js.
set -euo pipefail
cd "$(dirname "$0")/.."

WB_VERSION=$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' wasm/Cargo.toml)
if ! command -v wasm-bindgen >/dev/null || [ "$(wasm-bindgen --version | awk '{print $2}')" != "$WB_VERSION" ]; then
  echo "== installing wasm-bindgen-cli $WB_VERSION"
  cargo install wasm-bindgen-cli --version "$WB_VERSION"
fi
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true

TARGET_DIR=${CARGO_TARGET_DIR:-target}
CARGO_PROFILE_RELEASE_DEBUG=0 cargo build -p colibri-wasm --locked --target wasm32-unknown-unknown --release
wasm-bindgen --target web --no-typescript --out-dir web/pkg \
  "$TARGET_DIR/wasm32-unknown-unknown/release/colibri_wasm.wasm"
ls -l web/pkg
