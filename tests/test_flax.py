"""te_async.flax.GroupedLayerNormMLP: parameters, dtypes, sharding names and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")

from reference import mlp_reference, random_group_sizes, rel_error  # noqa: E402
from te_async.flax import GroupedLayerNormMLP  # noqa: E402


@pytest.mark.parametrize("norm,activation", [("rmsnorm", "swiglu"), ("layernorm", "gelu"), (None, "relu")])
def test_module_matches_reference_and_trains(rng, norm, activation):
    experts, hidden, ffn, rows = 4, 16, 12, 40
    layer = GroupedLayerNormMLP(experts, hidden, ffn, activation=activation, norm=norm, rngs=nnx.Rngs(int(rng.integers(1 << 30))))
    f1 = 2 * ffn if activation == "swiglu" else ffn
    assert layer.wi[...].shape == (experts, hidden, f1) and layer.wo[...].shape == (experts, ffn, hidden)
    assert layer.wi[...].dtype == jnp.float32
    spec = nnx.get_partition_spec(nnx.state(layer)).wi
    spec = spec.get_value() if hasattr(spec, "get_value") else spec.value  # flax >= 0.12 / older
    assert tuple(spec) == ("expert", "embed", "mlp")
    sizes = random_group_sizes(rng, experts, rows, "zeros")
    x = jnp.asarray(rng.standard_normal((rows, hidden)), jnp.float32)
    y = layer(x, jnp.asarray(sizes))
    scale = None if layer.norm_scale is None else layer.norm_scale[...]
    bias = None if layer.norm_bias is None else layer.norm_bias[...]
    ref = mlp_reference(x, sizes, layer.wi[...], layer.wo[...], scale, bias, norm=norm, activation=activation)
    assert rel_error(y, ref) < 1e-5

    # Train: plain SGD on a fixed regression target. Every parameter that sees a live row moves,
    # the experts that get no rows ("zeros" sizes) keep their weights, and the loss falls.
    target = jnp.asarray(rng.standard_normal((rows, hidden)), jnp.float32)
    loss_fn = lambda m: jnp.mean((m(x, jnp.asarray(sizes)) - target) ** 2)

    @nnx.jit
    def sgd_step(m):
        loss, grads = nnx.value_and_grad(loss_fn)(m)
        nnx.update(m, jax.tree.map(lambda p, g: p - 0.5 * g, nnx.state(m, nnx.Param), grads))
        return loss

    before = {k: np.array(v) for k, v in flat_params(layer).items()}
    losses = [float(sgd_step(layer)) for _ in range(30)] + [float(loss_fn(layer))]
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.75 * losses[0], losses  # measured 0.45-0.54
    after = flat_params(layer)
    assert before.keys() == after.keys() and len(after) == 2 + (norm is not None) + (norm == "layernorm")
    live = sizes > 0
    for name in ("wi", "wo"):
        moved = np.any(np.asarray(after[name]) != before[name], axis=(1, 2))
        np.testing.assert_array_equal(moved, live, err_msg=name)
    for name in set(after) - {"wi", "wo"}:
        assert np.any(np.asarray(after[name]) != before[name]), name


def flat_params(module):
    """{name: array} of a module's nnx.Params."""
    return {".".join(map(str, path)): leaf[...] for path, leaf in nnx.to_flat_state(nnx.state(module, nnx.Param))}


def test_compute_dtype_casts_parameters(rng):
    layer = GroupedLayerNormMLP(2, 8, 8, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    y = layer(jnp.ones((5, 8), jnp.float32), jnp.array([2, 3], jnp.int32))
    assert y.dtype == jnp.bfloat16 and layer.wi[...].dtype == jnp.float32


def test_bad_norm():
    with pytest.raises(ValueError, match="norm must be one of"):
        GroupedLayerNormMLP(2, 8, 8, norm="batchnorm", rngs=nnx.Rngs(0))
