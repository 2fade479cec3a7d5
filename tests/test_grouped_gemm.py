"""grouped_gemm and copy_group_sizes on the default backend (the CPU in CI) against float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from reference import SIZE_KINDS, grouped_gemm_reference, random_group_sizes, rel_error

# Inputs are rounded to their dtype before the reference sees them, so the only error left is
# the accumulation order (f32) or the one rounding of the output (bf16/f16: 2^-8 / 2^-11).
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 8e-3, jnp.float16: 1e-3}


def operands(rng, dtype, groups, rows, k, n, ragged, transpose_rhs):
    lhs = jnp.asarray(rng.standard_normal((rows, k)), dtype)
    if ragged == "k":
        rhs = jnp.asarray(rng.standard_normal((rows, n)), dtype)
    else:
        shape = (groups, n, k) if transpose_rhs else (groups, k, n)
        rhs = jnp.asarray(rng.standard_normal(shape), dtype)
    return lhs, rhs


FORMS = [("m", False), ("m", True), ("k", False)]


@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
@pytest.mark.parametrize("kind", SIZE_KINDS)
@pytest.mark.parametrize("mode", te_async.GROUP_SIZES_MODES)
def test_forms_match_float64(rng, ragged, transpose_rhs, kind, mode):
    groups, rows, k, n = int(rng.integers(1, 9)), int(rng.integers(1, 70)), int(rng.integers(1, 40)), int(rng.integers(1, 40))
    sizes = random_group_sizes(rng, groups, rows, kind)
    lhs, rhs = operands(rng, jnp.float32, groups, rows, k, n, ragged, transpose_rhs)
    out = te_async.grouped_gemm(lhs, rhs, jnp.asarray(sizes), ragged=ragged, transpose_rhs=transpose_rhs, group_sizes_mode=mode)
    ref = grouped_gemm_reference(lhs, rhs, sizes, ragged, transpose_rhs)
    assert out.shape == ref.shape and out.dtype == jnp.float32
    assert rel_error(out, ref) < TOL[jnp.float32]
    if ragged == "m":  # rows past the sum are exactly zero
        assert not np.any(np.asarray(out)[int(sizes.sum()) :])
    else:  # empty groups are exactly zero
        assert not np.any(np.asarray(out)[sizes == 0])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("out_f32", [False, True])
def test_dtypes(rng, dtype, out_f32):
    sizes = random_group_sizes(rng, 5, 53, "random")
    lhs, rhs = operands(rng, dtype, 5, 53, 24, 40, "m", False)
    out = te_async.grouped_gemm(lhs, rhs, jnp.asarray(sizes), preferred_element_type=jnp.float32 if out_f32 else None)
    assert out.dtype == (jnp.float32 if out_f32 else dtype)
    assert rel_error(out, grouped_gemm_reference(lhs, rhs, sizes)) < (1e-6 if out_f32 else TOL[dtype])


def test_jit_and_handle_reused_by_two_gemms(rng):
    sizes = random_group_sizes(rng, 6, 45, "skewed")
    x, w1 = operands(rng, jnp.float32, 6, 45, 16, 32, "m", False)
    w2 = jnp.asarray(rng.standard_normal((6, 32, 16)), jnp.float32)

    @jax.jit
    def two_gemms(x, w1, w2, gs):
        handle = te_async.copy_group_sizes(gs)
        h = te_async.grouped_gemm(x, w1, gs, host_group_sizes=handle)
        return te_async.grouped_gemm(h, w2, gs, host_group_sizes=handle)

    out = two_gemms(x, w1, w2, jnp.asarray(sizes))
    ref = grouped_gemm_reference(grouped_gemm_reference(x, w1, sizes), w2, sizes)
    assert rel_error(out, ref) < 1e-5
    text = two_gemms.lower(x, w1, w2, jnp.asarray(sizes)).as_text()
    assert text.count("te_async_copy_group_sizes") == 1 and text.count("te_async_grouped_gemm") == 2


def test_scan_over_layers_with_different_sizes(rng):
    layers, groups, rows, d = 7, 5, 37, 12
    sizes = np.stack([random_group_sizes(rng, groups, rows, SIZE_KINDS[i % len(SIZE_KINDS)]) for i in range(layers)])
    w = jnp.asarray(rng.standard_normal((layers, groups, d, d)) / np.sqrt(d), jnp.float32)
    x0 = jnp.asarray(rng.standard_normal((rows, d)), jnp.float32)

    def layer(x, inputs):
        w_l, gs = inputs
        return te_async.grouped_gemm(x, w_l, gs, use_async_d2h_group_sizes=True), None

    out, _ = jax.jit(lambda x, w, s: jax.lax.scan(layer, x, (w, s)))(x0, w, jnp.asarray(sizes))
    ref = np.asarray(x0, np.float64)
    for i in range(layers):
        ref = grouped_gemm_reference(ref, w[i], sizes[i])
    assert rel_error(out, ref) < 1e-5


def test_vmap_runs_sequentially(rng):
    sizes = np.stack([random_group_sizes(rng, 4, 20, "random") for _ in range(3)])
    lhs = jnp.asarray(rng.standard_normal((3, 20, 8)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((3, 4, 8, 6)), jnp.float32)
    out = jax.vmap(te_async.grouped_gemm)(lhs, rhs, jnp.asarray(sizes))
    for b in range(3):
        assert rel_error(out[b], grouped_gemm_reference(lhs[b], rhs[b], sizes[b])) < 1e-5


def test_copy_group_sizes_returns_the_sizes(rng):
    sizes = random_group_sizes(rng, 11, 100, "zeros")
    handle = te_async.copy_group_sizes(jnp.asarray(sizes))
    assert isinstance(handle, te_async.HostGroupSizes)
    np.testing.assert_array_equal(handle.device_sizes, sizes)


def _gemm_call(**overrides):
    args = dict(lhs=jnp.ones((10, 4), jnp.float32), rhs=jnp.ones((3, 4, 5), jnp.float32), group_sizes=jnp.array([2, 3, 4], jnp.int32))
    args.update(overrides)
    return lambda: te_async.grouped_gemm(args.pop("lhs"), args.pop("rhs"), args.pop("group_sizes"), **args).block_until_ready()


@pytest.mark.parametrize(
    "overrides,error,match",
    [
        (dict(rhs=jnp.ones((3, 5, 5), jnp.float32)), ValueError, "contracting"),
        (dict(rhs=jnp.ones((2, 4, 5), jnp.float32)), ValueError, "G=3"),
        (dict(lhs=jnp.ones((10, 4), jnp.bfloat16)), TypeError, "share one dtype"),
        (dict(lhs=jnp.ones((10, 4), jnp.int32), rhs=jnp.ones((3, 4, 5), jnp.int32)), TypeError, "dtype"),
        (dict(group_sizes=jnp.array([2.0, 3.0, 4.0], jnp.float32)), TypeError, "int32"),
        (dict(group_sizes=jnp.zeros((3, 1), jnp.int32)), TypeError, r"int32 \[G\]"),
        (dict(ragged="x"), ValueError, "ragged"),
        (dict(ragged="k"), ValueError, "rhs"),
        (dict(preferred_element_type=jnp.float16), TypeError, "preferred_element_type"),
        (dict(group_sizes_mode="fast"), ValueError, "group_sizes_mode"),
        (dict(lhs=jnp.ones((10, 4, 1), jnp.float32)), ValueError, r"\[M, K\]"),
    ],
)
def test_bad_shapes_and_dtypes_raise_before_lowering(overrides, error, match):
    with pytest.raises(error, match=match):
        _gemm_call(**overrides)()


@pytest.mark.parametrize(
    "sizes,match", [([2, -1, 4], "negative group size -1 for group 1"), ([2, 3, 6], r"sum\(group_sizes\) = 11 exceeds the 10 rows")]
)
@pytest.mark.parametrize("mode", ["sync", "async"])  # device mode clamps instead: see below
def test_bad_size_values_raise_from_the_handler(sizes, match, mode):
    with pytest.raises(Exception, match=match):
        _gemm_call(group_sizes=jnp.array(sizes, jnp.int32), group_sizes_mode=mode)()


def test_default_mode_is_device():
    lhs, rhs, gs = jnp.ones((10, 4), jnp.float32), jnp.ones((3, 4, 5), jnp.float32), jnp.array([2, 3, 4], jnp.int32)
    text = jax.jit(te_async.grouped_gemm).lower(lhs, rhs, gs).as_text()
    assert "te_async_grouped_gemm_device" in text and "te_async_copy_group_sizes" not in text


def test_default_mode_needs_a_fast_device_kernel():
    from te_async.group_sizes import resolve_group_sizes_mode

    assert resolve_group_sizes_mode(None, False, None, device_is_fast=lambda: True) == "device"
    assert resolve_group_sizes_mode(None, False, None, device_is_fast=lambda: False) == "async"
    assert resolve_group_sizes_mode(None, True, None, device_is_fast=lambda: True) == "async"
    assert resolve_group_sizes_mode("device", False, None, device_is_fast=lambda: False) == "device"


@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_device_mode_clamps_bad_sizes(rng, ragged, transpose_rhs):
    """Graph-safe kernels cannot raise: a negative size counts as 0, a sum past M is cut at M."""
    groups, rows, k, n = 5, 30, 7, 9
    sizes = np.array([4, -3, 20, 0, 11], np.int32)  # clamped: 4, 0, 20, 0, 6
    lhs, rhs = operands(rng, jnp.float32, groups, rows, k, n, ragged, transpose_rhs)
    out = te_async.grouped_gemm(lhs, rhs, jnp.asarray(sizes), ragged=ragged, transpose_rhs=transpose_rhs, group_sizes_mode="device")
    ref = grouped_gemm_reference(lhs, rhs, np.array([4, 0, 20, 0, 6]), ragged, transpose_rhs)
    assert rel_error(out, ref) < TOL[jnp.float32]


def test_checked_device_mode_raises(tmp_path):
    """TE_ASYNC_CHECK_DEVICE_SIZES=1 turns the clamping into the host modes' errors (read once per
    process, hence the subprocess)."""
    import os
    import subprocess
    import sys

    script = (
        "import jax.numpy as jnp, te_async\n"
        "te_async.grouped_gemm(jnp.ones((10, 4)), jnp.ones((3, 4, 5)), jnp.array([2, -1, 4], jnp.int32), group_sizes_mode='device').block_until_ready()\n"
    )
    env = dict(os.environ, TE_ASYNC_CHECK_DEVICE_SIZES="1", JAX_PLATFORMS="cpu")
    run = subprocess.run([sys.executable, "-P", "-c", script], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode != 0 and "negative group size -1 for group 1" in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize(
    "shape,cc,cutlass,expected",
    [
        (dict(rows=6, k=2048, n=2816), 90, True, "small_groups"),  # decode, T=1, top-6
        (dict(rows=128, k=2048, n=2816), 90, True, "small_groups"),  # 2 rows per group
        (dict(rows=129, k=2048, n=2816), 90, True, "cutlass_sm90"),  # more: tensor cores win
        (dict(rows=384, k=2048, n=2816), 90, True, "cutlass_sm90"),  # DeepSeek-V2-Lite T=64
        (dict(rows=384, k=2048, n=2816), 90, False, "small_groups"),  # ... where only SIMT kernels run
        (dict(rows=512, k=2048, n=2816), 80, True, "small_groups"),
        (dict(rows=513, k=2048, n=2816), 80, True, "portable"),
        (dict(groups=8, rows=16, k=4096, n=28672), 90, True, "small_groups"),  # Mixtral T=8, top-2
        (dict(groups=8, rows=128, k=4096, n=28672), 90, True, "cutlass_sm90"),  # Mixtral T=64
        (dict(rows=300, k=2048, n=2820), 90, True, "small_groups"),  # CUTLASS-ineligible N
        (dict(rows=24576, k=2048, n=2816), 90, True, "cutlass_sm90"),  # prefill
        (dict(rows=24576, k=2048, n=2816), 90, False, "portable"),  # CUTLASS not built
        (dict(rows=24576, k=2048, n=2816), 80, True, "portable"),  # not Hopper
        (dict(rows=24576, k=2048, n=2820), 90, True, "portable"),  # N not a multiple of 8
        (dict(rows=24576, k=2048, n=2816, in_dtype="float32", out_dtype="float32"), 90, True, "portable"),
        (dict(rows=24576, k=2048, n=2816, out_dtype="float32"), 90, True, "portable"),  # f32 output
        (dict(rows=6, k=2048, n=2816, ragged_k=True), 90, True, "cutlass_sm90"),  # wgrad is never small
        (dict(rows=6, k=2048, n=2816, ragged_k=True), 86, True, "portable"),
    ],
)
def test_device_kernel_choice(shape, cc, cutlass, expected):
    args = dict(groups=64, ragged_k=False, transpose_rhs=False, in_dtype="bfloat16", out_dtype="bfloat16")
    args.update(shape)
    assert te_async._ffi.device_kernel_choice(**args, compute_capability=cc, cutlass_built=cutlass) == expected


@pytest.mark.parametrize("value", ["5l2", "-1", "512 rows", ""])
def test_small_groups_rows_env_typo_raises(monkeypatch, value):
    monkeypatch.setenv("TE_ASYNC_SMALL_GROUPS_MAX_ROWS", value)
    with pytest.raises(ValueError, match="TE_ASYNC_SMALL_GROUPS_MAX_ROWS"):
        te_async._ffi.device_kernel_choice(groups=64, rows=6, k=2048, n=2816, ragged_k=False, transpose_rhs=False,
                                           in_dtype="bfloat16", out_dtype="bfloat16", compute_capability=90,
                                           cutlass_built=True)


def test_too_many_groups():
    g = te_async.MAX_GROUPS + 1
    with pytest.raises(ValueError, match="too many groups"):
        te_async.copy_group_sizes(jnp.zeros((g,), jnp.int32))
    with pytest.raises(ValueError, match="too many groups"):
        te_async.grouped_gemm(jnp.ones((4, 2)), jnp.ones((g, 2, 2)), jnp.zeros((g,), jnp.int32))


def test_handle_with_wrong_group_count():
    handle = te_async.copy_group_sizes(jnp.array([1, 2], jnp.int32))
    with pytest.raises(ValueError, match="holds 2 groups"):
        _gemm_call(host_group_sizes=handle)()
    with pytest.raises(ValueError, match="only used in async"):
        _gemm_call(host_group_sizes=handle, group_sizes_mode="sync")()
