// attention_rows.wgsl: the attention kernels of attention.wgsl for CPUs (lavapipe), where a
// workgroup barrier is expensive: a thread per row and no workgroup memory. Same layout,
// bindings and results as attention.wgsl (read its header); only the work is laid out
// differently:
//
//   attention (a thread per query row (b, h, i)): an online softmax over its keys, one at a
//     time, the running output (D values) in a private array; writes o and the row's lse.
//   attention_grad_q (a thread per query row): with Dᵢ = do_i·o_i (the operand delta), over its keys
//     dS_ij = P_ij·(do_i·v_j − Dᵢ), P_ij = exp(q_i·k_j·scale − lse_i), dQ_i = scale·Σ_j dS_ij·k_j.
//   attention_grad_kv (a thread per key row (b, hk, j)): over the query rows of the GROUP heads
//     of KV head hk that see key j, dV_j = Σ_r P_rj·do_r and dK_j = scale·Σ_r dS_rj·q_r.
//
// Grid: ceil(ROWS / 64) workgroups of 64 threads, folded into (GRID_X, y).
// With DROPOUT each weight is dropped where it is used (attention_dropout.wgsl `drop_factor`, a
// Philox call per weight here), as attention.wgsl's header says.
// Placeholders: BINDINGS, attention_layout's and attention_dropout's; flags CAUSAL, DROPOUT, FORWARD, GRAD_Q,
// GRAD_KV.

{{BINDINGS}}

//#include attention_layout
//#include attention_dropout

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

// The first query that sees key j: 0, or j when causal.
fn query_start(j: u32) -> u32 {
//#if CAUSAL
    return j;
//#else
    return 0u;
//#endif
}

fn row_index(wid: vec3<u32>, lid: u32) -> u32 {
    return (wid.x + wid.y * GRID_X) * 64u + lid;
}

//#if FORWARD
@compute @workgroup_size(64)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_index(wid, lid);
    if (row >= ROWS) {
        return;
    }
    let r = query_row(row);
    let qi = r.qi;
    var m = LOWEST;
    var l = 0.0;
    var acc: array<f32, D>;
    for (var j = 0u; j < r.end; j++) {
        let kj = kv_at(r.b, r.hk, j);
        let s = qk(qi, kj) * SCALE;
        let m_new = max(m, s);
        let alpha = exp(m - m_new);
        let p = exp(s - m_new);
        l = l * alpha + p;  // the undropped weights' sum
        let w = p * drop_factor(row, j);
        for (var d = 0u; d < D; d++) {
            acc[d] = acc[d] * alpha + w * v[kj + d];
        }
        m = m_new;
    }
    for (var d = 0u; d < D; d++) {
        out[qi + d] = acc[d] / l;
    }
    out_lse[row] = m + log(l);
}
//#endif

//#if GRAD_Q
@compute @workgroup_size(64)
fn attention_grad_q(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_index(wid, lid);
    if (row >= ROWS) {
        return;
    }
    let r = query_row(row);
    let qi = r.qi;
    let di = delta[row];
    let lse_i = lse[row];
    var acc: array<f32, D>;
    for (var j = 0u; j < r.end; j++) {
        let kj = kv_at(r.b, r.hk, j);
        let p = exp(qk(qi, kj) * SCALE - lse_i);
        var dp = 0.0;
        for (var d = 0u; d < D; d++) {
            dp += d_o[qi + d] * v[kj + d];
        }
        let ds = p * (dp * drop_factor(row, j) - di);
        for (var d = 0u; d < D; d++) {
            acc[d] += ds * k[kj + d];
        }
    }
    for (var d = 0u; d < D; d++) {
        out[qi + d] = SCALE * acc[d];
    }
}
//#endif

//#if GRAD_KV
@compute @workgroup_size(64)
fn attention_grad_kv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = row_index(wid, lid);
    if (row >= ROWS) {
        return;
    }
    let bhk = row / SKV;
    let b = bhk / HKV;
    let hk = bhk % HKV;
    let j = row % SKV;
    let kj = row * D;
    var dk: array<f32, D>;
    var dv: array<f32, D>;
    for (var g = 0u; g < GROUP; g++) {
        let h = hk * GROUP + g;
        for (var i = query_start(j); i < SQ; i++) {
            let query = (b * H + h) * SQ + i;
            let qi = query * D;
            let p = exp(qk(qi, kj) * SCALE - lse[query]);
            var dp = 0.0;
            for (var d = 0u; d < D; d++) {
                dp += d_o[qi + d] * v[kj + d];
            }
            let f = drop_factor(query, j);
            let ds = p * (dp * f - delta[query]);
            for (var d = 0u; d < D; d++) {
                dv[d] += p * f * d_o[qi + d];
                dk[d] += ds * q[qi + d];
            }
        }
    }
    for (var d = 0u; d < D; d++) {
        out_k[kj + d] = SCALE * dk[d];
        out_v[kj + d] = dv[d];
    }
}
//#endif
