"""te_async.mixed_precision.einsum: jnp.einsum's float32-accumulated product, whose gradient
products read the operands' dtype. Values and gradients against float64 references; lowered for
a GPU, a bf16 model's training gradient has no float32 x float32 GEMM but its float32 router's."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import cuda_stablehlo
from reference import rel_error
from te_async import dense, mixed_precision, models
from te_async.bench import presets

SPECS = ["mk,kn->mn", "mk,nk->mn", "bsr,hdr->bshd", "bsngd,blnd->bngsl", "bngsl,blnd->bsngd"]
DOT = re.compile(r"stablehlo\.dot_general .*: \(tensor<([0-9x]+)x(\w+)>, tensor<([0-9x]+)x(\w+)>\)")


def _operands(rng, spec, dtype):
    sizes = dict(zip("mknbsrhdgl", [5, 12, 7, 2, 3, 8, 4, 6, 2, 9]))
    sa, sb = spec.split("->")[0].split(",")
    draw = lambda s: jnp.asarray(rng.standard_normal([sizes[c] for c in s]), dtype)
    return draw(sa), draw(sb)


@pytest.mark.parametrize("spec", SPECS)
def test_float32_values_and_gradients_are_jax_own(rng, spec):
    a, b = _operands(rng, spec, jnp.float32)
    ours = jax.vjp(lambda a, b: mixed_precision.einsum(spec, a, b, precision="highest"), a, b)
    theirs = jax.vjp(lambda a, b: jnp.einsum(spec, a, b, precision="highest", preferred_element_type=jnp.float32), a, b)
    np.testing.assert_array_equal(np.asarray(ours[0]), np.asarray(theirs[0]))
    g = jnp.asarray(rng.standard_normal(ours[0].shape), jnp.float32)
    for x, y in zip(ours[1](g), theirs[1](g)):
        assert rel_error(x, y) < 1e-6


@pytest.mark.parametrize("spec", SPECS)
def test_bf16_gradients_are_products_of_the_rounded_cotangent(rng, spec):
    """The float32 output's cotangent is rounded to bf16 once; each gradient is then that bf16
    cotangent times the other bf16 operand, summed exactly (float64 here) and rounded to bf16."""
    a, b = _operands(rng, spec, jnp.bfloat16)
    out, pullback = jax.vjp(lambda a, b: mixed_precision.einsum(spec, a, b), a, b)
    assert out.dtype == jnp.float32
    sa, sb = spec.split("->")[0].split(",")
    so = spec.split("->")[1]
    np.testing.assert_allclose(np.asarray(out), np.einsum(spec, np.asarray(a, np.float64), np.asarray(b, np.float64)),
                               rtol=1e-5, atol=1e-5)
    g = jnp.asarray(rng.standard_normal(out.shape), jnp.float32)
    da, db = pullback(g)
    g64 = np.asarray(g.astype(jnp.bfloat16), np.float64)
    want_a = np.einsum(f"{so},{sb}->{sa}", g64, np.asarray(b, np.float64))
    want_b = np.einsum(f"{so},{sa}->{sb}", g64, np.asarray(a, np.float64))
    for got, want in ((da, want_a), (db, want_b)):
        assert got.dtype == jnp.bfloat16
        assert rel_error(got, want) < 2**-8  # one bf16 rounding of a float32 sum


@pytest.mark.parametrize("spec", ["...k,kn->...n", "mk,kk->mk", "mkj,kn->mn", "mk,kn", "mk,kn->mz"])
def test_specs_with_an_axis_no_gradient_product_covers_are_refused(spec):
    a = jnp.ones((2, 3, 4))
    with pytest.raises(ValueError, match="einsum spec"):
        mixed_precision.einsum(spec, a, a)


def _float32_dots(stablehlo: str) -> list:
    """(lhs shape, rhs shape) of every dot_general whose operands are both float32."""
    return [(tuple(map(int, m[0].split("x"))), tuple(map(int, m[2].split("x"))))
            for m in DOT.findall(stablehlo) if m[1] == m[3] == "f32"]


def test_dense_linear_gradient_runs_bf16_gemms():
    """dense.linear past its kernels' rows (XLA's GEMM, precision HIGHEST): JAX's own derivative
    multiplied float32 operands there, which a GPU runs on its CUDA cores."""
    x, w = jnp.ones((64, 32), jnp.bfloat16), jnp.ones((32, 48), jnp.bfloat16)
    for kw in ({}, {"transpose_w": True}, {"swiglu_input": True}):
        wk = w.T if kw.get("transpose_w") else w
        xk = jnp.ones((64, 64), jnp.bfloat16) if kw.get("swiglu_input") else x
        loss = lambda x, w: jnp.sum(dense.linear(x, w, preferred_element_type=jnp.float32, **kw) ** 2)
        lowered = cuda_stablehlo(jax.grad(loss, argnums=(0, 1)), xk, wk)
        assert len(DOT.findall(lowered)) == 3 and not _float32_dots(lowered), kw


def test_bf16_model_training_gradient_has_float32_gemms_only_at_the_router(rng):
    """A bf16 DeepSeek-V2-shaped model (MLA, shared experts, a dense first layer): the float32 x
    float32 products of its lowered training gradient all have the router's experts axis (its
    weights are float32 by design). The weighted sum of each token's k rows was two more (combine's
    einsums); the weights now ride on grouped_mlp's rows and the sum is a reduction."""
    experts, top_k = 7, 3
    config = presets.config("tiny", num_hidden_layers=3, num_experts=experts, num_experts_per_tok=top_k)
    params = models.init_params(config, jax.random.key(0), jnp.bfloat16)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (2, 5)), jnp.int32)
    loss = lambda p: jnp.mean(models.forward(p, config, tokens))
    lowered = cuda_stablehlo(jax.grad(loss), params)
    assert len(DOT.findall(lowered)) > 20
    assert _float32_dots(lowered)  # the router's: what the test looks for exists
    for lhs, rhs in _float32_dots(lowered):
        assert experts in set(lhs + rhs), (lhs, rhs)
