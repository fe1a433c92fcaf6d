# Sourced by tools/bench_batch.sh and tools/bench_serve_batch.sh: the OLMoE-shaped synthetic
# model they measure, made once under $OUT with `coli synth` then `coli convert`'s defaults
# (experts int4, attention / dense / output int8). Sets DST to its directory.
# Needs COLI OUT LAYERS EXPERTS TOPK HIDDEN INTERMEDIATE HEADS VOCAB ROUTING KEEP, and say().
bench_model() {
  SRC="$OUT/bf16-L$LAYERS-E$EXPERTS" DST="$OUT/default-L$LAYERS-E$EXPERTS"
  if [ ! -f "$DST/colibri.json" ]; then
    if [ ! -f "$SRC/config.json" ]; then
      say "coli synth ($LAYERS layers, $EXPERTS experts of $INTERMEDIATE, top-$TOPK, hidden $HIDDEN, --routing $ROUTING)"
      "$COLI" synth -o "$SRC" --layers "$LAYERS" --experts "$EXPERTS" --top-k "$TOPK" --hidden "$HIDDEN" \
        --intermediate "$INTERMEDIATE" --heads "$HEADS" --vocab "$VOCAB" --routing "$ROUTING" \
        --tokenizer models/demo >/dev/null
    fi
    say "coli convert (the defaults)"
    "$COLI" convert "$SRC" -o "$DST" >/dev/null
    [ "$KEEP" = 1 ] || rm -rf "$SRC"
  fi
}
