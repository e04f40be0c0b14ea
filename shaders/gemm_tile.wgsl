// gemm_tile.wgsl: a snippet, not a kernel. Included (`//#include gemm_tile`) at the top of the
// entry point of the matmul kernels (matmul.wgsl, matmul_tensor.wgsl): which (row tile, batch,
// part of K) triple this workgroup computes, numbered t = y + z · GRID_Y as matmul.wgsl's header
// says, and where it starts. A workgroup past the triples returns (uniform: the whole workgroup).
// Needs, in scope: wid (the workgroup id). Defines: part, t, kbegin, m0, klimit (the end of its K
// loop: its part's end, or `visible_k` of a causal product's row tile; from the workgroup id
// alone, so uniform for the loop's barriers), kend (= klimit, for the loads), bat, obat (the
// output matrix: part s's come after s - 1's), n0, a_base, b_base.
// Placeholders: A_BATCH_STRIDE, B_BATCH_STRIDE (and matmul_common.wgsl's constants).
    let tk = wid.y + wid.z * GRID_Y;
    if (tk >= TILES * SPLITS) {
        return;
    }
    let part = tk / TILES;
    let t = tk % TILES;
    let kbegin = part * K_PART;
    let m0 = (t % TILES_M) * BM;
    let klimit = min(min(K, kbegin + K_PART), visible_k(m0));
    kend = klimit;
    let bat = t / TILES_M;
    let obat = part * (TILES / TILES_M) + bat;
    let n0 = wid.x * BN;
    let a_base = bat * {{A_BATCH_STRIDE}};
    let b_base = bat * {{B_BATCH_STRIDE}};
