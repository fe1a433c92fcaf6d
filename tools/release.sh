#!/usr/bin/env bash
# Release archives: DIR/colibri-<version>-linux-<arch>.tar.gz, each holding one folder with
# `coli` (the release profile: no debug info, no symbols), which carries inside it the web
# app with both browser engine builds (web/pkg and web/pkg-threads, embedded by
# helper/build.rs) and the demo model (installed into $COLI_HOME on first use), next to
# README.md; and DIR/SHA256SUMS. docs/release.md says what was tried where.
#
#   tools/release.sh [--out DIR] [--arch x86_64|aarch64|all] [--skip-web] [--allow-partial-web]
#
# --out DIR            where the archives go (default dist/)
# --arch               x86_64 (default, this machine), aarch64 (cross-built: the rust target
#                      aarch64-unknown-linux-gnu and gcc-aarch64-linux-gnu, which .ci/run
#                      installs for the NEON tests), or all
# --skip-web           use web/pkg and web/pkg-threads as they are (tools/test.sh built them)
# --allow-partial-web  a developer's archive without the threaded engine build
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=dist ARCH=x86_64 SKIP_WEB=0 PARTIAL_WEB=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --arch) ARCH=$2; shift 2 ;;
    --skip-web) SKIP_WEB=1; shift ;;
    --allow-partial-web) PARTIAL_WEB=1; shift ;;
    *) echo "release.sh: unknown option $1 (see the head of tools/release.sh)" >&2; exit 2 ;;
  esac
done
case "$ARCH" in
  x86_64|aarch64) ARCHES=("$ARCH") ;;
  all) ARCHES=(x86_64 aarch64) ;;
  *) echo "release.sh: --arch x86_64, aarch64 or all" >&2; exit 2 ;;
esac

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
if [ "$SKIP_WEB" = 0 ]; then
  ./tools/build-web.sh
fi
for f in web/index.html web/pkg/colibri_wasm_bg.wasm web/pkg-threads/colibri_wasm_bg.wasm; do
  if [ ! -f "$f" ]; then
    if [ "$PARTIAL_WEB" = 1 ] && [ "$f" = web/pkg-threads/colibri_wasm_bg.wasm ]; then
      echo "release.sh: warning: $f is missing; this archive's page has only the one-thread engine" >&2
      continue
    fi
    echo "release.sh: $f is missing (tools/build-web.sh builds it)" >&2
    exit 1
  fi
done

mkdir -p "$OUT"
TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# A reproducible archive: entries sorted, owned by root, dated by the commit.
EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
archives=()
for arch in "${ARCHES[@]}"; do
  echo "== coli for linux-$arch (release profile)"
  if [ "$arch" = "$(uname -m)" ]; then
    cargo build --release --locked -p colibri-helper
    bin=$TARGET_DIR/release/coli
  else
    triple=$arch-unknown-linux-gnu
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    cargo build --release --locked -p colibri-helper --target "$triple"
    bin=$TARGET_DIR/$triple/release/coli
  fi
  name=colibri-$VERSION-linux-$arch
  stage=$OUT/$name
  rm -rf "$stage"
  mkdir -p "$stage"
  cp "$bin" "$stage/coli"
  cp README.md "$stage/"
  tar -C "$OUT" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" -czf "$OUT/$name.tar.gz" "$name"
  rm -rf "$stage"
  archives+=("$name.tar.gz")
  echo "   $OUT/$name.tar.gz: $(du -h "$OUT/$name.tar.gz" | cut -f1) (coli $(du -h "$bin" | cut -f1))"
done
(cd "$OUT" && sha256sum "${archives[@]}" > SHA256SUMS)
echo "== $OUT/SHA256SUMS"
cat "$OUT/SHA256SUMS"
