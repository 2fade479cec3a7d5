"""Gradients through an MoE block's token permutation (te_async.routing.dispatch_rows) and its
unpermutation (combine): against float64 NumPy references, and, lowered for a GPU, with no
scatter of rows, whose GPU lowering adds with atomics in the rows' dtype and in no fixed order.
The GPU test checks that a training step's gradients come out bit-identical run after run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from helpers import allocated_buffers, bf16_bits, cuda_stablehlo, moe_params, random_top_k, row_scatter_adds
from reference import rel_error
from te_async.moe import moe_block
from te_async.routing import combine, dispatch_rows, plan_dispatch, sum_rows, weights_by_row


def _dispatch(rng, tokens, experts, top_k):
    """A plan of distinct random experts per token (as top-k gives), with empty experts."""
    return plan_dispatch(random_top_k(rng, tokens, experts, top_k), experts)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("tokens, experts, top_k, hidden", [(37, 5, 3, 24), (1, 4, 4, 8), (64, 64, 6, 40)])
def test_dispatch_rows_gradient_sums_each_tokens_rows(rng, dtype, tokens, experts, top_k, hidden):
    dispatch = _dispatch(rng, tokens, experts, top_k)
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), dtype)
    g = jnp.asarray(rng.standard_normal((tokens * top_k, hidden)), dtype)
    rows, pullback = jax.vjp(lambda x: dispatch_rows(x, dispatch), x)
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(x)[np.asarray(dispatch.token_of_row)])
    (dx,) = pullback(g)
    # float64: token t's gradient is the sum of the rows that copied it.
    ref = np.zeros((tokens, hidden))
    np.add.at(ref, np.asarray(dispatch.token_of_row), np.asarray(g, np.float64))
    if dtype == jnp.bfloat16:  # summed in float32 (exact for these few bf16 values), rounded once
        np.testing.assert_array_equal(np.asarray(dx.view(jnp.uint16)), bf16_bits(ref))
    else:
        np.testing.assert_allclose(np.asarray(dx), ref, rtol=1e-6, atol=1e-6)


def test_dispatch_rows_gradient_rounds_once():
    """One token's 4 rows whose bf16 running sum would round the small ones away, in some orders
    (1 + 2^-9 rounds to 1 in bf16): summed in float32 and rounded once it is 1 + 2^-7 in any order."""
    dispatch = plan_dispatch(jnp.asarray([[2, 0, 3, 1]], jnp.int32), 4)
    g = jnp.asarray([[1.0], [2.0**-9], [2.0**-9], [2.0**-9]], jnp.bfloat16)[dispatch.row_of_choice]
    (dx,) = jax.vjp(lambda x: dispatch_rows(x, dispatch), jnp.zeros((1, 1), jnp.bfloat16))[1](g)
    assert float(dx[0, 0]) == 1.0 + 2.0**-7


def test_combine_gradients_match_float64(rng):
    tokens, experts, top_k, hidden = 29, 7, 3, 20
    dispatch = _dispatch(rng, tokens, experts, top_k)
    y_rows = jnp.asarray(rng.standard_normal((tokens * top_k, hidden)), jnp.float32)
    weights = jnp.asarray(rng.random((tokens, top_k)), jnp.float32)
    c = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.float32)
    d_rows, d_weights = jax.grad(lambda y, w: jnp.sum(combine(y, dispatch, w) * c), argnums=(0, 1))(y_rows, weights)
    choice = np.asarray(dispatch.choice_of_row)  # row r holds flat choice (t, j) = divmod(choice[r], k)
    t_of, j_of = np.divmod(choice, top_k)
    c64, w64, y64 = (np.asarray(a, np.float64) for a in (c, weights, y_rows))
    np.testing.assert_allclose(np.asarray(d_rows), w64[t_of, j_of][:, None] * c64[t_of], rtol=1e-6, atol=1e-7)
    y_of_choice = y64[np.asarray(dispatch.row_of_choice)].reshape(tokens, top_k, hidden)
    assert rel_error(d_weights, np.einsum("tkh,th->tk", y_of_choice, c64)) < 1e-6


def test_weights_by_row_and_sum_rows_match_float64(rng):
    """The weighted-rows combine (weights_by_row into grouped_mlp, then sum_rows): each in row order
    and back, gradients gathers, against float64."""
    tokens, experts, top_k, hidden = 31, 6, 3, 12
    dispatch = _dispatch(rng, tokens, experts, top_k)
    weights = jnp.asarray(rng.random((tokens, top_k)), jnp.float32)
    rows = jnp.asarray(rng.standard_normal((tokens * top_k, hidden)), jnp.float32)
    c_rows, c = jnp.asarray(rng.standard_normal(tokens * top_k)), jnp.asarray(rng.standard_normal((tokens, hidden)))
    choice = np.asarray(dispatch.choice_of_row)
    t_of, j_of = np.divmod(choice, top_k)
    w_rows, pull_w = jax.vjp(lambda w: weights_by_row(w, dispatch), weights)
    np.testing.assert_array_equal(np.asarray(w_rows), np.asarray(weights)[t_of, j_of])
    (d_weights,) = pull_w(c_rows.astype(jnp.float32))
    want = np.zeros((tokens, top_k))
    want[t_of, j_of] = np.asarray(c_rows)
    np.testing.assert_allclose(np.asarray(d_weights), want, rtol=1e-6)
    sums, pull_s = jax.vjp(lambda r: sum_rows(r, dispatch, tokens), rows)
    ref = np.zeros((tokens, hidden))
    np.add.at(ref, t_of, np.asarray(rows, np.float64))
    assert sums.dtype == jnp.float32 and rel_error(sums, ref) < 1e-6
    (d_rows,) = pull_s(c.astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(d_rows), np.asarray(c, np.float32)[t_of])
    with pytest.raises(ValueError, match="sum_rows needs rows"):
        sum_rows(rows, dispatch, 4)
    with pytest.raises(ValueError, match="weights_by_row needs weights"):
        weights_by_row(weights[:, :2], dispatch)


@pytest.mark.parametrize("mode", te_async.GROUP_SIZES_MODES)
def test_moe_block_gradient_scatters_no_rows(rng, mode):
    """Lowered for a GPU, the gradient of an MoE block has no row scatter: the permutation's and
    the unpermutation's transposes are gathers (jax's own transposes were two row scatters)."""
    tokens, experts, hidden, ffn, top_k = 64, 8, 32, 16, 2
    p = {k: v.astype(jnp.bfloat16) for k, v in moe_params(rng, experts, hidden, ffn).items()}
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.bfloat16)
    loss = lambda x, p: jnp.sum(moe_block(x, **p, top_k=top_k, group_sizes_mode=mode).astype(jnp.float32))
    lowered = cuda_stablehlo(jax.grad(loss, argnums=(0, 1)), x, p)
    assert "te_async_grouped_gemm" in lowered
    assert not row_scatter_adds(lowered, hidden)


@pytest.mark.gpu
def test_training_step_gradients_are_bit_identical_on_the_gpu(rng):
    """Five runs of one device-mode MoE block's forward + backward (bf16, 2048 tokens x top-6 over
    64 experts, each token's 6 row gradients summed into it) give the same bits."""
    tokens, experts, hidden, ffn, top_k = 2048, 64, 256, 128, 6
    p = {k: v.astype(jnp.bfloat16) for k, v in moe_params(rng, experts, hidden, ffn).items()}
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.bfloat16)
    c = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.bfloat16)
    loss = lambda x, p: jnp.sum((moe_block(x, **p, top_k=top_k, group_sizes_mode="device") * c).astype(jnp.float32))
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    first = jax.tree_util.tree_map(np.asarray, grad(x, p))
    assert float(np.abs(first[0].astype(np.float32)).max()) > 0
    for _ in range(4):
        again = jax.tree_util.tree_map(np.asarray, grad(x, p))
        for a, b in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(again)):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_combine_keeps_the_rows_not_a_float32_copy(rng):
    """Under te_async.scan, lowered for a GPU, combine's residual is its bf16 rows [L, T*k, H], not
    the float32 [L, T, k, H] copy of the unpermuted rows that JAX's derivative of the weighted sum
    keeps (twice the bytes, and a conversion pass)."""
    layers, tokens, experts, top_k, hidden = 3, 16, 4, 2, 8
    dispatch = _dispatch(rng, tokens, experts, top_k)
    weights = jnp.asarray(rng.random((layers, tokens, top_k)), jnp.float32)
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.bfloat16)
    step = lambda c, w: (combine(jnp.tanh(dispatch_rows(c, dispatch)), dispatch, w), None)
    loss = lambda x, w: jnp.sum(te_async.scan(step, x, w)[0].astype(jnp.float32))
    lowered = cuda_stablehlo(jax.grad(loss, argnums=(0, 1)), x, weights)
    stacked = allocated_buffers(lowered)
    assert f"{layers}x{tokens * top_k}x{hidden}xbf16" in stacked
    assert not [s for s in stacked if s.endswith("f32") and s != f"{layers}x{tokens}x{top_k}xf32"]


def test_shapes_that_do_not_fit_the_dispatch_are_refused(rng):
    dispatch = _dispatch(rng, 6, 4, 2)  # 12 rows
    with pytest.raises(ValueError, match=r"dispatch_rows needs x \[T, H\] for a dispatch of T\*k = 12 rows"):
        dispatch_rows(jnp.ones((5, 8)), dispatch)
    with pytest.raises(ValueError, match=r"combine needs y_rows \[T\*k, H\] and weights \[T, k\]"):
        combine(jnp.ones((12, 8)), dispatch, jnp.ones((6, 3)))
    with pytest.raises(ValueError, match="combine needs"):
        combine(jnp.ones((11, 8)), dispatch, jnp.ones((6, 2)))


def test_text_without_any_scatter_is_refused_not_read_as_no_adds():
    """row_scatter_adds' guard: a lowering with no scatter at all (or a pattern that stopped
    matching) raises, where an empty list would pass every "no adds" check."""
    lowered = cuda_stablehlo(lambda x: x * 2, jnp.ones((4, 8)))
    with pytest.raises(ValueError, match="no scatter in the text"):
        row_scatter_adds(lowered, 8)
    assert allocated_buffers(lowered) == []
