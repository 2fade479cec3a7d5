"""Gradients of te_async.grouped_gemm (all three forms) against jax.vjp of float64 dense
references, and te_async.ragged_dot against jax.lax.ragged_dot (values, gradients, rejections):
random, skewed, empty, underfull and one-group sizes, K and N not multiples of 8, every mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from helpers import FORMS, gemm_operands
from reference import SIZE_KINDS, random_group_sizes, rel_error, row_groups

F64 = jnp.float64


def dense_reference(lhs, rhs, sizes, ragged, transpose_rhs):
    """The grouped GEMM as one dense float64 einsum over a row-to-group one-hot: differentiable."""
    gid = row_groups(np.asarray(sizes), lhs.shape[0])
    onehot = jnp.asarray(gid[:, None] == np.arange(len(sizes))[None], F64)
    if ragged == "k":
        return jnp.einsum("mg,mk,mn->gkn", onehot, lhs, rhs)
    w = jnp.swapaxes(rhs, 1, 2) if transpose_rhs else rhs
    return jnp.einsum("mg,mk,gkn->mn", onehot, lhs, w)


def vjp_against_reference(f, lhs, rhs, sizes, ragged, transpose_rhs, rng):
    """(relative errors of the output, d lhs and d rhs) of f against the float64 reference's,
    for one random cotangent."""
    out, vjp = jax.vjp(f, lhs, rhs)
    cot = jnp.asarray(rng.standard_normal(out.shape), out.dtype)
    ref, ref_vjp = jax.vjp(lambda a, b: dense_reference(a, b, sizes, ragged, transpose_rhs), lhs.astype(F64),
                           rhs.astype(F64))
    grads, ref_grads = vjp(cot), ref_vjp(cot.astype(F64))
    for g, a in zip(grads, (lhs, rhs)):
        assert g.shape == a.shape and g.dtype == a.dtype
    return [rel_error(*pair) for pair in ((out, ref), *zip(grads, ref_grads))]


@pytest.mark.parametrize("kind", SIZE_KINDS)
@pytest.mark.parametrize("mode", ["device", "sync", "async"])
@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_grouped_gemm_gradients(rng, ragged, transpose_rhs, mode, kind):
    groups, rows, k, n = 5, 37, 13, 11
    sizes = random_group_sizes(rng, groups, rows, kind)
    lhs, rhs = gemm_operands(rng, jnp.float32, groups, rows, k, n, ragged, transpose_rhs)
    f = jax.jit(lambda a, b: te_async.grouped_gemm(a, b, jnp.asarray(sizes), ragged=ragged, transpose_rhs=transpose_rhs,
                                                   group_sizes_mode=mode))
    errors = vjp_against_reference(f, lhs, rhs, sizes, ragged, transpose_rhs, rng)
    assert max(errors) < 1e-5, (kind, errors)


@pytest.mark.parametrize("ragged,transpose_rhs", FORMS)
def test_grouped_gemm_gradients_bf16(rng, ragged, transpose_rhs):
    """bf16 operands: gradients in bf16, from float32 sums (one rounding each)."""
    sizes = random_group_sizes(rng, 4, 50, "random")
    lhs, rhs = gemm_operands(rng, jnp.bfloat16, 4, 50, 24, 40, ragged, transpose_rhs)
    f = lambda a, b: te_async.grouped_gemm(a, b, jnp.asarray(sizes), ragged=ragged, transpose_rhs=transpose_rhs)
    errors = vjp_against_reference(f, lhs, rhs, sizes, ragged, transpose_rhs, rng)
    assert max(errors) < 2e-2, errors


@pytest.mark.parametrize("kind", SIZE_KINDS)
@pytest.mark.parametrize("dtypes,preferred", [((jnp.float32, jnp.float32), None), ((jnp.bfloat16, jnp.bfloat16), None),
                                              ((jnp.bfloat16, jnp.bfloat16), jnp.float32),
                                              ((jnp.bfloat16, jnp.float32), None)])
def test_ragged_dot_matches_jax(rng, kind, dtypes, preferred):
    groups, rows, k, n = 6, 45, 19, 7
    sizes = jnp.asarray(random_group_sizes(rng, groups, rows, kind))
    lhs = jnp.asarray(rng.standard_normal((rows, k)), dtypes[0])
    rhs = jnp.asarray(rng.standard_normal((groups, k, n)), dtypes[1])
    got = jax.jit(lambda a, b: te_async.ragged_dot(a, b, sizes, preferred_element_type=preferred))(lhs, rhs)
    # HIGHEST: on a GPU, lax's default precision multiplies float32 in TF32
    want = jax.lax.ragged_dot(lhs, rhs, sizes, preferred_element_type=preferred, precision=jax.lax.Precision.HIGHEST)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 1e-5 if got.dtype == jnp.float32 and jnp.bfloat16 not in dtypes else 8e-3
    ref = dense_reference(lhs.astype(F64), rhs.astype(F64), sizes, "m", False)
    assert rel_error(got, ref) < tol and rel_error(want, ref) < tol


@pytest.mark.parametrize("mode", [None, "device", "sync", "async"])
def test_ragged_dot_gradients_match_jax(rng, mode):
    groups, rows, k, n = 7, 53, 21, 9
    sizes = jnp.asarray(random_group_sizes(rng, groups, rows, "zeros"))
    lhs = jnp.asarray(rng.standard_normal((rows, k)), jnp.float32)
    rhs = jnp.asarray(rng.standard_normal((groups, k, n)), jnp.float32)
    cot = jnp.asarray(rng.standard_normal((rows, n)), jnp.float32)
    loss = lambda dot: lambda a, b: jnp.sum(dot(a, b, sizes) * cot)
    got = jax.jit(jax.grad(loss(lambda *a: te_async.ragged_dot(*a, group_sizes_mode=mode)), argnums=(0, 1)))(lhs, rhs)
    want = jax.grad(loss(lambda *a: jax.lax.ragged_dot(*a, precision=jax.lax.Precision.HIGHEST)), argnums=(0, 1))(lhs, rhs)
    for g, w in zip(got, want):
        assert rel_error(g, w) < 1e-5


def test_ragged_dot_rejects_what_jax_rejects():
    lhs, rhs, sizes = jnp.ones((5, 3)), jnp.ones((2, 3, 4)), jnp.array([2, 3], jnp.int32)
    bad = [((jnp.ones(5), rhs, sizes), "lhs of rank 2"), ((lhs, jnp.ones((3, 4)), sizes), "rhs of rank 3"),
           ((lhs, rhs, jnp.array([2, 3, 0], jnp.int32)), "group dimension size to be 3"),
           ((lhs, jnp.ones((2, 4, 4)), sizes), "contracting dimensions"),
           ((lhs, rhs, sizes.astype(jnp.float32)), "integer group_sizes")]
    for args, message in bad:
        with pytest.raises(TypeError, match=message):
            te_async.ragged_dot(*args)
        with pytest.raises(TypeError):
            jax.lax.ragged_dot(*args)
    with pytest.raises(TypeError, match="bfloat16, float16 or float32"):
        te_async.ragged_dot(lhs.astype(jnp.float64), rhs, sizes)
    with pytest.raises(NotImplementedError, match="group_offset"):
        te_async.ragged_dot(lhs, rhs, sizes, group_offset=jnp.zeros((1,), jnp.int32))
