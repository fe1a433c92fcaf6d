#!/usr/bin/env bash
# Fuzzes every parser that reads bytes from outside (issue #14) with cargo-fuzz
# (libFuzzer), SECONDS_PER_TARGET seconds each (default 30), from a seed corpus made of
# the committed fixtures. Needs a nightly toolchain and cargo-fuzz; installs them if
# missing (`rustup toolchain install nightly`, `cargo install cargo-fuzz`).
#
#   tools/fuzz.sh                     # every target, 30 s each
#   SECONDS_PER_TARGET=3600 tools/fuzz.sh manifest config   # a long run of two
#
# A crash leaves its input in fuzz/artifacts/<target>/ and fails the script; turn it
# into a regression test in the normal cargo tests (docs/benchmarks.md, "Fuzzing").
# Not part of tools/test.sh: nightly + cargo-fuzz + the fuzz build cost more CI time
# than the budget for it on 2 cores (measured numbers in docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECONDS_PER_TARGET:-30}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(config safetensors_header manifest range_header multipart usage_body chat_template tokenizer)

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

# Seed corpus from the fixtures (regenerated each run; fuzz/corpus is not committed).
C=fuzz/corpus
mkdir -p "$C"
seed() { mkdir -p "$C/$1"; cp "$2" "$C/$1/$(basename "$(dirname "$2")")-$(basename "$2")"; }
for f in tests/fixtures/*/config.json models/*/config.json; do seed config "$f"; done
for f in tests/fixtures/*/model.safetensors; do
  mkdir -p "$C/safetensors_header"
  # Header and the first tensors only: libFuzzer works best on small inputs.
  head -c 65536 "$f" > "$C/safetensors_header/$(basename "$(dirname "$f")")"
done
seed manifest models/demo/colibri.json
for f in tests/fixtures/*/tokenizer.json; do seed tokenizer "$f"; done
mkdir -p "$C/chat_template" "$C/range_header" "$C/multipart" "$C/usage_body"
for f in tests/fixtures/*/tokenizer_config.json models/demo/tokenizer_config.json; do
  python3 -c 'import json,sys; t=json.load(open(sys.argv[1])).get("chat_template"); t and isinstance(t,str) and sys.stdout.write(t)' "$f" \
    > "$C/chat_template/$(basename "$(dirname "$f")")" || true
done
i=0
for r in "bytes=0-99" "bytes=-5" "bytes=10-" "bytes=0-0,5-9,2-3" "bytes=1-2, 4-5 ,7-" "items=0-1" "bytes=99999999999999999999-"; do
  printf '\x00\x10\x00\x00\x00\x00\x00\x00%s' "$r" > "$C/range_header/seed$i"; i=$((i+1))
done
printf 'multipart/byteranges; boundary=b\n--b\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes 0-3/10\r\n\r\nabcd\r\n--b\r\nContent-Range: bytes 6-7/10\r\n\r\nxy\r\n--b--\r\n' > "$C/multipart/seed0"
printf '{"model": "demo", "counts": [[0, 1, 5], [3, 7, 2]]}' > "$C/usage_body/seed0"
printf '{"format": "colibri-usage", "version": 1, "model": "m", "n_layers": 4, "n_experts": 8, "counts": [[0, 1, 3]]}' > "$C/usage_body/seed1"

cd fuzz
failed=()
for t in "${TARGETS[@]}"; do
  echo "== fuzz $t for ${SECS}s"
  mkdir -p "corpus/$t"
  if ! cargo +nightly fuzz run "$t" "corpus/$t" -- -max_total_time="$SECS" -rss_limit_mb=4096 -max_len=1048576 \
       > "/tmp/colibri-fuzz-$t.log" 2>&1; then
    failed+=("$t")
  fi
  grep -E "^Done|SUMMARY|panicked|#[0-9]+ *DONE" "/tmp/colibri-fuzz-$t.log" | tail -n 3 || true
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz: no crashes in ${TARGETS[*]} (${SECS}s each)"
