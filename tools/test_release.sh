#!/usr/bin/env bash
# The release archive as a user meets it (tools/release.sh makes it): its checksum, then
# unpacked into an empty directory and run with an empty HOME and no Rust toolchain on
# PATH: `coli --version` names the commit, `coli serve` starts, the chat page and both
# browser engine builds load, the built-in demo model answers through the API, and
# `coli list` then shows it installed under HOME.
#
#   tools/test_release.sh DIST/colibri-<version>-linux-<arch>.tar.gz
set -euo pipefail
archive=$(realpath "$1")
work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
passed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { echo "FAIL $1" >&2; [ -f "$work/serve.log" ] && tail -20 "$work/serve.log" >&2; exit 1; }

(cd "$(dirname "$archive")" && grep " $(basename "$archive")\$" SHA256SUMS | sha256sum -c --quiet -) || fail "checksum"
ok "sha256 matches SHA256SUMS"

mkdir -p "$work/unpacked" "$work/home"
tar -C "$work/unpacked" -xzf "$archive"
coli=$(ls "$work"/unpacked/colibri-*/coli)
# Nothing of this machine's: an empty HOME, a PATH without ~/.cargo/bin, no COLI_HOME.
run() { env -i HOME="$work/home" PATH=/usr/bin:/bin LANG=C.UTF-8 "$@"; }
run sh -c '! command -v cargo && ! command -v rustc' >/dev/null || fail "a Rust toolchain is on the test's PATH"
version=$(run "$coli" --version)
[[ "$version" =~ ^coli\ [0-9.]+\ \(commit\ [0-9a-f]{12} ]] || fail "--version: $version"
ok "coli --version: $version"

run "$coli" serve --port 0 > "$work/serve.log" 2>&1 &
pid=$!
url=
for _ in $(seq 1 200); do
  url=$(sed -n 's/^colibri is listening on \(http:[^ ]*\)$/\1/p' "$work/serve.log" | head -1)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || fail "coli serve exited"
  sleep 0.1
done
[ -n "$url" ] || fail "coli serve did not start"
ok "coli serve listens on $url"

# Outputs are read whole before grep: `cmd | grep -q` under pipefail fails when grep stops
# reading before cmd has written the rest (curl: (23) Failed writing body).
page=$(curl -fsS "$url/") || fail "the chat page"
grep -q "<title>colibri</title>" <<<"$page" || fail "the chat page"
# ALLOW_PARTIAL_WEB=1: an archive made with `release.sh --allow-partial-web` (no threaded build).
wasms=(pkg/colibri_wasm_bg.wasm pkg-threads/colibri_wasm_bg.wasm)
[ "${ALLOW_PARTIAL_WEB:-0}" = 1 ] && wasms=(pkg/colibri_wasm_bg.wasm)
for wasm in "${wasms[@]}"; do
  type=$(curl -fsS -o /dev/null -w '%{content_type}' "$url/$wasm") || fail "/$wasm"
  [ "$type" = application/wasm ] || fail "/$wasm: $type"
done
ok "the chat page and the engine builds (${wasms[*]})"

answer=$(curl -fsS "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "demo", "messages": [{"role": "user", "content": "What is 7 plus 5?"}], "temperature": 0}')
grep -q '12' <<<"$answer" || fail "the demo's answer: $answer"
ok "the demo model answers: $(echo "$answer" | sed -n 's/.*"content":"\([^"]*\)".*/\1/p')"

kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
listed=$(run "$coli" list) || fail "coli list"
grep -q "^demo .*$work/home/.local/share/colibri/models/demo" <<<"$listed" || fail "coli list: $listed"
ok "coli list shows the demo installed under the empty HOME"
echo "release archive: $passed passed, 0 failed"
