"""Device mode on the GPU: each kernel (small_groups, cutlass_sm90 where built, portable) against
float64, clamping of bad sizes, a 26-layer decode scan against sync mode, the default mode.
Skipped without a GPU. tools/gpu_check.sh runs them with TE_ASYNC_POISON_OUTPUTS=1, so outputs
start as NaN and any element a kernel leaves unwritten fails the comparison.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from te_async import plan
from helpers import (FORMS, TOL, cutlass_runs, device_plan, gemm_operands, mlp_layer_stack, on_gpu, random_kind,
                     small_groups_slices)
from reference import SIZE_KINDS, grouped_gemm_reference, random_group_sizes, rel_error

pytestmark = pytest.mark.gpu

# csrc/device_kernel_choice.h: small_groups takes ragged-m GEMMs of at most SMALL_GROUPS_MAX_ROWS
# rows (512 unless TE_ASYNC_SMALL_GROUPS_MAX_ROWS says otherwise), and where CUTLASS can take the
# shape (16-bit in and out, K and N multiples of 8, on sm_90 with CUTLASS built) at most
# ROWS_PER_GROUP rows per group on average; cutlass_sm90 takes the rest of those shapes; portable
# everything else.
SMALL_GROUPS_MAX_ROWS, ROWS_PER_GROUP = plan.read_settings().small_groups_max_rows, 2
SIXTEEN_BIT = (jnp.bfloat16, jnp.float16)


def device_gemm(lhs, rhs, sizes, ragged, transpose_rhs, out_dtype=None):
    f = jax.jit(lambda a, b, s: te_async.grouped_gemm(a, b, s, ragged=ragged, transpose_rhs=transpose_rhs,
                                                      preferred_element_type=out_dtype, group_sizes_mode="device"))
    return f(on_gpu(lhs), on_gpu(rhs), on_gpu(jnp.asarray(sizes)))


def skip_without_cutlass():
    if not cutlass_runs():
        pytest.skip("CUTLASS sm_90a kernels not built or not a Hopper GPU")


def check(rng, dtype, groups, rows, k, n, ragged, transpose_rhs, kind, expect_kernel=None, out_dtype=None):
    """One device-mode call on random operands against float64; first, that its plan runs
    `expect_kernel` (where given)."""
    sizes = random_group_sizes(rng, groups, rows, kind)
    if expect_kernel is not None:
        got = device_plan(groups, rows, k, n, ragged, transpose_rhs, dtype, out_dtype).kernel
        assert got == expect_kernel, (groups, rows, k, n, ragged, transpose_rhs, dtype, out_dtype)
    lhs, rhs = gemm_operands(rng, dtype, groups, rows, k, n, ragged, transpose_rhs)
    out = device_gemm(lhs, rhs, sizes, ragged, transpose_rhs, out_dtype)
    ref = grouped_gemm_reference(lhs, rhs, sizes, ragged, transpose_rhs)
    err = rel_error(out, ref)
    assert np.all(np.isfinite(np.asarray(out, np.float32))), "unwritten (NaN-poisoned) elements"
    assert err < TOL[out_dtype or dtype], (kind, groups, rows, k, n, err)
    if ragged == "m":
        assert not np.any(np.asarray(out, np.float32)[int(sizes.sum()):])
    else:
        assert not np.any(np.asarray(out, np.float32)[sizes == 0])


def shape_for_kernel(rng, kernel, groups, dtype, ragged):
    """Random rows, K and N that the kernel rule above gives `kernel` on any GPU (cutlass_sm90:
    where it runs at all): K and N mostly not multiples of 8, except for CUTLASS."""
    small_limit = min(SMALL_GROUPS_MAX_ROWS, ROWS_PER_GROUP * groups)  # where CUTLASS could run
    if kernel == "cutlass_sm90":  # aligned, and past small_groups (ragged k never is small_groups)
        k, n = 8 * int(rng.integers(1, 38)), 8 * int(rng.integers(1, 38))
        return int(rng.integers(1 if ragged == "k" else small_limit + 1, 3000)), k, n
    k, n = int(rng.integers(1, 300)), int(rng.integers(1, 300))
    if kernel == "portable":  # past small_groups, and not a shape CUTLASS takes
        rows = int(rng.integers(1 if ragged == "k" else SMALL_GROUPS_MAX_ROWS + 1, 3000))
        cutlass_shape_possible = True
    else:  # small_groups
        rows = int(rng.integers(1, SMALL_GROUPS_MAX_ROWS + 1))
        cutlass_shape_possible = rows > small_limit
    if dtype in SIXTEEN_BIT and cutlass_shape_possible and k % 8 == 0 and n % 8 == 0:
        k += 1  # now not a multiple of 8: no TMA, no CUTLASS
    return rows, k, n


KERNEL_CASES = [
    (kernel, dtype, ragged, transpose_rhs)
    for kernel in ("small_groups", "portable", "cutlass_sm90")
    for dtype in (jnp.bfloat16, jnp.float16, jnp.float32)
    for ragged, transpose_rhs in FORMS
    if not (kernel == "small_groups" and ragged == "k") and not (kernel == "cutlass_sm90" and dtype not in SIXTEEN_BIT)
]


@pytest.mark.parametrize("groups", [1, 8, 64, 128, 256])
@pytest.mark.parametrize("kernel,dtype,ragged,transpose_rhs", KERNEL_CASES)
def test_random_shapes(rng, groups, kernel, dtype, ragged, transpose_rhs):
    """Any shape, any sizes, for each kernel: random shapes built so that the plan must pick
    `kernel` (asserted before the values), so that each kernel is reached by construction."""
    if kernel == "cutlass_sm90":
        skip_without_cutlass()
    rows, k, n = shape_for_kernel(rng, kernel, groups, dtype, ragged)
    check(rng, dtype, groups, rows, k, n, ragged, transpose_rhs, random_kind(rng), expect_kernel=kernel)


@pytest.mark.parametrize("kind", SIZE_KINDS)
@pytest.mark.parametrize("tokens", [1, 3, 8, 16, 32, 64])
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_decode_shapes(rng, kind, tokens, transpose_rhs):
    """DeepSeek-V2-Lite decode, top-6 of 64 experts: small_groups up to 2 rows per expert, then
    (where built) CUTLASS."""
    rows = 6 * tokens
    kernel = "small_groups" if rows <= ROWS_PER_GROUP * 64 or not cutlass_runs() else "cutlass_sm90"
    check(rng, jnp.bfloat16, 64, rows, 2048, 1408, "m", transpose_rhs, kind, expect_kernel=kernel)


@pytest.mark.parametrize("n", [8, 13, 100, 264])
def test_small_groups_kernel_odd_widths(rng, n):
    check(rng, jnp.bfloat16, 16, 77, 67, n, "m", False, "random", expect_kernel="small_groups")


@pytest.mark.parametrize("groups,rows,k,n,dtype,out_dtype", [
    (1, 1, 2048, 576, jnp.bfloat16, jnp.float32), (1, 2, 2816, 2048, jnp.bfloat16, None),
    (4, 10, 2000, 64, jnp.bfloat16, jnp.float32), (3, 7, 1000, 100, jnp.float32, None),
    (2, 9, 1500, 37, jnp.bfloat16, None), (8, 12, 777, 8, jnp.float16, jnp.float32)])
def test_small_groups_split_k(rng, groups, rows, k, n, dtype, out_dtype):
    """Few column tiles and row chunks: K is split over a thread-block cluster (on Hopper), on
    random, skewed and empty groups, rows past the total, unaligned N; the slices are summed in
    order, so repeated runs agree bit for bit."""
    p = device_plan(groups, rows, k, n, "m", False, dtype, out_dtype)
    assert p == plan.DevicePlan("small_groups", "", 0), p
    if float(jax.devices("gpu")[0].compute_capability) >= 9.0:
        assert small_groups_slices(groups, rows, k, n, dtype) > 1
    for kind in ("random", "skewed", "zeros"):
        check(rng, dtype, groups, rows, k, n, "m", False, kind, out_dtype=out_dtype)
    sizes = random_group_sizes(rng, groups, rows, "random")
    lhs, rhs = gemm_operands(rng, dtype, groups, rows, k, n, "m", False)
    first = np.asarray(device_gemm(lhs, rhs, sizes, "m", False, out_dtype), np.float32)
    assert np.array_equal(first, np.asarray(device_gemm(lhs, rhs, sizes, "m", False, out_dtype), np.float32))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("groups", [1, 8, 64, 128, 256])
@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_cutlass_kernel(rng, dtype, groups, ragged, transpose_rhs):
    """Aligned K and N (what TMA needs) and M past the small-groups limit: the Hopper kernel."""
    skip_without_cutlass()
    rows = int(rng.integers(600, 5000))
    check(rng, dtype, groups, rows, 256, 384, ragged, transpose_rhs, random_kind(rng), expect_kernel="cutlass_sm90")


CUTLASS_FORM_CONFIGS = [(form, config) for form in ("m", "mt", "k") for config in plan.cutlass_configs(form)]


@pytest.mark.parametrize("form,config", CUTLASS_FORM_CONFIGS)
def test_cutlass_every_config(rng, monkeypatch, form, config):
    """Each config the heuristic or TE_ASYNC_CUTLASS_CONFIG can pick, on uneven sizes with zeros."""
    skip_without_cutlass()
    ragged, transpose_rhs = ("k", False) if form == "k" else ("m", form == "mt")
    monkeypatch.setenv("TE_ASYNC_CUTLASS_CONFIG", config)  # read when a call is traced: check() jits afresh
    for kind in ("skewed", "zeros", "underfull"):
        rows = int(rng.integers(1500, 4000))
        assert device_plan(24, rows, 256, 384, ragged, transpose_rhs, jnp.bfloat16).label == config
        check(rng, jnp.bfloat16, 24, rows, 256, 384, ragged, transpose_rhs, kind, expect_kernel="cutlass_sm90")


@pytest.mark.parametrize("kind", SIZE_KINDS)
def test_cutlass_kernel_prefill_like(rng, kind):
    skip_without_cutlass()
    check(rng, jnp.bfloat16, 64, 6144, 1024, 1408, "m", False, kind, expect_kernel="cutlass_sm90")


@pytest.mark.parametrize("kind", SIZE_KINDS)
@pytest.mark.parametrize("groups", [1, 7, 64, 255])
def test_cutlass_wgrad_long_k(rng, kind, groups):
    """Ragged k (the weight gradient, out [G, K, N]) with K = 264-1592: several rows of 128- and
    256-row tiles and a partial last one; odd group counts."""
    skip_without_cutlass()
    k = 8 * int(rng.integers(33, 200))
    check(rng, jnp.bfloat16, groups, int(rng.integers(1, 5000)), k, 8 * int(rng.integers(1, 40)), "k", False, kind,
          expect_kernel="cutlass_sm90")


@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_portable_kernel_f32_output(rng, ragged, transpose_rhs):
    check(rng, jnp.bfloat16, 32, 1500, 128, 96, ragged, transpose_rhs, "skewed", expect_kernel="portable",
          out_dtype=jnp.float32)


# (kernel, rows, k, n) that the kernel rule gives each kernel: N = 60 is no CUTLASS shape.
CLAMP_CASES = [("small_groups", 40, 64, 60), ("portable", 1200, 64, 60), ("cutlass_sm90", 1200, 64, 64)]


@pytest.mark.parametrize("kernel,rows,k,n", CLAMP_CASES)
@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_bad_sizes_are_clamped(rng, kernel, rows, k, n, ragged, transpose_rhs):
    """Device mode on the GPU cannot raise from a CUDA graph: a negative size counts as 0 and a
    group that runs past row M is cut there, in every kernel. (tools/gpu_check.sh's sanitize stage
    runs this under memcheck, by -k clamped; test_gpu_size_errors.py also counts such calls.)"""
    if kernel == "small_groups" and ragged == "k":
        pytest.skip("ragged k never runs small_groups")
    if kernel == "cutlass_sm90":
        skip_without_cutlass()
    assert device_plan(5, rows, k, n, ragged, transpose_rhs, jnp.bfloat16).kernel == kernel
    sizes = np.array([rows // 4, -7, rows // 2, 0, rows], np.int32)
    clamped = np.array([rows // 4, 0, rows // 2, 0, rows - rows // 4 - rows // 2], np.int32)
    lhs, rhs = gemm_operands(rng, jnp.bfloat16, 5, rows, k, n, ragged, transpose_rhs)
    out = device_gemm(lhs, rhs, sizes, ragged, transpose_rhs)
    assert rel_error(out, grouped_gemm_reference(lhs, rhs, clamped, ragged, transpose_rhs)) < TOL[jnp.bfloat16]


def test_26_layer_decode_scan_matches_sync(rng):
    tokens = 4
    sizes, w1, w2, x0 = mlp_layer_stack(rng, 26, groups=64, rows=6 * tokens, hidden=256, ffn=128, dtype=jnp.bfloat16)

    def run(mode):
        def layer(x, inputs):
            w1_l, w2_l, gs = inputs
            y = te_async.grouped_mlp(x, gs, w1_l, w2_l, group_sizes_mode=mode)  # rmsnorm keeps 26 layers finite
            return (x + y).astype(x.dtype), None

        f = jax.jit(lambda x, a, b, s: jax.lax.scan(layer, x, (a, b, s))[0])
        return f(on_gpu(x0), on_gpu(w1), on_gpu(w2), on_gpu(jnp.asarray(sizes)))

    before = te_async.host_size_stats(0)
    device = run("device")
    after = te_async.host_size_stats(0)
    assert after == before, "device mode touched the host-size machinery"
    err = rel_error(device, np.asarray(run("sync"), np.float64))
    assert err < 2e-2, err


def test_default_mode_is_device_where_a_fast_kernel_exists():
    def lowered(rows):
        lhs, rhs, gs = jnp.ones((rows, 256), jnp.bfloat16), jnp.ones((64, 256, 512), jnp.bfloat16), jnp.zeros(64, jnp.int32)
        return jax.jit(te_async.grouped_gemm).lower(on_gpu(lhs), on_gpu(rhs), on_gpu(gs)).as_text()

    assert "te_async_grouped_gemm_device" in lowered(384)  # decode: small_groups
    large = device_plan(64, 4096, 256, 512, "m", False, jnp.bfloat16).kernel
    expected = "te_async_grouped_gemm_device" if large != "portable" else "te_async_copy_group_sizes"
    assert expected in lowered(4096), large
