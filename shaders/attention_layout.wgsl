// attention_layout.wgsl: a snippet, not a kernel. Included (`//#include attention_layout`) by the
// attention kernels (attention.wgsl for GPUs, attention_rows.wgsl for CPUs): the sizes of the
// layout (read attention.wgsl's header) and where a row starts.
// Placeholders: ROWS, H, HKV, SQ, SKV, D, GRID_X, SCALE.

const ROWS: u32 = {{ROWS}}u;
const H: u32 = {{H}}u;
const HKV: u32 = {{HKV}}u;
const GROUP: u32 = H / HKV;
const SQ: u32 = {{SQ}}u;
const SKV: u32 = {{SKV}}u;
const D: u32 = {{D}}u;
const GRID_X: u32 = {{GRID_X}}u;
const SCALE: f32 = {{SCALE}};
const LOWEST: f32 = -3.4028234663852886e38;

// The first element of query row i of head h in batch b (q, o, do), and of key row j of KV
// head hk (k, v, dK, dV).
fn q_at(b: u32, h: u32, i: u32) -> u32 {
    return ((b * H + h) * SQ + i) * D;
}

fn kv_at(b: u32, hk: u32, j: u32) -> u32 {
    return ((b * HKV + hk) * SKV + j) * D;
}
