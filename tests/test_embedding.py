"""te_async.models.embedding.embed: the lookup, and its gradient (each token's rows summed in
float32 in a fixed order, rounded once) against float64 NumPy; lowered for a GPU, the gradient's
scatter sets rows and never adds them (XLA's GPU scatter-add is atomic, in no fixed order)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import bf16_bits, cuda_stablehlo, row_scatter_adds
from te_async.models.embedding import embed


def test_lookup_and_tokens_outside_the_vocabulary(rng):
    table = jnp.asarray(rng.standard_normal((11, 6)), jnp.float32)
    tokens = jnp.asarray([[3, 0, 10], [-1, 11, 3]], jnp.int32)
    out = np.asarray(embed(table, tokens))
    np.testing.assert_array_equal(out[0], np.asarray(table)[[3, 0, 10]])
    np.testing.assert_array_equal(out[1, 2], np.asarray(table)[3])
    assert np.isnan(out[1, :2]).all()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("vocab, shape", [(11, (3, 17)), (5, (64,)), (97, (2, 9))])
def test_gradient_sums_each_tokens_rows(rng, dtype, vocab, shape):
    table = jnp.asarray(rng.standard_normal((vocab, 6)), dtype)
    tokens = jnp.asarray(rng.integers(0, vocab, shape), jnp.int32)
    g = jnp.asarray(rng.standard_normal((*shape, 6)), dtype)
    (d_table,) = jax.vjp(lambda t: embed(t, tokens), table)[1](g)
    ref = np.zeros((vocab, 6))
    np.add.at(ref, np.asarray(tokens).reshape(-1), np.asarray(g, np.float64).reshape(-1, 6))
    if dtype == jnp.bfloat16:  # float32 sums of these bf16 values are exact; one rounding to bf16
        np.testing.assert_array_equal(np.asarray(d_table.view(jnp.uint16)), bf16_bits(ref))
    else:
        np.testing.assert_allclose(np.asarray(d_table), ref, rtol=1e-6, atol=1e-6)


def test_gradient_rounds_once():
    """Token 2 at four positions: 1 and three times 2^-9 (a bf16 running sum can round each small
    one away); summed in float32 and rounded once: 1 + 2^-7."""
    tokens = jnp.asarray([2, 0, 2, 2, 2], jnp.int32)
    g = jnp.asarray([[1.0], [5.0], [2.0**-9], [2.0**-9], [2.0**-9]], jnp.bfloat16)
    (d_table,) = jax.vjp(lambda t: embed(t, tokens), jnp.zeros((4, 1), jnp.bfloat16))[1](g)
    assert [float(v) for v in d_table[:, 0]] == [5.0, 0.0, 1.0 + 2.0**-7, 0.0]


def test_gradient_scatter_sets_rows_never_adds(rng):
    table = jnp.asarray(rng.standard_normal((50, 8)), jnp.bfloat16)
    tokens = jnp.asarray(rng.integers(0, 50, (4, 32)), jnp.int32)
    loss = lambda t: jnp.sum(embed(t, tokens).astype(jnp.float32) ** 2)
    lowered = cuda_stablehlo(jax.grad(loss), table)
    assert not row_scatter_adds(lowered, 8)


def test_a_table_that_is_no_matrix_and_float_tokens_are_refused():
    with pytest.raises(ValueError, match=r"embed needs a table \[V, H\] and integer tokens"):
        embed(jnp.ones((4, 3, 2)), jnp.zeros((2,), jnp.int32))
    with pytest.raises(ValueError, match="integer tokens, got table \\(4, 3\\) and tokens float32"):
        embed(jnp.ones((4, 3)), jnp.zeros((2,), jnp.float32))
