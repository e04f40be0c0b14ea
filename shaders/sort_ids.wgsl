// sort_ids.wgsl: a stable sort of N i32 ids, by rank. Each id's rank (how many ids sort before
// it: smaller, or equal at an earlier position) is counted by LANES threads, each over a stride
// of the ids, summed in workgroup memory; the first of them writes the id and its position at
// that rank: out[rank] = ids[p], out[N + rank] = p. Every rank is written exactly once, so the
// result needs no initialisation and no atomics, and is the same on every run. Work: N²
// comparisons over N·LANES threads (N is the number of token ids in a batch: thousands, where
// the vocabulary is tens of thousands). A workgroup of 256 threads ranks 256 / LANES ids.
// Bindings (group 0): ids (read), out (read_write, 2·N).
// Grid: ceil(N·LANES / 256) workgroups, folded into (GRID_X, y) past the per-dimension limit.
// Placeholders: BINDINGS, N, LANES, GRID_X.

{{BINDINGS}}

const N: u32 = {{N}}u;
const LANES: u32 = {{LANES}}u;
const GRID_X: u32 = {{GRID_X}}u;

var<workgroup> partial: array<u32, 256>;

@compute @workgroup_size(256)
fn sort_ids(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let lane = lid % LANES;
    let p = (wid.x + wid.y * GRID_X) * (256u / LANES) + lid / LANES;
    let id = ids[min(p, N - 1u)];
    var count = 0u;
    for (var j = lane; j < N; j += LANES) {
        let other = ids[j];
        count += select(0u, 1u, other < id || (other == id && j < p));
    }
    partial[lid] = count;
    for (var half = LANES / 2u; half > 0u; half >>= 1u) {
        workgroupBarrier();
        if (lane < half) {
            partial[lid] += partial[lid + half];
        }
    }
    if (p < N && lane == 0u) {
        let rank = partial[lid];
        out[rank] = id;
        out[N + rank] = i32(p);
    }
}
