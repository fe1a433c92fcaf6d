#!/usr/bin/env bash
# colibri's whole test suite: unit and integration tests of every crate, then a check
# that the engine still compiles for the browser (wasm32-unknown-unknown).
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --locked

echo "== engine builds for wasm32-unknown-unknown (no threads)"
cargo check -p colibri-engine --locked --target wasm32-unknown-unknown --no-default-features
echo "wasm32 check passed"
