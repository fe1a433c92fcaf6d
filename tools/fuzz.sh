#!/usr/bin/env bash
# Fuzzes every parser that reads bytes from outside (issue #14) with cargo-fuzz
# (libFuzzer, AddressSanitizer, debug assertions and overflow checks on), SECONDS_PER_TARGET
# seconds each (default 30), from a seed corpus made of the committed fixtures.
#
#   tools/fuzz.sh                                          # every target, 30 s each
#   SECONDS_PER_TARGET=1200 nice -n 19 tools/fuzz.sh manifest config   # a long run of two
#   FUZZ_SEED=1 tools/fuzz.sh         # libFuzzer's -seed (tools/test.sh fixes it, so that
#                                     # CI walks the same inputs each run; default random)
#
# Toolchain: the nightly pinned in tools/wasm-threads-toolchain.toml (the one nightly the
# project uses) and cargo-fuzz $CARGO_FUZZ_VERSION; both installed if missing.
# The fuzz crate is its own workspace with its own committed Cargo.lock (fuzz/).
# Each run keeps its corpus in fuzz/corpus/<target> (not committed) and prints libFuzzer's
# last status line (executions, coverage). A crash leaves its input in
# fuzz/artifacts/<target>/ and fails the script; turn it into a regression test in the
# normal cargo tests and fix the cause (docs/benchmarks.md, "Fuzzing").
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECONDS_PER_TARGET:-30}
CARGO_FUZZ_VERSION=0.13.2
NIGHTLY=$(sed -n 's/^channel = "\(.*\)"/\1/p' tools/wasm-threads-toolchain.toml)
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(config safetensors_header manifest range_header multipart usage_body chat_template tokenizer gguf kv_cache json_schema)

rustup toolchain list | grep -q "^$NIGHTLY" || rustup toolchain install "$NIGHTLY" --profile minimal
if ! command -v cargo-fuzz >/dev/null || [ "$(cargo-fuzz --version | awk '{print $2}')" != "$CARGO_FUZZ_VERSION" ]; then
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

# Seed corpus from the fixtures (added to whatever an earlier run left in fuzz/corpus).
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
for f in tests/fixtures/gguf/*.gguf; do seed gguf "$f"; done
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
mkdir -p "$C/json_schema"
printf '{"type": "object", "properties": {"a": {"$ref": "#/$defs/t"}, "b": {"type": "array", "items": {"type": "integer"}}}, "$defs": {"t": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/t"}]}}, "required": ["a"]}' > "$C/json_schema/seed0"
printf 'root ::= "{" ws item ("," ws item)* "}"\nitem ::= [a-z]+ | "x"\nws ::= [ ]*\n' > "$C/json_schema/seed1"
printf '{"format": "colibri-usage", "version": 1, "model": "m", "n_layers": 4, "n_experts": 8, "counts": [[0, 1, 3]]}' > "$C/usage_body/seed1"

cd fuzz
echo "== fuzz: building ${#TARGETS[@]} target(s) with $NIGHTLY, cargo-fuzz $CARGO_FUZZ_VERSION"
start=$SECONDS
for t in "${TARGETS[@]}"; do
  cargo "+$NIGHTLY" fuzz build "$t"
done
echo "== fuzz: built in $((SECONDS - start)) s"
failed=()
for t in "${TARGETS[@]}"; do
  echo "== fuzz $t for ${SECS}s"
  mkdir -p "corpus/$t" "artifacts/$t"
  log="${TMPDIR:-/tmp}/colibri-fuzz-$t.log"
  # -rss_limit_mb: an input that makes a parser allocate more is a finding (sizes are
  # checked before allocation); -max_len: the largest input tried.
  if ! cargo "+$NIGHTLY" fuzz run "$t" "corpus/$t" -- -max_total_time="$SECS" -rss_limit_mb=2048 \
       -max_len=1048576 -print_final_stats=1 ${FUZZ_SEED:+-seed=$FUZZ_SEED} > "$log" 2>&1; then
    failed+=("$t")
    grep -E "panicked|ERROR|SUMMARY|out-of-memory|Test unit written" "$log" | head -n 8 || true
  fi
  # The last status line (#runs, cov, ft, corp) and the final stats.
  grep -E "^#[0-9]+" "$log" | tail -n 1 || true
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$log" | tr '\n' ' ' || true
  echo
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in: ${failed[*]} (inputs under fuzz/artifacts/, logs in ${TMPDIR:-/tmp}/colibri-fuzz-*.log)" >&2
  exit 1
fi
echo "fuzz: no crashes in ${TARGETS[*]} (${SECS}s each)"
