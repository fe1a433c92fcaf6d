// embed.wgsl — embedding lookup: X[i, c] = W[ids[i] - row0, c] for every position i
// whose id falls in this row block [row0, row0 + rows) of the embedding matrix (a
// matrix too large for one binding is uploaded in blocks; one dispatch per block).
//
// Preludes: common/weights.wgsl (W, DTYPE, GROUP, wval).
// Bindings:
//   0 P    uniform Params
//   1 W    storage read  u32 [rows * row_words]  row block of (vocab, hidden), stored dtype
//   2 IDS  storage read  u32 [ids_offset + n]
//   3 X    storage rw    f32 [n * cols]
// Workgroup: 64 threads, one per (i, c).
// Dispatch: ceil(n * cols / 64) workgroups, split (x, y) as for every 1-D kernel.

struct Params {
    zero: u32,
    n: u32,
    cols: u32,
    rows: u32,
    row0: u32,
    row_words: u32,
    ids_offset: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> IDS: array<u32>;
@group(0) @binding(3) var<storage, read_write> X: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let t = (wg.x + wg.y * P.groups_x) * 64u + li;
    if (t >= P.n * P.cols) {
        return;
    }
    let i = t / P.cols;
    let c = t % P.cols;
    let id = IDS[P.ids_offset + i];
    if (id < P.row0 || id - P.row0 >= P.rows) {
        return;
    }
    X[t] = wval(id - P.row0, c, P.cols, P.row_words);
}
