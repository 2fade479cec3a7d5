"""te_async.row_norm: RMSNorm and LayerNorm and their gradients against float64 NumPy written from
the formulas (every backend: the plain-JAX path; on the GPU: the CUDA kernels), rows and widths
the kernels treat apart (no rows, one row, more rows than blocks, a last warp that is partly idle,
1024 threads a row), and grouped_mlp's gradients through the kernels at a prefill's row count."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from te_async import row_norm
from te_async.row_norm import normalize
from helpers import mlp_inputs
from reference import mlp_reference, rel_error

EPS = 1e-6


def numpy_norm(x, scale, bias, dy, norm, eps=EPS):
    """(y, dx, dscale, dbias) in float64: the forward and its gradient written out."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    h = x.shape[-1]
    s = np.ones(h) if scale is None else np.asarray(scale, np.float64)
    b = np.zeros(h) if bias is None else np.asarray(bias, np.float64)
    c = x - x.mean(-1, keepdims=True) if norm == "layernorm" else x
    r = 1 / np.sqrt((c * c).mean(-1, keepdims=True) + eps)
    xhat = c * r
    g = dy * s
    dx = r * (g - xhat * (g * xhat).mean(-1, keepdims=True))
    if norm == "layernorm":
        dx -= r * g.mean(-1, keepdims=True)
    rows = lambda a: a.reshape(-1, h).sum(0)
    return xhat * s + b, dx, rows(dy * xhat), rows(dy)


def operands(rng, shape, dtype, with_scale, with_bias):
    h = shape[-1]
    x = jnp.asarray(rng.standard_normal(shape) * 3 + 0.5, dtype)  # an offset, so LayerNorm's mean matters
    dy = jnp.asarray(rng.standard_normal(shape), dtype)
    scale = jnp.asarray(1 + 0.2 * rng.standard_normal(h), jnp.float32) if with_scale else None
    bias = jnp.asarray(0.1 * rng.standard_normal(h), jnp.float32) if with_bias else None
    return x, scale, bias, dy


def ours(x, scale, bias, dy, norm, kernel):
    """(y, dx, dscale, dbias) of one jitted value-and-VJP."""

    def f(x, scale, bias, dy):
        y, vjp = jax.vjp(lambda x_, s_, b_: normalize(x_, s_, b_, norm, EPS, kernel=kernel), x, scale, bias)
        return (y, *vjp(dy))

    return jax.jit(f)(x, scale, bias, dy)


def check(got, want, dtype, rows):
    """Each output within its rounding: the input dtype's half ulp for y and dx, float32 sums for
    the column sums (the reference sees the same rounded inputs)."""
    y, dx, dscale, dbias = got
    y_ref, dx_ref, ds_ref, db_ref = want
    ulp = float(jnp.finfo(dtype).eps)
    for name, out, ref in (("y", y, y_ref), ("dx", dx, dx_ref)):
        assert out.dtype == dtype, name
        err = np.abs(np.asarray(out, np.float64) - ref)
        assert np.all(err <= ulp * np.abs(ref) + 1e-5 * (1 + np.abs(ref).max())), (name, float(err.max()))
    tol = 2e-6 * np.sqrt(max(rows, 1)) * 10
    for name, out, ref in (("dscale", dscale, ds_ref), ("dbias", dbias, db_ref)):
        if out is None:
            continue
        assert out.dtype == jnp.float32, name
        err = np.abs(np.asarray(out, np.float64) - ref)
        assert np.all(err <= tol * (1 + np.abs(ref))), (name, float(err.max()))


@pytest.mark.parametrize("norm,with_scale,with_bias", [("rmsnorm", True, False), ("rmsnorm", False, False),
                                                    ("layernorm", True, True), ("layernorm", True, False),
                                                    ("layernorm", False, False)])
def test_reference_matches_float64(rng, norm, with_scale, with_bias):
    x, scale, bias, dy = operands(rng, (2, 37, 24), jnp.float32, with_scale, with_bias)
    got = ours(x, scale, bias, dy, norm, kernel="xla")
    check(got, numpy_norm(x, scale, bias, dy, norm), jnp.float32, 74)
    assert (got[2] is None) == (scale is None) and (got[3] is None) == (bias is None)


def test_arguments_are_checked():
    x = jnp.ones((4, 8), jnp.float32)
    with pytest.raises(ValueError, match="kernel must be one of"):
        normalize(x, None, None, "rmsnorm", EPS, kernel="cudnn")
    with pytest.raises(ValueError, match="norm must be one of"):
        normalize(x, None, None, "batchnorm", EPS)
    assert normalize(x, None, None, None, EPS) is x


def test_kernel_off_the_gpu_is_an_error():
    if row_norm.kernel_blocks(jnp.ones((4, 8), jnp.float32)):
        pytest.skip("the kernel runs here")
    with pytest.raises(ValueError, match="kernel='te_async' needs a GPU"):
        normalize(jnp.ones((4, 8), jnp.float32), None, None, "rmsnorm", EPS, kernel="te_async")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("rows,h", [(0, 64), (1, 8), (3, 200), (37, 2048), (5000, 2048), (70, 7168)])
def test_kernel_matches_float64(rng, dtype, norm, rows, h):
    if h * jnp.dtype(dtype).itemsize > 16384:
        pytest.skip("past the kernels' 16 KB a row")
    x, scale, bias, dy = operands(rng, (rows, h), dtype, True, norm == "layernorm")
    got = ours(x, scale, bias, dy, norm, kernel="te_async")
    x64, dy64 = (np.asarray(a, np.float64) for a in (x, dy))  # the rounded inputs the kernel saw
    check(got, numpy_norm(x64, scale, bias, dy64, norm), dtype, rows)


@pytest.mark.gpu
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_kernel_without_scale_and_widest_rows(rng, norm):
    """No scale or bias (no column sums at all), and 8192 bf16 columns: 1024 threads a row."""
    x, _, _, dy = operands(rng, (2, 3, 8192), jnp.bfloat16, False, False)
    got = ours(x, None, None, dy, norm, kernel="te_async")
    assert got[2] is None and got[3] is None
    check(got, numpy_norm(np.asarray(x, np.float64), None, None, np.asarray(dy, np.float64), norm), jnp.bfloat16, 6)


@pytest.mark.gpu
def test_kernel_is_deterministic_and_auto_takes_it(rng):
    x, scale, bias, dy = operands(rng, (3000, 2048), jnp.bfloat16, True, True)
    first = ours(x, scale, bias, dy, "layernorm", kernel="te_async")
    again = ours(x, scale, bias, dy, "layernorm", kernel="te_async")
    for a, b in zip(first, again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    hlo = lambda rows: jax.jit(lambda x: normalize(x, scale, None, "rmsnorm", EPS, kernel="auto")).lower(x[:rows]).as_text()
    assert row_norm.ROW_NORM_FORWARD in hlo(row_norm.AUTO_MIN_ROWS)
    assert row_norm.ROW_NORM_FORWARD not in hlo(row_norm.AUTO_MIN_ROWS - 1)


@pytest.mark.gpu
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_grouped_mlp_gradients_through_the_kernels(rng, norm):
    """A prefill's rows (the kernels' side of AUTO_MIN_ROWS), float32, device mode: the layer's
    value and every gradient against the float64 reference."""
    sizes, a = mlp_inputs(rng, groups=8, rows=1536, hidden=64, ffn=48, activation="swiglu", norm=norm, kind="skewed")
    assert jax.jit(lambda x: normalize(x, a["norm_scale"], a["norm_bias"], norm, EPS)).lower(a["x"]).as_text().count(
        row_norm.ROW_NORM_FORWARD) == 1
    gs = jnp.asarray(sizes)
    cot = jnp.asarray(rng.standard_normal(a["x"].shape), jnp.float32)
    names = [k for k, v in a.items() if v is not None]

    def grads(fn):
        loss = lambda *v: jnp.sum(fn(**dict(a, **dict(zip(names, v)))).astype(jnp.float64) * cot)
        return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(names)))))(*[a[k] for k in names])

    with jax.default_matmul_precision("highest"):
        value, g = grads(lambda x, **kw: te_async.grouped_mlp(x, gs, norm=norm, group_sizes_mode="device", **kw))
    value_ref, g_ref = grads(lambda x, **kw: mlp_reference(x, sizes, norm=norm, **kw))
    assert abs(float(value) - float(value_ref)) <= 1e-4 * abs(float(value_ref))
    for name, got, want in zip(names, g, g_ref):
        assert rel_error(got, want) < 1e-4, name
