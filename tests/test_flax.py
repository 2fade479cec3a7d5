"""te_async.flax.GroupedLayerNormMLP: parameters, dtypes, sharding names and gradients."""

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

    grads = nnx.grad(lambda m: jnp.sum(m(x, jnp.asarray(sizes)) ** 2))(layer)
    assert np.any(np.asarray(grads.wi[...])) and np.all(np.isfinite(np.asarray(grads.wo[...])))


def test_compute_dtype_casts_parameters(rng):
    layer = GroupedLayerNormMLP(2, 8, 8, dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
    y = layer(jnp.ones((5, 8), jnp.float32), jnp.array([2, 3], jnp.int32))
    assert y.dtype == jnp.bfloat16 and layer.wi[...].dtype == jnp.float32


def test_bad_norm():
    with pytest.raises(ValueError, match="norm must be one of"):
        GroupedLayerNormMLP(2, 8, 8, norm="batchnorm", rngs=nnx.Rngs(0))
