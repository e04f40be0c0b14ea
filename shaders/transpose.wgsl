// transpose.wgsl: a batched transpose of the last two axes, out[b, c, r] = x[b, r, c], through
// a 32×32 tile in workgroup memory, so that both the reads (along c) and the writes (along r) are
// coalesced. (The elementwise permute gathers: its threads read a column of x, a cache line a
// thread. On the H200 SmolLM2's 1536x576 weight transposes took 12.4 µs gathered, 9.4 tiled;
// smaller ones are no faster tiled: codegen/shape.py TRANSPOSE_MIN_ELEMENTS.)
//
// A workgroup of 32×8 threads moves one tile: each thread reads 4 rows of it (8 apart) and writes
// 4 of the transposed tile. The tile's rows are padded to 33 so that the column reads after the
// barrier fall in 32 different banks.
// Bindings (group 0, generated from the KernelSpec): x0 (the input), then out (read_write).
// Grid: BATCH · ⌈ROWS/32⌉ · ⌈COLS/32⌉ workgroups, folded into (GRID_X, y).
//
// Placeholders: BINDINGS, TYPE (the element type), ROWS and COLS (the input's last two dims), TILES
// (all workgroups), GRID_X, READ (x0 at element `at`, through codegen/common.py Operands).

{{BINDINGS}}

const ROWS: u32 = {{ROWS}}u;
const COLS: u32 = {{COLS}}u;
const TILES: u32 = {{TILES}}u;
const GRID_X: u32 = {{GRID_X}}u;
const ROW_TILES: u32 = (ROWS + 31u) / 32u;
const COL_TILES: u32 = (COLS + 31u) / 32u;

var<workgroup> tile: array<{{TYPE}}, 32 * 33>;

@compute @workgroup_size(32, 8)
fn transpose(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let t = wid.x + wid.y * GRID_X;
    if (t >= TILES) {
        return;  // the same for the whole workgroup: the barrier below stays uniform
    }
    let base = (t / (ROW_TILES * COL_TILES)) * ROWS * COLS;
    let r0 = ((t / COL_TILES) % ROW_TILES) * 32u;
    let c0 = (t % COL_TILES) * 32u;
    for (var k = 0u; k < 32u; k += 8u) {
        let r = r0 + lid.y + k;
        let c = c0 + lid.x;
        if (r < ROWS && c < COLS) {
            let at = base + r * COLS + c;
            tile[(lid.y + k) * 33u + lid.x] = {{READ}};
        }
    }
    workgroupBarrier();
    for (var k = 0u; k < 32u; k += 8u) {
        let c = c0 + lid.y + k;
        let r = r0 + lid.x;
        if (c < COLS && r < ROWS) {
            out[base + c * ROWS + r] = tile[lid.x * 33u + lid.y + k];
        }
    }
}
