// gemm_tile.wgsl: a snippet, not a kernel. Included (`//#include gemm_tile`) at the top of the
// entry point of the matmul kernel (matmul.wgsl): which (row tile, batch,
// part of K) triple this workgroup computes, numbered t = y + z · GRID_Y as matmul.wgsl's header
// says, and where it starts. A workgroup past the triples returns (uniform: the whole workgroup).
// Needs, in scope: wid (the workgroup id). Defines: part, t, kbegin, m0, klimit (the end of its K
// loop; from the workgroup id alone, so uniform for the loop's barriers), kend (= klimit, for the
// loads), bat, obat (the output matrix: part s's come after s - 1's), n0, a_base, b_base.
// Placeholders: A_BATCH_STRIDE, B_BATCH_STRIDE, CAUSAL_ROWS (and matmul_common.wgsl's constants).
// Flag: CAUSAL, a causal product (fused_matmul's `causal_rows` = CAUSAL_ROWS = P: op(A)[r, k] is
// zero for k > r mod P), whose K loop ends after the tile's last row's nonzero columns, rounded
// up to a whole K tile; a tile of rows that crosses the end of a period reads all of K.
    let tk = wid.y + wid.z * GRID_Y;
    if (tk >= TILES * SPLITS) {
        return;
    }
    let part = tk / TILES;
    let t = tk % TILES;
    let kbegin = part * K_PART;
    let m0 = (t % TILES_M) * BM;
//#if CAUSAL
    let last = min(m0 + BM, M) - 1u;
    let crosses = m0 / {{CAUSAL_ROWS}}u != last / {{CAUSAL_ROWS}}u;
    let visible = select(min(K, (last % {{CAUSAL_ROWS}}u / BK + 1u) * BK), K, crosses);
    let klimit = min(min(K, kbegin + K_PART), visible);
//#else
    let klimit = min(K, kbegin + K_PART);
//#endif
    kend = klimit;
    let bat = t / TILES_M;
    let obat = part * (TILES / TILES_M) + bat;
    let n0 = wid.x * BN;
    let a_base = bat * {{A_BATCH_STRIDE}};
    let b_base = bat * {{B_BATCH_STRIDE}};
