"""grouped_gemm and copy_group_sizes on the default backend (the CPU in CI) against float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from helpers import FORMS, TOL, gemm_layer_stack, gemm_operands
from reference import SIZE_KINDS, grouped_gemm_reference, random_group_sizes, rel_error


@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
@pytest.mark.parametrize("kind", SIZE_KINDS)
@pytest.mark.parametrize("mode", te_async.GROUP_SIZES_MODES)
def test_forms_match_float64(rng, ragged, transpose_rhs, kind, mode):
    groups, rows, k, n = int(rng.integers(1, 9)), int(rng.integers(1, 70)), int(rng.integers(1, 40)), int(rng.integers(1, 40))
    sizes = random_group_sizes(rng, groups, rows, kind)
    lhs, rhs = gemm_operands(rng, jnp.float32, groups, rows, k, n, ragged, transpose_rhs)
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
    lhs, rhs = gemm_operands(rng, dtype, 5, 53, 24, 40, "m", False)
    out = te_async.grouped_gemm(lhs, rhs, jnp.asarray(sizes), preferred_element_type=jnp.float32 if out_f32 else None)
    assert out.dtype == (jnp.float32 if out_f32 else dtype)
    assert rel_error(out, grouped_gemm_reference(lhs, rhs, sizes)) < (1e-6 if out_f32 else TOL[dtype])


def test_jit_and_handle_reused_by_two_gemms(rng):
    sizes = random_group_sizes(rng, 6, 45, "skewed")
    x, w1 = gemm_operands(rng, jnp.float32, 6, 45, 16, 32, "m", False)
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
    layers = 7
    sizes, w, x0 = gemm_layer_stack(rng, layers, groups=5, rows=37, d=12)

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
@pytest.mark.parametrize("mode", ["sync", "async"])  # on the default backend: the CUDA handler on a GPU machine
def test_bad_size_values_raise_from_the_handler(sizes, match, mode):
    """Device mode: test_bad_sizes.py (raises on the CPU), test_gpu_size_errors.py (clamps on the GPU)."""
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


def test_too_many_groups():
    g = te_async.MAX_GROUPS + 1
    with pytest.raises(ValueError, match="too many groups"):
        te_async.copy_group_sizes(jnp.zeros((g,), jnp.int32))
    with pytest.raises(ValueError, match="too many groups"):
        te_async.grouped_gemm(jnp.ones((4, 2)), jnp.ones((g, 2, 2)), jnp.zeros((g,), jnp.int32))


@pytest.mark.parametrize("name", ["keep_group_sizes", "reuse_group_sizes"])
def test_keep_and_reuse_take_a_handle_and_give_its_sizes(name):
    call = te_async.reuse_group_sizes if name == "reuse_group_sizes" else (
        lambda handle: te_async.keep_group_sizes(handle, jnp.ones((4, 2))))
    sizes = jnp.array([3, 0, 5], jnp.int32)
    out = jax.jit(lambda s: call(te_async.copy_group_sizes(s)))(sizes)
    assert isinstance(out, te_async.HostGroupSizes)
    np.testing.assert_array_equal(out.device_sizes, sizes)
    with pytest.raises(TypeError, match=f"{name} takes a handle from copy_group_sizes, got ArrayImpl"):
        call(sizes)
    with pytest.raises(TypeError, match="int32"):
        call(te_async.HostGroupSizes(jnp.zeros((3,), jnp.float32)))
    with pytest.raises(ValueError, match="too many groups"):
        call(te_async.HostGroupSizes(jnp.zeros((te_async.MAX_GROUPS + 1,), jnp.int32)))


def test_keep_takes_the_forward_input_as_an_array():
    handle = te_async.copy_group_sizes(jnp.array([3, 0, 5], jnp.int32))
    with pytest.raises(TypeError, match="keep_group_sizes takes the forward's input as an array, got list"):
        te_async.keep_group_sizes(handle, [1.0, 2.0])
    assert te_async.keep_group_sizes(None, jnp.ones(2)) is None


def test_two_keeps_of_one_handle_stay_two():
    """Each keep serves one backward, so XLA must not merge two keeps of one copy and one input."""
    def f(s, x):
        handle = te_async.copy_group_sizes(s)
        return te_async.keep_group_sizes(handle, x).device_sizes + te_async.keep_group_sizes(handle, x).device_sizes

    text = jax.jit(f).lower(jnp.array([3, 0, 5], jnp.int32), jnp.ones((8, 2))).compile().as_text()
    assert text.count('custom_call_target="te_async_keep_group_sizes"') == 2


def test_keep_stays_in_each_scan_trip():
    """Layers that share one copy each keep it: JAX's scan hoists a loop-invariant residual out of
    the loop (one keep for all trips, and one reuse), unless the keep reads the trip's input."""
    def f(s, xs):
        handle = te_async.copy_group_sizes(s)
        step = lambda c, x: (c, te_async.grouped_gemm(x, jnp.ones((3, 2, 2), jnp.float32), s, group_sizes_mode="async",
                                                      host_group_sizes=handle).sum())
        return jax.grad(lambda xs: jax.lax.scan(step, 0.0, xs)[1].sum())(xs)

    text = jax.jit(f).lower(jnp.array([3, 0, 5], jnp.int32), jnp.ones((4, 8, 2), jnp.float32)).as_text()
    loop = text[text.index("stablehlo.while"):]
    assert loop.count("te_async_keep_group_sizes") == 1 and text.count("te_async_keep_group_sizes") == 1


def test_handle_with_wrong_group_count():
    handle = te_async.copy_group_sizes(jnp.array([1, 2], jnp.int32))
    with pytest.raises(ValueError, match="holds 2 groups"):
        _gemm_call(host_group_sizes=handle)()
    with pytest.raises(ValueError, match="only used in async"):
        _gemm_call(host_group_sizes=handle, group_sizes_mode="sync")()
