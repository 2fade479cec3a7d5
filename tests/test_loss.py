"""te_async.models.loss.cross_entropy and models.next_token_loss: values and gradients against
float64 NumPy, a gradient with no scatter (lowered for a GPU), and the loss a training step
differentiates equal to the cross-entropy of forward's float32 logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import cuda_stablehlo
from reference import rel_error
from te_async import models
from te_async.bench import presets
from te_async.models.loss import cross_entropy


def _reference(logits, labels, mask=None):
    """(loss, d loss / d logits) in float64: the mean of logsumexp - picked over the counted
    positions, (softmax - one-hot) / their number at those positions, 0 elsewhere."""
    z = np.asarray(logits, np.float64)
    counted = np.ones(labels.shape) if mask is None else np.asarray(mask, np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    picked = np.take_along_axis(z, np.asarray(labels)[..., None], -1)[..., 0]
    onehot = np.asarray(labels)[..., None] == np.arange(z.shape[-1])
    n = max(counted.sum(), 1.0)
    return np.sum(counted * (lse - picked)) / n, counted[..., None] * (p - onehot) / n


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
def test_cross_entropy_matches_float64(rng, dtype, tol):
    logits = jnp.asarray(4 * rng.standard_normal((3, 7, 50)), dtype)
    labels = jnp.asarray(rng.integers(0, 50, (3, 7)), jnp.int32).at[0, 0].set(0).at[0, 1].set(49)
    loss, grad = jax.value_and_grad(cross_entropy)(logits, labels)
    want, want_grad = _reference(logits, labels)
    assert loss.dtype == jnp.float32 and abs(float(loss) - want) < 1e-6 * abs(want)  # float32 inside either way
    assert grad.dtype == dtype and rel_error(grad, want_grad) < tol


def test_masked_cross_entropy_matches_float64(rng):
    """A mask keeps the mean to its positions; the others get no gradient; none marked gives 0."""
    logits = jnp.asarray(4 * rng.standard_normal((3, 7, 50)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 50, (3, 7)), jnp.int32)
    mask = rng.random((3, 7)) < 0.6
    loss, grad = jax.value_and_grad(cross_entropy)(logits, labels, jnp.asarray(mask))
    want, want_grad = _reference(logits, labels, mask)
    assert abs(float(loss) - want) < 1e-6 * abs(want) and rel_error(grad, want_grad) < 1e-6
    assert not np.asarray(grad)[~mask].any()
    loss, grad = jax.value_and_grad(cross_entropy)(logits, labels, jnp.zeros((3, 7), bool))
    assert float(loss) == 0.0 and not np.asarray(grad).any()


def test_cross_entropy_gradient_has_no_scatter():
    """Lowered for a GPU, the gradient is elementwise; the take_along_axis spelling's is a scatter
    into a float32 array of the logits' shape (what the test looks for exists)."""
    logits, labels = jnp.zeros((4, 6, 32), jnp.bfloat16), jnp.zeros((4, 6), jnp.int32)
    lower = lambda f: cuda_stablehlo(jax.grad(f), logits, labels)

    def take_along_axis(logits, labels):
        z = logits.astype(jnp.float32)
        return jnp.mean(jax.nn.logsumexp(z, -1) - jnp.take_along_axis(z, labels[..., None], -1)[..., 0])

    assert "scatter" in lower(take_along_axis)
    assert "scatter" not in lower(cross_entropy)


def test_next_token_loss_is_cross_entropy_of_forward(rng):
    """float32 model: the loss and its gradients are those of cross_entropy over forward's logits."""
    config = presets.config("tiny", num_hidden_layers=2)
    params = models.init_params(config, jax.random.key(4), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (2, 9)), jnp.int32)
    ours = jax.value_and_grad(lambda p: models.next_token_loss(p, config, tokens))(params)
    want = jax.value_and_grad(lambda p: cross_entropy(models.forward(p, config, tokens[:, :-1]), tokens[:, 1:]))(params)
    assert abs(float(ours[0]) - float(want[0])) < 1e-6 * abs(float(want[0]))
    for got, ref in zip(jax.tree.leaves(ours[1]), jax.tree.leaves(want[1])):
        assert rel_error(got, ref) < 1e-5


def test_next_token_loss_of_a_bf16_model_keeps_bf16_logits(rng):
    """bf16 model: the LM head writes bf16 logits [B, S, V] (float32 only inside cross_entropy's
    math), and the loss is within bf16 rounding of float32 logits'."""
    config = presets.config("tiny", num_hidden_layers=2)
    params = models.init_params(config, jax.random.key(5), jnp.bfloat16)
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, (2, 9)), jnp.int32)
    loss = float(models.next_token_loss(params, config, tokens))
    want = float(cross_entropy(models.forward(params, config, tokens[:, :-1]), tokens[:, 1:]))
    assert abs(loss - want) < 1e-2 * abs(want)
    jaxpr = str(jax.make_jaxpr(lambda p: models.next_token_loss(p, config, tokens))(params))
    assert f"bf16[2,8,{config.vocab_size}]" in jaxpr


def test_masked_loss_of_a_right_padded_batch_is_that_of_its_sequences(rng):
    """Three sequences of 9, 5 and 2 tokens, right-padded to 9 with an arbitrary token and masked:
    the batch's loss is the mean over the real predictions of each sequence's own loss (8, 4, 1 of
    them), its gradients likewise: the padding reaches no real token."""
    config = presets.config("tiny", num_hidden_layers=2)
    params = models.init_params(config, jax.random.key(7), jnp.float32)
    lengths = (9, 5, 2)
    seqs = [rng.integers(0, config.vocab_size, n) for n in lengths]
    batch = np.full((3, 9), 3, np.int32)
    for i, seq in enumerate(seqs):
        batch[i, :len(seq)] = seq
    mask = np.arange(9) < np.array(lengths)[:, None]
    one = lambda p, seq: (len(seq) - 1) * models.next_token_loss(p, config, jnp.asarray(seq[None], jnp.int32))
    with jax.default_matmul_precision("highest"):  # other shapes, other TF32 roundings on a GPU
        ours = jax.value_and_grad(lambda p: models.next_token_loss(p, config, batch, mask))(params)
        want = jax.value_and_grad(lambda p: sum(one(p, seq) for seq in seqs) / (sum(lengths) - 3))(params)
    assert abs(float(ours[0]) - float(want[0])) < 1e-5 * abs(float(want[0]))
    for got, ref in zip(jax.tree.leaves(ours[1]), jax.tree.leaves(want[1])):
        assert rel_error(got, ref) < 1e-4


def test_bad_input_is_refused(rng):
    config = presets.config("tiny", num_hidden_layers=1)
    params = models.init_params(config, jax.random.key(6), jnp.float32)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        models.next_token_loss(params, config, jnp.zeros((2, 1), jnp.int32))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        models.next_token_loss(params, config, jnp.full((1, 3), config.vocab_size, jnp.int32))
    with pytest.raises(ValueError, match="cross_entropy needs integer labels"):
        cross_entropy(jnp.zeros((2, 3, 5)), jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="mask must have the tokens' shape"):
        models.next_token_loss(params, config, jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 2), bool))
    with pytest.raises(ValueError, match="mask must have the labels' shape"):
        cross_entropy(jnp.zeros((2, 3, 5)), jnp.zeros((2, 3), jnp.int32), jnp.ones((3,), bool))
    with pytest.raises(TypeError, match="remat must be"):
        models.next_token_loss(params, config, jnp.zeros((1, 3), jnp.int32), remat="layer")
