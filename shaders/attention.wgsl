// attention.wgsl: fused attention softmax(q·kᵀ·scale)·v, its row log-sum-exp, and the backward
// kernels dQ, dK, dV that recompute P = exp(q·kᵀ·scale − lse) instead of reading it.
//
// Layout (PyTorch's): q, o, do [B, H, SQ, D]; k, v, dK, dV [B, HKV, SKV, D]; lse [B, H, SQ].
// Query head h reads KV head h / GROUP (GROUP = H / HKV). With CAUSAL, query i sees keys j <= i.
// A simple design: one workgroup of WG threads (a power of two, WG >= D) per output row; a
// thread owns one element d of the row's D-vector, and the other axis (keys, or query rows) is
// walked in tiles of WG, one element per thread, the tile's weights shared in workgroup memory.
//
//   attention (a workgroup per query row (b, h, i)): online softmax over key tiles: a thread
//     scores one key of the tile, the tile max and Σ exp go through `combine`, the running
//     output is rescaled by exp(m_old − m_new) and gains Σ_j p_j·v_j. Writes o = acc / l
//     (ATTENTION) and lse = m + log l (LSE) in the same pass (the op's two results); the scores
//     are never stored.
//   attention_grad_q (a workgroup per query row): Dᵢ = do_i·o_i, then per key tile
//     dS_ij = P_ij·(do_i·v_j − Dᵢ) and dQ_i = scale·Σ_j dS_ij·k_j.
//   attention_grad_kv (a workgroup per key row (b, hk, j)): the query rows of all GROUP heads of
//     KV head hk (GROUP·SQ of them) in tiles; a thread recomputes P and dS for one row r:
//     dV_j = Σ_r P_rj·do_r, dK_j = scale·Σ_r dS_rj·q_r (GRAD_K and GRAD_V: the op's two
//     results, sharing P).
//
// Bindings (group 0, generated from the KernelSpec; all f32, the outputs read_write): q, k and
// v, then out (ATTENTION) and out_lse (LSE); the backward: q, k, v, o, lse, d_o, then out
// (GRAD_Q) or out_k (GRAD_K) and out_v (GRAD_V).
// Grid: ROWS workgroups (B·H·SQ query rows or B·HKV·SKV key rows), folded into (GRID_X, y).
//
// Placeholders: BINDINGS, ROWS, H, HKV, SQ, SKV, D, WG, GRID_X, SCALE; flags CAUSAL, FORWARD
// (attention), ATTENTION, LSE, GRAD_Q, GRAD_KV (attention_grad_kv), GRAD_K, GRAD_V.

{{BINDINGS}}

//#include attention_layout
const WG: u32 = {{WG}}u;

//#include workgroup_combine

var<workgroup> weights: array<f32, WG>;
//#if GRAD_K
var<workgroup> weights2: array<f32, WG>;
//#endif

//#if FORWARD
@compute @workgroup_size(WG)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * GRID_X;
    if (row >= ROWS) {
        return;
    }
    let r = query_row(row);
    let b = r.b;
    let hk = r.hk;
    let qi = r.qi;
    let end = r.end;
    var m = LOWEST;
    var l = 0.0;
    var acc = 0.0;
    for (var t0 = 0u; t0 < end; t0 += WG) {
        let j = t0 + lid;
        var s = LOWEST;
        if (j < end) {
            let kj = kv_at(b, hk, j);
            s = qk(qi, kj) * SCALE;
        }
        let m_new = max(m, combine(s, lid, true));
        let p = select(0.0, exp(s - m_new), j < end);
        weights[lid] = p;
        let alpha = exp(m - m_new);
        l = l * alpha + combine(p, lid, false);  // its barriers also publish `weights`
//#if ATTENTION
        acc *= alpha;
        if (lid < D) {
            let count = min(WG, end - t0);
            for (var jj = 0u; jj < count; jj++) {
                acc += weights[jj] * v[kv_at(b, hk, t0 + jj) + lid];
            }
        }
//#endif
        m = m_new;
        workgroupBarrier();  // `weights` is rewritten by the next tile
    }
//#if ATTENTION
    if (lid < D) {
        out[qi + lid] = acc / l;
    }
//#endif
//#if LSE
    if (lid == 0u) {
        out_lse[row] = m + log(l);
    }
//#endif
}
//#endif
//#if GRAD_Q
@compute @workgroup_size(WG)
fn attention_grad_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * GRID_X;
    if (row >= ROWS) {
        return;
    }
    let r = query_row(row);
    let b = r.b;
    let hk = r.hk;
    let qi = r.qi;
    let end = r.end;
    var part = 0.0;
    if (lid < D) {
        part = d_o[qi + lid] * o[qi + lid];
    }
    let delta = combine(part, lid, false);
    let lse_i = lse[row];
    var acc = 0.0;
    for (var t0 = 0u; t0 < end; t0 += WG) {
        let j = t0 + lid;
        var ds = 0.0;
        if (j < end) {
            let kj = kv_at(b, hk, j);
            var dp = 0.0;
            for (var d = 0u; d < D; d++) {
                dp += d_o[qi + d] * v[kj + d];
            }
            ds = exp(qk(qi, kj) * SCALE - lse_i) * (dp - delta);
        }
        weights[lid] = ds;
        workgroupBarrier();
        if (lid < D) {
            let count = min(WG, end - t0);
            for (var jj = 0u; jj < count; jj++) {
                acc += weights[jj] * k[kv_at(b, hk, t0 + jj) + lid];
            }
        }
        workgroupBarrier();
    }
    if (lid < D) {
        out[qi + lid] = acc * SCALE;
    }
}
//#endif
//#if GRAD_KV
@compute @workgroup_size(WG)
fn attention_grad_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * GRID_X;
    if (row >= ROWS) {
        return;
    }
    let j = row % SKV;
    let bhk = row / SKV;
    let b = bhk / HKV;
    let hk = bhk % HKV;
    let kj = row * D;
    // Query rows r = g·SQ + i of the group's heads h = hk·GROUP + g; causal: only i >= j.
    var first = 0u;
//#if CAUSAL
    first = j;
//#endif
    let per_head = SQ - min(first, SQ);
    let count_rows = GROUP * per_head;
    var acc_k = 0.0;
    var acc_v = 0.0;
    for (var t0 = 0u; t0 < count_rows; t0 += WG) {
        let r = t0 + lid;
        var p = 0.0;
        var ds = 0.0;
        if (r < count_rows) {
            let h = hk * GROUP + r / per_head;
            let i = first + r % per_head;
            let qi = q_at(b, h, i);
            p = exp(qk(qi, kj) * SCALE - lse[(b * H + h) * SQ + i]);
//#if GRAD_K
            var dp = 0.0;
            var delta = 0.0;
            for (var d = 0u; d < D; d++) {
                dp += d_o[qi + d] * v[kj + d];
                delta += d_o[qi + d] * o[qi + d];
            }
            ds = p * (dp - delta);
//#endif
        }
        weights[lid] = p;
//#if GRAD_K
        weights2[lid] = ds;
//#endif
        workgroupBarrier();
        if (lid < D) {
            let count = min(WG, count_rows - t0);
            for (var rr = 0u; rr < count; rr++) {
                let r2 = t0 + rr;
                let qi2 = q_at(b, hk * GROUP + r2 / per_head, first + r2 % per_head);
//#if GRAD_V
                acc_v += weights[rr] * d_o[qi2 + lid];
//#endif
//#if GRAD_K
                acc_k += weights2[rr] * q[qi2 + lid];
//#endif
            }
        }
        workgroupBarrier();
    }
    if (lid < D) {
//#if GRAD_V
        out_v[kj + lid] = acc_v;
//#endif
//#if GRAD_K
        out_k[kj + lid] = acc_k * SCALE;
//#endif
    }
}
//#endif
