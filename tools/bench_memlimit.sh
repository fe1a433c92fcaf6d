#!/usr/bin/env bash
# The headline scenario of issue #34: a Qwen3-30B-A3B-shaped synthetic model (48 layers,
# 128 experts of intermediate 768, top-8, hidden 2048, vocab 151936; int4 experts, about
# 17 GB) decoding teacher-forced inside a memory cgroup of 4 GiB. Prints one line per
# phase and the `coli bench` JSON record of the run, then a summary: decode tokens/s,
# expert bytes read per token, hit rates, lookahead recall, and the decode time against
# the I/O lower bound (bytes read / the disk bandwidth measured in the same run).
#
#   tools/bench_memlimit.sh [OUT_DIR]
#
# Environment (defaults: the full scenario, which needs about 60 GB of transient disk for
# the bf16 checkpoint and 17 GB for the converted model):
#   COLI=target/release/coli  LAYERS=48  EXPERTS=128  TOPK=8  HIDDEN=2048
#   INTERMEDIATE=768  HEADS=16  VOCAB=151936  LIMIT=4G  ROUTING=trained
#   PROMPT=16  DECODE=32  TEXT=docs/architecture.md  KEEP=0 (1 keeps the models)
#   FP8=0 (1: the synthetic checkpoint stores its decoder layers' linear weights as
#   block-scaled FP8, as the DeepSeek/Kimi/GLM releases do: about 30 GB of transient disk
#   instead of 60; the converted int4 model has the same shape and size)
#   EXTRA="" (more `coli bench` flags, e.g. --no-lookahead)
# The smaller run documented in docs/benchmarks.md ("Larger than memory: the scaled
# headline run"): LAYERS=6 VOCAB=19000 LIMIT=512M (everything but the expert shape / 8).
#
# The cgroup: a child of this shell's own memory cgroup (tools/cgroup.sh: cgroup v1 memory
# controller, or v2 where `memory` is in the parent's cgroup.subtree_control), swap limited
# to the same. Needs write access there (root in a container usually has it); otherwise
# the script stops and says why. llama.cpp beside it: tools/bench_memlimit_peers.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
COLI=${COLI:-target/release/coli}
LAYERS=${LAYERS:-48} EXPERTS=${EXPERTS:-128} TOPK=${TOPK:-8} HIDDEN=${HIDDEN:-2048}
INTERMEDIATE=${INTERMEDIATE:-768} HEADS=${HEADS:-16} VOCAB=${VOCAB:-151936}
LIMIT=${LIMIT:-4G} ROUTING=${ROUTING:-trained} PROMPT=${PROMPT:-16} DECODE=${DECODE:-32}
TEXT=${TEXT:-docs/architecture.md} KEEP=${KEEP:-0} FP8=${FP8:-0} EXTRA=${EXTRA:-}
OUT=${1:-/tmp/coli-memlimit}
say() { echo "== $*" >&2; }
[ -x "$COLI" ] || { say "no $COLI: cargo build --release -p colibri-helper"; exit 1; }

. tools/cgroup.sh
LIMIT_B=$(bytes "$LIMIT")
cgroup_make bench-memlimit
cgroup_limit "$LIMIT_B"
say "cgroup $CGV $CG, limit $LIMIT ($LIMIT_B bytes)"

mkdir -p "$OUT"
KIND=bf16 SYNTH_FP8=()
[ "$FP8" = 1 ] && KIND=fp8 SYNTH_FP8=(--fp8)
SRC="$OUT/$KIND-L$LAYERS-E$EXPERTS-V$VOCAB-$ROUTING" DST="$OUT/int4-L$LAYERS-E$EXPERTS-V$VOCAB-$ROUTING-from-$KIND"
if [ ! -f "$DST/colibri.json" ]; then
  if [ ! -f "$SRC/config.json" ]; then
    say "coli synth ($LAYERS layers, $EXPERTS experts of $INTERMEDIATE, top-$TOPK, hidden $HIDDEN, vocab $VOCAB, --routing $ROUTING)"
    rm -rf "$SRC"
    /usr/bin/time -f "   %e s" "$COLI" synth -o "$SRC" --layers "$LAYERS" --experts "$EXPERTS" --top-k "$TOPK" \
      --hidden "$HIDDEN" --intermediate "$INTERMEDIATE" --heads "$HEADS" --vocab "$VOCAB" \
      --routing "$ROUTING" --tokenizer models/demo "${SYNTH_FP8[@]}" >/dev/null
  fi
  say "coli convert --quant int4"
  /usr/bin/time -f "   %e s" "$COLI" convert "$SRC" -o "$DST" --quant int4 >/dev/null
  [ "$KEEP" = 1 ] || rm -rf "$SRC"
fi
du -sh "$DST" >&2

say "coli bench inside the cgroup (cold page cache, teacher-forced on $TEXT)"
REC="$OUT/bench-$(date +%s).json"
set +e
cgroup_run "$COLI" bench --model "$DST" \
  --text "$TEXT" --prompt-tokens "$PROMPT" --decode-tokens "$DECODE" --cache cold $EXTRA > "$REC"
rc=$?
set -e
say "cgroup: $(cgroup_report)"
[ $rc = 0 ] || { say "coli bench exited $rc (137: OOM-killed)"; exit $rc; }
cat "$REC"
python3 - "$REC" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
d, disk = r["decode"], r["disk"]
steps = max(r["decode_tokens"], 1)
lb = disk["io_lower_bound_decode_seconds"]
print(f"""
model          {r['model']['layers']} layers x {r['model']['experts_per_layer']} experts, top-{r['model']['top_k']}: dense {r['model']['dense_bytes']/2**30:.2f} GiB, experts {r['model']['expert_bytes']/2**30:.2f} GiB
limit          {r['memory_limit']['describe']}
expert cache   {r['expert_cache']['budget_note']}
decode         {r['decode_tokens_per_second']:.2f} tok/s over {r['decode_tokens']} teacher-forced tokens
bytes/token    {r['bytes_read_per_decode_token']/2**20:.1f} MiB read ({d['per_token']['disk_reads']:.1f} of {d['per_token']['expert_uses']:.0f} experts from disk)
hit rates      pinned {d['hit_rate']['pinned']:.3f}, RAM (LRU or by use) {d['hit_rate']['ram_lru']:.3f}, disk {d['hit_rate']['disk']:.3f}
lookahead      recall {d['prefetch']['recall']}, wasted {d['prefetch']['wasted_bytes']/2**20:.1f} MiB, cancelled unread {d['prefetch'].get('cancelled_bytes', 0)/2**20:.1f} MiB
disk           {disk['read_bandwidth_bytes_per_second']/2**20:.0f} MiB/s measured in the run
vs I/O bound   decode {r['decode_seconds']:.2f} s, lower bound {lb if lb is None else round(lb, 2)} s{'' if not lb else f' -> {r["decode_seconds"]/lb:.2f}x'}
peak RSS       {r['peak_rss_bytes']/2**20:.0f} MiB""")
EOF
[ "$KEEP" = 1 ] || rm -rf "$DST"
