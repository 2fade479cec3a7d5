"""Lane-level emulation of token_ffn.cu's MmaRowSums (token_moe_mma.patch) in numpy, with mma.sync
m16n8k16 taken from the PTX ISA's fragment layouts, to check the kernel's index mapping on the CPU:
sum_r coef(s)[r] * w[r, column(c) + j] for random shapes (partial tiles, partial k-steps, 2-8 entries)."""
import numpy as np

WARPS, TILE, KSTEPS, VEC = 8, 8, 2, 8


def mma(c, a, b):
    """c [32][4] += A B, a [32][4] pairs, b [32][2] pairs, in the PTX m16n8k16 lane layouts."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i, (r, k) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
            A[r, k], A[r, k + 1] = a[lane][i]
        for i, k in enumerate([2 * t, 2 * t + 8]):
            B[k, g], B[k + 1, g] = b[lane][i]
    D = A @ B
    for lane in range(32):
        g, t = lane // 4, lane % 4
        c[lane][0] += D[g, 2 * t]; c[lane][1] += D[g, 2 * t + 1]
        c[lane][2] += D[g + 8, 2 * t]; c[lane][3] += D[g + 8, 2 * t + 1]


def mma_row_sums(w, rows, n, coef, nvec, column):
    """The kernel's loops, lane by lane; returns out[s][c][j] as its store() calls receive them."""
    tiles = (nvec + TILE - 1) // TILE
    slices = 1 if tiles >= WARPS else WARPS // tiles
    steps = (rows + 15) // 16
    scratch = {}
    out = np.full((n, nvec, VEC), np.nan)
    for warp in range(WARPS):
        for job in range(warp, tiles * slices, WARPS):
            tile, sl = job % tiles, job // tiles
            acc = [[[0.0] * 4 for _ in range(32)] for _ in range(TILE)]
            for s0 in range(sl, steps, slices * KSTEPS):
                for u in range(KSTEPS):
                    step = s0 + u * slices
                    a = [None] * 32; wv = [None] * 32
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        v = tile * TILE + g
                        k = step * 16 + 2 * t
                        on = v < nvec and step < steps
                        def load(r):
                            return w[r, column(v):column(v) + VEC] if on and r < rows else np.zeros(VEC)
                        wv[lane] = [load(k), load(k + 1), load(k + 8), load(k + 9)]
                        def pair(kk):
                            if g >= n or kk >= rows or step >= steps:
                                return (0.0, 0.0)
                            return (coef[g][kk], coef[g][kk + 1])
                        a[lane] = [pair(k), (0.0, 0.0), pair(k + 8), (0.0, 0.0)]
                    for j in range(TILE):
                        b = [[(wv[l][0][j], wv[l][1][j]), (wv[l][2][j], wv[l][3][j])] for l in range(32)]
                        mma(acc[j], a, b)
            for lane in range(32):
                g, t = lane // 4, lane % 4
                for h in range(2):
                    c = tile * TILE + 2 * t + h
                    vals = [acc[j][lane][h] for j in range(VEC)]
                    if g >= n or c >= nvec:
                        continue
                    if slices == 1:
                        out[g, c] = vals
                    else:
                        scratch[(sl, g, c)] = vals
    if slices > 1:
        for e in range(n):
            for c in range(nvec):
                out[e, c] = sum(np.array(scratch[(sl, e, c)]) for sl in range(slices))
    return out


def check(rows, nvec, n, fc1, rng):
    half = nvec // 2
    ffn = half * VEC + 24
    u0 = 16
    if fc1:  # columns: gate u0 + c*8, linear ffn + u0 + (c - half)*8 of a [rows, 2 ffn] weight
        w = rng.standard_normal((rows, 2 * ffn))
        column = lambda c: u0 + (c * VEC if c < half else ffn + (c - half) * VEC)
    else:
        w = rng.standard_normal((rows, nvec * VEC))
        column = lambda c: c * VEC
    coef = rng.standard_normal((n, rows))
    got = mma_row_sums(w, rows, n, coef, nvec, column)
    want = np.array([[coef[s] @ w[:, column(c):column(c) + VEC] for c in range(nvec)] for s in range(n)])
    err = np.abs(got - want).max()
    assert np.isfinite(got).all() and err < 1e-9, (rows, nvec, n, fc1, err)
    return err


rng = np.random.default_rng(0)
# The last eight: the models' plans (H = 2048; fc1 of 80, 64, 40 and 32 units; fc2 over H of 80, 16, 32 and 40 rows),
# test_kernels_several_tokens_at_model_plans' shapes.
for rows, nvec, n, fc1 in [(64, 20, 8, True), (40, 10, 3, True), (264, 6, 2, True), (48, 34, 5, False),
                           (80, 257, 8, False), (24, 2, 7, True), (72, 12, 4, True),
                           (2048, 20, 6, True), (2048, 16, 8, True), (2048, 10, 5, True), (2048, 8, 2, True),
                           (80, 256, 8, False), (16, 256, 3, False), (32, 256, 7, False), (40, 256, 4, False)]:
    print(rows, nvec, n, "fc1" if fc1 else "fc2", "max error", check(rows, nvec, n, fc1, rng))
