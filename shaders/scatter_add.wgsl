// scatter_add.wgsl: the embedding gradient, out[r, c] = Σ g[j, c] over the j with ids[j] == r,
// read through the ids sorted by sort_ids (order: [ids ascending; their positions]). Workgroup r
// finds its row's run of the sorted ids once (a binary search by one thread, shared through
// workgroup memory); its threads then sum the gradient rows at the run's positions, a column
// each, in order of position (deterministic, no atomics), and write row r: zeros where no id
// is r. Work: one search per row of the table and one read per (id, column): never ids × rows.
// Bindings (group 0): g (read, [N, DIM]), order (read, i32 [2, N]), out (read_write, [ROWS, DIM]).
// Grid: ROWS workgroups of 256 threads, folded into (GRID_X, y) past the per-dimension limit.
// Placeholders: BINDINGS, N, DIM, ROWS, GRID_X.

{{BINDINGS}}

const N: u32 = {{N}}u;
const DIM: u32 = {{DIM}}u;
const ROWS: u32 = {{ROWS}}u;
const GRID_X: u32 = {{GRID_X}}u;

var<workgroup> run: array<u32, 2>;

@compute @workgroup_size(256)
fn scatter_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x + wid.y * GRID_X;  // uniform across the workgroup
    if (lid == 0u) {
        var lo = 0u;  // the first k with order[k] >= r
        var hi = N;
        while (lo < hi) {
            let mid = (lo + hi) / 2u;
            if (order[mid] < i32(r)) {
                lo = mid + 1u;
            } else {
                hi = mid;
            }
        }
        var end = lo;
        while (end < N) {
            if (order[end] != i32(r)) {
                break;
            }
            end += 1u;
        }
        run[0] = lo;
        run[1] = end;
    }
    workgroupBarrier();
    if (r >= ROWS) {
        return;
    }
    let first = run[0];
    let last = run[1];
    for (var c = lid; c < DIM; c += 256u) {
        var total = 0.0;
        for (var k = first; k < last; k++) {
            total += g[u32(order[N + k]) * DIM + c];
        }
        out[r * DIM + c] = total;
    }
}
