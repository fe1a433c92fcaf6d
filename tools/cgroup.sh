# Sourced by tools/bench_memlimit.sh and tools/bench_memlimit_peers.sh: a child memory
# cgroup of this shell's own (cgroup v1 memory controller, or v2 where `memory` is in the
# parent's cgroup.subtree_control), removed on exit. Needs write access there (root in a
# container usually has it). Needs say().
#   cgroup_make TAG          sets CGV (v1|v2) and CG (its directory), or exits saying why
#   cgroup_limit BYTES       sets the limit (and swap to the same / none)
#   cgroup_run CMD ARGS...   runs CMD inside it (its exit status; 137: OOM-killed)
#   cgroup_report            one line: peak usage and OOM kills

bytes() { # 4G -> bytes
  python3 -c "import re,sys;m=re.fullmatch(r'([0-9.]+)([KMGT]?)',sys.argv[1]);print(int(float(m[1])*{'':1,'K':1<<10,'M':1<<20,'G':1<<30,'T':1<<40}[m[2]]))" "$1"
}

cgroup_parent() {
  local line path mp
  line=$(grep -E '^[0-9]+:([^:]*,)?memory(,[^:]*)?:' /proc/self/cgroup || true)
  if [ -n "$line" ]; then
    path=${line#*:*:}
    mp=$(awk '$0 ~ / - cgroup / && $NF ~ /(^|,)memory(,|$)/ {print $5; exit}' /proc/self/mountinfo)
    [ -n "$mp" ] && { [ -d "$mp$path" ] && echo "v1 $mp$path" || echo "v1 $mp"; return; }
  fi
  path=$(sed -n 's/^0:://p' /proc/self/cgroup)
  mp=$(awk '$0 ~ / - cgroup2 / {print $5; exit}' /proc/self/mountinfo)
  if [ -n "$mp" ] && grep -qw memory "$mp$path/cgroup.subtree_control" 2>/dev/null; then
    echo "v2 $mp$path"
  fi
}

cgroup_make() {
  local parent
  read -r CGV parent < <(cgroup_parent || true) || true
  [ -n "${parent:-}" ] || { say "no writable memory cgroup hierarchy found (see tools/cgroup.sh)"; exit 1; }
  CG="$parent/coli-$1-$$"
  mkdir "$CG" || { say "cannot create $CG"; exit 1; }
  trap 'rmdir "$CG" 2>/dev/null || true' EXIT
}

cgroup_limit() {
  if [ "$CGV" = v1 ]; then
    # memsw must stay >= the memory limit: raise whichever order allows.
    echo "$1" > "$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true
    echo "$1" > "$CG/memory.limit_in_bytes"
    echo "$1" > "$CG/memory.memsw.limit_in_bytes" 2>/dev/null || true
    echo 0 > "$CG/memory.max_usage_in_bytes" 2>/dev/null || true
  else
    echo "$1" > "$CG/memory.max"
    echo 0 > "$CG/memory.swap.max" 2>/dev/null || true
  fi
}

cgroup_run() {
  sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG" "$@"
}

cgroup_report() {
  if [ "$CGV" = v1 ]; then
    echo "peak $(cat "$CG/memory.max_usage_in_bytes") bytes, $(grep oom_kill "$CG/memory.oom_control" | tr '\n' ' ')"
  else
    echo "peak $(cat "$CG/memory.peak" 2>/dev/null || echo ?) bytes, $(grep oom_kill "$CG/memory.events" | tr '\n' ' ')"
  fi
}
