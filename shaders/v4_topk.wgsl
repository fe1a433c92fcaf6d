// v4_topk.wgsl — DeepSeek-V4's lightning indexer's choice (v4::compress::select) from the
// scores of index_scores.wgsl: for query i (position p = pos0 + i) of the vis =
// min((p + 1) / rate, keys) entries it may see, the topk with the highest score, ties to
// the lower entry (the CPU's sort: descending score, then ascending index; all of them
// when vis <= topk), listed in ascending entry order. Entry j is kept when fewer than
// topk entries rank before it.
//
// Bindings:
//   0 P     uniform Params
//   1 S     storage read  f32 [n, s_stride]        the scores (j < vis read)
//   2 FL    storage rw    u32 [n, s_stride]        scratch: 1 where an entry is kept
//   3 LIST  storage rw    u32 [n, topk + 1]        per query: the count, then the entries
// Workgroup: 64 threads for one query, each ranking j, j + 64, ...; thread 0 lists.
// Dispatch: n workgroups, split (x, y) with groups_x.

struct Params {
    zero: u32,
    n: u32,
    pos0: u32,
    rate: u32,
    keys: u32,
    topk: u32,
    s_stride: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read_write> FL: array<u32>;
@group(0) @binding(3) var<storage, read_write> LIST: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let i = wg.x + wg.y * P.groups_x;
    if (i >= P.n) {
        return;
    }
    let p = P.pos0 + i;
    let vis = min((p + 1u) / P.rate, P.keys);
    let sb = i * P.s_stride;
    for (var j = li; j < vis; j = j + 64u) {
        var kept = 1u;
        if (vis > P.topk) {
            let v = S[sb + j];
            var rank = 0u;
            for (var k = 0u; k < vis; k = k + 1u) {
                let u = S[sb + k];
                if (u > v || (u == v && k < j)) {
                    rank = rank + 1u;
                }
            }
            kept = select(0u, 1u, rank < P.topk);
        }
        FL[sb + j] = kept;
    }
    storageBarrier();
    workgroupBarrier();
    if (li == 0u) {
        let lb = i * (P.topk + 1u);
        var c = 0u;
        for (var j = 0u; j < vis; j = j + 1u) {
            if (FL[sb + j] != 0u) {
                LIST[lb + 1u + c] = j;
                c = c + 1u;
            }
        }
        LIST[lb] = c;
    }
}
