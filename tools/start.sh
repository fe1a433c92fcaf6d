#!/usr/bin/env bash
# Starts colibri from a fresh clone: builds the browser engine (wasm) and `coli`, then
# runs the helper with the built-in demo model and prints the URL to open.
# Extra arguments go to `coli serve` (e.g. --port 8080, --model DIR, --allow-origin URL).
set -euo pipefail
cd "$(dirname "$0")/.."

./tools/build-web.sh >/dev/null
cargo build --release -p colibri-helper
TARGET_DIR=${CARGO_TARGET_DIR:-target}
if [ -f models/demo/config.json ]; then
  exec "$TARGET_DIR/release/coli" serve --model demo "$@"
else
  # The browser engine reads converted models; convert a (random) test model once.
  echo "models/demo is not in this checkout; serving a random test model instead" >&2
  [ -f "$TARGET_DIR/start/qwen3_moe/colibri.json" ] ||
    "$TARGET_DIR/release/coli" convert tests/fixtures/qwen3_moe -o "$TARGET_DIR/start/qwen3_moe" --quant f32
  exec "$TARGET_DIR/release/coli" serve --model "$TARGET_DIR/start/qwen3_moe" "$@"
fi
