// attention.wgsl: flash-style tiled attention for GPUs: the forward softmax(q·kᵀ·scale)·v with its
// row log-sum-exp, and the backward kernels dQ and (dK, dV), which recompute
// P = exp(q·kᵀ·scale − lse) from the saved log-sum-exp instead of reading it. (On a CPU target
// the lowering picks attention_rows.wgsl instead: a thread per row, no barriers.)
//
// Layout (PyTorch's): q, o, do [B, H, SQ, D]; k, v, dK, dV [B, HKV, SKV, D]; lse, delta [B, H, SQ].
// Query head h reads KV head h / GROUP (GROUP = H / HKV). With CAUSAL, query i sees keys j <= i.
//
// Tiles: BR query rows, BC key rows, THREADS threads per workgroup. Rows of D floats are staged
// in workgroup memory as DV = ceil(D / 4) vec4s, with one vec4 of padding per row (DS = DV + 1)
// so that threads reading the same column of different rows hit different banks; score tiles
// have one float of padding per row for the same reason. Every thread owns a register tile of
// named accumulators (no dynamically indexed private arrays): several scores of the score tile,
// and several rows × vec4 columns of its output tile. The unrolled per-thread code is generated
// (codegen/attention_tiles.py) into the {{…}} placeholders below.
//
//   attention (a workgroup per (b, h, query tile), the longest causal tiles first): Q staged
//     once; per key tile (causal: up to the diagonal tile only): stage K, scores S = Q·Kᵀ·scale
//     (masked keys: LOWEST), THREADS / BR threads a row (ROW_LANES; else a thread per row) fold
//     the tile into its running max and sum and turn S into P; stage V over K, O = O·alpha +
//     P·V. Writes o = O / l and lse = m + log l.
//   attention_grad_q (a workgroup per (b, h, query tile)): Q and dO staged once, per row lse
//     and Dᵢ = rowsum(dOᵢ ∘ Oᵢ) (the operand delta, reduced once before the kernel); per key
//     tile: stage K and V, dS = P ∘ (dO·Vᵀ − D), dQ += dS·K. Writes dQ·scale.
//   attention_grad_kv (a workgroup per (b, kv head, key tile)): K and V staged once; for every
//     query head of the group and every query tile that sees the key tile (causal: from the
//     diagonal tile on), in one walk: stage Q and dO, per row lse and D, Pᵀ and dSᵀ, dV += Pᵀ·dO,
//     dK += dSᵀ·Q. Writes dK·scale and dV. No atomics: each workgroup owns its output rows. PER_QUERY_HEAD: a
//     workgroup per (b, query head, key tile) walks its own head only and writes that head's
//     part, dK and dV [B, H, SKV, D] (summed over each group after the kernel). With a third
//     output out_s (the op's `scores`), it also writes dSᵀ·scale grouped by KV head, [B, HKV,
//     SKV, GROUP·SQ], from the score tile's registers, and zeros over the query tiles its walk
//     skips (the causal mask's): dQ is then a matmul of it (passes/attention_scores.py).
//
// Streamed tiles (K and V of the forward and dQ, Q and dO of dK/dV) pass through registers: with
// the tiling's prefetch (codegen/attention_tiles.py Tiles.prefetch) the next tile's loads are
// issued once the current one is stored, and wait in registers while it is computed; without,
// each tile loads where it is stored, after the barrier that frees its arrays.
//
// Bindings (group 0, generated from the KernelSpec; the outputs read_write): q, k and v, then out
// and out_lse; the backward: q, k, v, delta, lse, d_o, then out (dQ) or out_k and out_v (and
// out_s). Those moved a row at a time (q, k, v, d_o, out, out_k, out_v) are arrays of vec4 where D
// is a multiple of 4 (the VEC4 helpers load and store one vec4), else of f32; lse, delta, out_lse
// and out_s are arrays of f32.
// Grid: TILES workgroups, folded into (GRID_X, y).
//
// DROPOUT (the op's dropout > 0): the weights P are dropped as they are used, the mask staged per
// tile (`stage_keep`, below): the forward's O takes P ∘ M/(1 − p) while its running sum takes P;
// dQ's and dK's dS = P ∘ (M/(1 − p)·(dO·Vᵀ) − D), dV takes (P ∘ M/(1 − p))ᵀ. The RNG state binds
// after the reads.
//
// Placeholders: BINDINGS and attention_layout's and attention_dropout's, BR, BC, THREADS, DV, TILES, SEQ_TILES, VEC4
// (load/store helpers) and the per-kernel code (DS_ZEROS empty without out_s); flags CAUSAL, FORWARD, GRAD_Q, GRAD_KV,
// PER_QUERY_HEAD, ROW_LANES, ROWS_AHEAD (dK/dV: THREADS >= BR), TILE_MAJOR.

{{BINDINGS}}

//#include attention_layout
//#include attention_dropout

const BR: u32 = {{BR}}u;
const BC: u32 = {{BC}}u;
const THREADS: u32 = {{THREADS}}u;
const DV: u32 = {{DV}}u;
const DS: u32 = DV + 1u;
const TILES: u32 = {{TILES}}u;
const SEQ_TILES: u32 = {{SEQ_TILES}}u;  // query tiles per head (forward, dQ) or key tiles per kv head (dK, dV)
const Q_TILES: u32 = (SQ + BR - 1u) / BR;  // query tiles per head

// Workgroup `tile`'s (b, head) and the rank of its sequence tile within the head. TILE_MAJOR:
// tile-major (every head's rank-0 tile, then every head's rank 1, …), so that under the causal
// mask the longest walks of all heads start before any shorter one; else head-major.
const HEADS_OUT: u32 = TILES / SEQ_TILES;

fn tile_head(tile: u32) -> u32 {
//#if TILE_MAJOR
    return tile % HEADS_OUT;
//#else
    return tile / SEQ_TILES;
//#endif
}

fn tile_rank(tile: u32) -> u32 {
//#if TILE_MAJOR
    return tile / HEADS_OUT;
//#else
    return tile % SEQ_TILES;
//#endif
}

// Whether query i sees key j (both inside their sequences).
fn visible(i: u32, j: u32) -> bool {
//#if CAUSAL
    return i < SQ && j < SKV && j <= i;
//#else
    return i < SQ && j < SKV;
//#endif
}

// The end of the keys a query tile starting at q0 needs: all, or up to its last row's diagonal.
fn key_stop(q0: u32) -> u32 {
//#if CAUSAL
    return min(SKV, min(SQ, q0 + BR));
//#else
    return SKV;
//#endif
}

// The first query tile that sees the key tile starting at k0: 0, or the diagonal tile.
fn query_start(k0: u32) -> u32 {
//#if CAUSAL
    return (k0 / BR) * BR;
//#else
    return 0u;
//#endif
}

// DROPOUT: the tile's mask (query rows q0…, keys k0…, of query head bh) is staged by every kernel
// before its scores, a Philox call per eight keys (attention_dropout.wgsl), as bits: word
// r·KEY_WORDS + c / 8, bit c % 8 for query row r and key column c of the tile.
//#if DROPOUT
const KEY_WORDS: u32 = BC / 8u;  // the lowering refuses tiles whose BC is no multiple of 8
var<workgroup> tile_keep: array<u32, BR * KEY_WORDS>;

fn stage_keep(lid: u32, bh: u32, q0: u32, k0: u32) {
    for (var e = lid; e < BR * KEY_WORDS; e += THREADS) {
        let r = e / KEY_WORDS;
        let group = k0 / 8u + e % KEY_WORDS;
        var bits = 0u;
        if (q0 + r < SQ && group < KEY_GROUPS) {
            bits = keep_bits(bh * SQ + q0 + r, group);
        }
        tile_keep[e] = bits;
    }
}

// The factor of the staged tile's weight of query row r and key column c: 0 or 1/(1 − p).
fn kept(r: u32, c: u32) -> f32 {
    return select(0.0, DROP_SCALE, ((tile_keep[r * KEY_WORDS + c / 8u] >> (c % 8u)) & 1u) != 0u);
}
//#else
fn stage_keep(lid: u32, bh: u32, q0: u32, k0: u32) {
}

fn kept(r: u32, c: u32) -> f32 {
    return 1.0;
}
//#endif

//#if FORWARD
//#else
var<workgroup> row_lse: array<f32, BR>;
var<workgroup> row_delta: array<f32, BR>;

// The lse and Dᵢ of row r of the query tile from q0 of head bh (zeros past the sequence).
fn query_rows(r: u32, bh: u32, q0: u32) -> vec2<f32> {
    let i = min(q0 + r, SQ - 1u);
    let inside = q0 + r < SQ;
    return vec2<f32>(select(0.0, lse[bh * SQ + i], inside), select(0.0, delta[bh * SQ + i], inside));
}

// The staged query rows' lse and Dᵢ (the backward kernels; after the barrier that frees the
// previous tile's readers). With ROWS_AHEAD, dK/dV loads each tile's rows into a register of
// threads 0 … BR - 1 while the previous tile is computed (`query_rows`) and stores them with its
// streamed tiles: no barrier and no load wait of their own in each step of its walk.
fn stage_rows(lid: u32, bh: u32, q0: u32) {
    for (var r = lid; r < BR; r += THREADS) {
        let rows = query_rows(r, bh, q0);
        row_lse[r] = rows.x;
        row_delta[r] = rows.y;
    }
}
//#endif

{{VEC4}}

//#if FORWARD
var<workgroup> tile_q: array<vec4<f32>, BR * DS>;
var<workgroup> tile_kv: array<vec4<f32>, BC * DS>;  // K for the scores, then V over it
var<workgroup> tile_s: array<f32, BR * (BC + 1u)>;   // scores, then P
var<workgroup> row_m: array<f32, BR>;
var<workgroup> row_l: array<f32, BR>;
var<workgroup> row_scale: array<f32, BR>;  // exp(m_old − m_new) of the current key tile
//#if ROW_LANES
const LANES: u32 = THREADS / BR;  // threads a row in the softmax fold
var<workgroup> lane_max: array<f32, THREADS>;
var<workgroup> lane_sum: array<f32, THREADS>;
//#endif

@compute @workgroup_size(THREADS)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tile = wid.x + wid.y * GRID_X;
    if (tile >= TILES) {
        return;
    }
    let bh = tile_head(tile);
    let q0 = (SEQ_TILES - 1u - tile_rank(tile)) * BR;  // the longest causal tiles start first
    let b = bh / H;
    let q_base = q_at(b, bh % H, 0u);
    let kv_base = kv_at(b, (bh % H) / GROUP, 0u);
    {{STAGE_Q}}
    for (var r = lid; r < BR; r += THREADS) {
        row_m[r] = LOWEST;
        row_l[r] = 0.0;
    }
    {{O_DECLARE}}
    let stop = key_stop(q0);
    {{KV_DECLARE}}
    for (var k0 = 0u; k0 < stop; k0 += BC) {
        workgroupBarrier();  // the previous tile's readers are done (first time: Q is staged)
        stage_keep(lid, bh, q0, k0);
        {{STORE_K}}
        workgroupBarrier();
        {{SCORES}}
        workgroupBarrier();
        {{STORE_V}}
        let next_k0 = k0 + BC;
        if (next_k0 < stop) {  // its loads wait in registers while this tile is computed
            {{KV_NEXT}}
        }
//#if ROW_LANES
        // LANES threads a row, lane l folding columns l, l + LANES, …: the tile's max of the row
        // and, after P = exp(S − m_new), its sum, each combined over the lanes in workgroup memory.
        {
            let r = lid / LANES;
            let lane = lid % LANES;
            let base = r * (BC + 1u);
            var peak = LOWEST;
            for (var j = lane; j < BC; j += LANES) {
                peak = max(peak, tile_s[base + j]);
            }
            lane_max[lid] = peak;
            workgroupBarrier();
            peak = row_m[r];
            for (var l = 0u; l < LANES; l++) {
                peak = max(peak, lane_max[r * LANES + l]);
            }
            var sum = 0.0;
            for (var j = lane; j < BC; j += LANES) {
                let p = exp(tile_s[base + j] - peak);
                tile_s[base + j] = p * kept(r, j);  // the sum is of the undropped weights
                sum += p;
            }
            lane_sum[lid] = sum;
            workgroupBarrier();
            if (lane == 0u) {
                var total = 0.0;
                for (var l = 0u; l < LANES; l++) {
                    total += lane_sum[r * LANES + l];
                }
                let alpha = exp(row_m[r] - peak);
                row_scale[r] = alpha;
                row_l[r] = row_l[r] * alpha + total;
                row_m[r] = peak;
            }
        }
//#else
        // A thread per row: fold the tile into the running max and sum; P = exp(S − m_new).
        for (var r = lid; r < BR; r += THREADS) {
            let base = r * (BC + 1u);
            var peak = row_m[r];
            for (var j = 0u; j < BC; j++) {
                peak = max(peak, tile_s[base + j]);
            }
            var sum = 0.0;
            for (var j = 0u; j < BC; j++) {
                let p = exp(tile_s[base + j] - peak);
                tile_s[base + j] = p * kept(r, j);  // the sum is of the undropped weights
                sum += p;
            }
            let alpha = exp(row_m[r] - peak);
            row_scale[r] = alpha;
            row_l[r] = row_l[r] * alpha + sum;
            row_m[r] = peak;
        }
//#endif
        workgroupBarrier();
        let count = min(BC, stop - k0);
        {{O_UPDATE}}
    }
    workgroupBarrier();
    {{O_STORE}}
    for (var r = lid; r < BR; r += THREADS) {
        if (q0 + r < SQ) {
            out_lse[bh * SQ + q0 + r] = row_m[r] + log(row_l[r]);
        }
    }
}
//#endif

//#if GRAD_Q
var<workgroup> tile_q: array<vec4<f32>, BR * DS>;
var<workgroup> tile_do: array<vec4<f32>, BR * DS>;
var<workgroup> tile_k: array<vec4<f32>, BC * DS>;
var<workgroup> tile_v: array<vec4<f32>, BC * DS>;
var<workgroup> tile_s: array<f32, BR * (BC + 1u)>;  // dS

@compute @workgroup_size(THREADS)
fn attention_grad_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tile = wid.x + wid.y * GRID_X;
    if (tile >= TILES) {
        return;
    }
    let bh = tile_head(tile);
    let q0 = (SEQ_TILES - 1u - tile_rank(tile)) * BR;
    let b = bh / H;
    let q_base = q_at(b, bh % H, 0u);
    let kv_base = kv_at(b, (bh % H) / GROUP, 0u);
    {{STAGE_QDO}}
    workgroupBarrier();
    stage_rows(lid, bh, q0);
    {{DQ_DECLARE}}
    let stop = key_stop(q0);
    {{PREFETCH_DECLARE}}
    for (var k0 = 0u; k0 < stop; k0 += BC) {
        workgroupBarrier();  // the previous tile's readers are done
        stage_keep(lid, bh, q0, k0);
        {{PREFETCH_STORE}}
        let next_k0 = k0 + BC;
        if (next_k0 < stop) {  // its loads wait in registers while this tile is computed
            {{PREFETCH_NEXT}}
        }
        workgroupBarrier();
        {{SCORES}}
        workgroupBarrier();
        let count = min(BC, stop - k0);
        {{DQ_UPDATE}}
    }
    {{DQ_STORE}}
}
//#endif

//#if GRAD_KV
var<workgroup> tile_k: array<vec4<f32>, BC * DS>;
var<workgroup> tile_v: array<vec4<f32>, BC * DS>;
var<workgroup> tile_q: array<vec4<f32>, BR * DS>;
var<workgroup> tile_do: array<vec4<f32>, BR * DS>;
var<workgroup> tile_p: array<f32, BC * (BR + 1u)>;   // Pᵀ: [key][query]
var<workgroup> tile_ds: array<f32, BC * (BR + 1u)>;  // dSᵀ

@compute @workgroup_size(THREADS)
fn attention_grad_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tile = wid.x + wid.y * GRID_X;
    if (tile >= TILES) {
        return;
    }
    let bhk = tile_head(tile);  // (b, output head): a KV head, or with PER_QUERY_HEAD a query head
    let k0 = tile_rank(tile) * BC;  // causal: the first key tiles see the most queries, and start first
//#if PER_QUERY_HEAD
    let b = bhk / H;
    let kvh = (bhk % H) / GROUP;
    let g_first = (bhk % H) % GROUP;  // this query head alone: its part of the group's sum
    let g_end = g_first + 1u;
    let out_base = bhk * SKV * D;  // dK, dV [B, H, SKV, D]
//#else
    let b = bhk / HKV;
    let kvh = bhk % HKV;
    let g_first = 0u;
    let g_end = GROUP;
    let out_base = kv_at(b, kvh, 0u);
//#endif
    let kv_base = kv_at(b, kvh, 0u);
    {{STAGE_KV}}
    {{DKV_DECLARE}}
    // The walk: every query tile that sees the key tile, of each query head in turn.
    let first_q0 = query_start(k0);
    let walk = Q_TILES - min(first_q0 / BR, Q_TILES);  // none where every query is before the key tile
    let steps = (g_end - g_first) * walk;
    let first_base = (b * H + kvh * GROUP + g_first) * SQ * D;
    {{DS_ZEROS}}
    {{PREFETCH_DECLARE}}
//#if ROWS_AHEAD
    var rows_ahead = vec2<f32>(0.0);
    if (lid < BR) {
        rows_ahead = query_rows(lid, b * H + kvh * GROUP + g_first, first_q0);
    }
//#endif
    for (var step = 0u; step < steps; step++) {
        let bh = b * H + kvh * GROUP + g_first + step / walk;
        let q0 = first_q0 + (step % walk) * BR;
        let q_base = bh * SQ * D;
        workgroupBarrier();  // the previous tile's readers are done (first time: K, V are staged)
        stage_keep(lid, bh, q0, k0);
        {{PREFETCH_STORE}}
//#if ROWS_AHEAD
        if (lid < BR) {
            row_lse[lid] = rows_ahead.x;
            row_delta[lid] = rows_ahead.y;
        }
//#endif
        if (step + 1u < steps) {  // its loads wait in registers while this tile is computed
            let next_q0 = first_q0 + ((step + 1u) % walk) * BR;
            let next_bh = b * H + kvh * GROUP + g_first + (step + 1u) / walk;
            let next_base = next_bh * SQ * D;
            {{PREFETCH_NEXT}}
//#if ROWS_AHEAD
            if (lid < BR) {
                rows_ahead = query_rows(lid, next_bh, next_q0);
            }
//#endif
        }
        workgroupBarrier();
//#if ROWS_AHEAD
//#else
        stage_rows(lid, bh, q0);
        workgroupBarrier();
//#endif
        {{SCORES}}
        workgroupBarrier();
        let count = min(BR, SQ - q0);
        {{DKV_UPDATE}}
    }
    {{DKV_STORE}}
}
//#endif
