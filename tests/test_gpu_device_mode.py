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
from te_async import _ffi
from reference import SIZE_KINDS, grouped_gemm_reference, random_group_sizes, rel_error

pytestmark = pytest.mark.gpu

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 8e-3, jnp.float16: 1e-3}
FORMS = [("m", False), ("m", True), ("k", False)]


def on_gpu(a):
    return jax.device_put(a, jax.devices("gpu")[0])


def device_gemm(lhs, rhs, sizes, ragged, transpose_rhs, out_dtype=None):
    f = jax.jit(lambda a, b, s: te_async.grouped_gemm(a, b, s, ragged=ragged, transpose_rhs=transpose_rhs,
                                                      preferred_element_type=out_dtype, group_sizes_mode="device"))
    return f(on_gpu(lhs), on_gpu(rhs), on_gpu(jnp.asarray(sizes)))


def operands(rng, dtype, groups, rows, k, n, ragged, transpose_rhs):
    lhs = jnp.asarray(rng.standard_normal((rows, k)), dtype)
    if ragged == "k":
        return lhs, jnp.asarray(rng.standard_normal((rows, n)), dtype)
    return lhs, jnp.asarray(rng.standard_normal((groups, n, k) if transpose_rhs else (groups, k, n)), dtype)


def kernel_for(groups, rows, k, n, ragged, transpose_rhs, dtype, out_dtype=None):
    name = jnp.dtype(dtype).name
    kernel = _ffi.device_plan(groups, rows, k, n, ragged == "k", transpose_rhs, name, jnp.dtype(out_dtype or dtype).name)[0]
    return "cutlass_sm90" if kernel.startswith("cutlass_sm90") else kernel


def check(rng, dtype, groups, rows, k, n, ragged, transpose_rhs, kind, expect_kernel=None, out_dtype=None):
    sizes = random_group_sizes(rng, groups, rows, kind)
    if expect_kernel is not None:
        assert kernel_for(groups, rows, k, n, ragged, transpose_rhs, dtype, out_dtype) == expect_kernel
    lhs, rhs = operands(rng, dtype, groups, rows, k, n, ragged, transpose_rhs)
    out = device_gemm(lhs, rhs, sizes, ragged, transpose_rhs, out_dtype)
    ref = grouped_gemm_reference(lhs, rhs, sizes, ragged, transpose_rhs)
    err = rel_error(out, ref)
    assert np.all(np.isfinite(np.asarray(out, np.float32))), "unwritten (NaN-poisoned) elements"
    assert err < TOL[out_dtype or dtype], (kind, groups, rows, k, n, err)
    if ragged == "m":
        assert not np.any(np.asarray(out, np.float32)[int(sizes.sum()):])
    else:
        assert not np.any(np.asarray(out, np.float32)[sizes == 0])


@pytest.mark.parametrize("groups", [1, 8, 64, 128, 256])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_random_shapes(rng, groups, dtype, ragged, transpose_rhs):
    """Any shape, any sizes: K and N mostly not multiples of 8, so all three kernels are reached."""
    kind = SIZE_KINDS[int(rng.integers(len(SIZE_KINDS)))]
    rows, k, n = int(rng.integers(1, 3000)), int(rng.integers(1, 300)), int(rng.integers(1, 300))
    check(rng, dtype, groups, rows, k, n, ragged, transpose_rhs, kind)


@pytest.mark.parametrize("kind", SIZE_KINDS)
@pytest.mark.parametrize("tokens", [1, 3, 8, 16, 32, 64])
@pytest.mark.parametrize("transpose_rhs", [False, True])
def test_decode_shapes(rng, kind, tokens, transpose_rhs):
    """DeepSeek-V2-Lite decode, top-6 of 64 experts: small_groups up to 2 rows per expert, then
    (where built) CUTLASS."""
    check(rng, jnp.bfloat16, 64, 6 * tokens, 2048, 1408, "m", transpose_rhs, kind)
    if 6 * tokens <= 2 * 64:
        assert kernel_for(64, 6 * tokens, 2048, 1408, "m", transpose_rhs, jnp.bfloat16) == "small_groups"


@pytest.mark.parametrize("n", [8, 13, 100, 264])
def test_small_groups_kernel_odd_widths(rng, n):
    check(rng, jnp.bfloat16, 16, 77, 67, n, "m", False, "random", expect_kernel="small_groups")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("groups", [1, 8, 64, 128, 256])
@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_cutlass_kernel(rng, dtype, groups, ragged, transpose_rhs):
    """Aligned K and N (what TMA needs) and M past the small-groups limit: the Hopper kernel."""
    if kernel_for(groups, 4000, 256, 384, ragged, transpose_rhs, dtype) != "cutlass_sm90":
        pytest.skip("CUTLASS sm_90a kernels not built or not a Hopper GPU")
    kind = SIZE_KINDS[int(rng.integers(len(SIZE_KINDS)))]
    rows = int(rng.integers(600, 5000))
    check(rng, dtype, groups, rows, 256, 384, ragged, transpose_rhs, kind, expect_kernel="cutlass_sm90")


CUTLASS_FORM_CONFIGS = [(form, config) for form in ("m", "mt", "k") for config in _ffi.cutlass_configs(form)]


@pytest.mark.parametrize("form,config", CUTLASS_FORM_CONFIGS)
def test_cutlass_every_config(rng, monkeypatch, form, config):
    """Each config the heuristic or TE_ASYNC_CUTLASS_CONFIG can pick, on uneven sizes with zeros."""
    ragged, transpose_rhs = ("k", False) if form == "k" else ("m", form == "mt")
    monkeypatch.setenv("TE_ASYNC_CUTLASS_CONFIG", config)
    for kind in ("skewed", "zeros", "underfull"):
        check(rng, jnp.bfloat16, 24, int(rng.integers(1500, 4000)), 256, 384, ragged, transpose_rhs, kind,
              expect_kernel="cutlass_sm90")


def test_cutlass_config_typo_raises(rng, monkeypatch):
    """A misspelled TE_ASYNC_CUTLASS_CONFIG raises instead of leaving the heuristic on unnoticed."""
    if kernel_for(8, 1111, 256, 136, "m", False, jnp.bfloat16) != "cutlass_sm90":
        pytest.skip("CUTLASS sm_90a kernels not built or not a Hopper GPU")
    monkeypatch.setenv("TE_ASYNC_CUTLASS_CONFIG", "cutlass_sm90_coop_128x265x64_c1x1")
    _ffi.device_plan.cache_clear()
    with pytest.raises((ValueError, jax.errors.JaxRuntimeError), match="is not a CUTLASS config"):
        check(rng, jnp.bfloat16, 8, 1111, 256, 136, "m", False, "random")


@pytest.mark.parametrize("kind", SIZE_KINDS)
def test_cutlass_kernel_prefill_like(rng, kind):
    if kernel_for(64, 6144, 1024, 1408, "m", False, jnp.bfloat16) != "cutlass_sm90":
        pytest.skip("CUTLASS sm_90a kernels not built or not a Hopper GPU")
    check(rng, jnp.bfloat16, 64, 6144, 1024, 1408, "m", False, kind, expect_kernel="cutlass_sm90")


@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_portable_kernel_f32_output(rng, ragged, transpose_rhs):
    check(rng, jnp.bfloat16, 32, 1500, 128, 96, ragged, transpose_rhs, "skewed", expect_kernel="portable",
          out_dtype=jnp.float32)


@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_bad_sizes_are_clamped(rng, ragged, transpose_rhs):
    for rows, k, n in ((40, 64, 64), (1200, 64, 64)):  # small-groups and large-groups kernels
        sizes = np.array([rows // 4, -7, rows // 2, 0, rows], np.int32)
        clamped = np.array([rows // 4, 0, rows // 2, 0, rows - rows // 4 - rows // 2], np.int32)
        lhs, rhs = operands(rng, jnp.bfloat16, 5, rows, k, n, ragged, transpose_rhs)
        out = device_gemm(lhs, rhs, sizes, ragged, transpose_rhs)
        assert rel_error(out, grouped_gemm_reference(lhs, rhs, clamped, ragged, transpose_rhs)) < TOL[jnp.bfloat16]


def test_26_layer_decode_scan_matches_sync(rng):
    layers, groups, tokens, hidden, ffn = 26, 64, 4, 256, 128
    rows = 6 * tokens
    sizes = np.stack([random_group_sizes(rng, groups, rows, SIZE_KINDS[i % len(SIZE_KINDS)]) for i in range(layers)])
    w1 = jnp.asarray(rng.standard_normal((layers, groups, hidden, 2 * ffn)) / np.sqrt(hidden), jnp.bfloat16)
    w2 = jnp.asarray(rng.standard_normal((layers, groups, ffn, hidden)) / np.sqrt(ffn), jnp.bfloat16)
    x0 = jnp.asarray(rng.standard_normal((rows, hidden)), jnp.bfloat16)

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
    large = kernel_for(64, 4096, 256, 512, "m", False, jnp.bfloat16)
    expected = "te_async_grouped_gemm_device" if large != "portable" else "te_async_copy_group_sizes"
    assert expected in lowered(4096), large
