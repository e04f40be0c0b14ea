// attention_layout.wgsl: a snippet, not a kernel. Included (`//#include attention_layout`) by the
// attention kernels (attention.wgsl for GPUs, attention_rows.wgsl for CPUs): the sizes of the
// layout (read attention.wgsl's header), where a row starts, which keys a query sees, q·k.
// Placeholders: ROWS, H, HKV, SQ, SKV, D, GRID_X, SCALE; flag CAUSAL. Needs the bindings q and k.

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

// The keys query i sees: all, or 0..=i when causal.
fn key_end(i: u32) -> u32 {
//#if CAUSAL
    return min(SKV, i + 1u);
//#else
    return SKV;
//#endif
}

// q·k of query row `qi` and key row `kj` (element offsets), unscaled.
fn qk(qi: u32, kj: u32) -> f32 {
    var dot = 0.0;
    for (var d = 0u; d < D; d++) {
        dot += q[qi + d] * k[kj + d];
    }
    return dot;
}

// What the owner of query row `row` of [B·H·SQ] needs: its batch, the KV head it reads, the
// offset of its q/o/dO row and the end of its keys (causal or not).
struct QueryRow {
    b: u32,
    hk: u32,
    qi: u32,
    end: u32,
}

fn query_row(row: u32) -> QueryRow {
    let bh = row / SQ;
    return QueryRow(bh / H, (bh % H) / GROUP, row * D, key_end(row % SQ));
}
