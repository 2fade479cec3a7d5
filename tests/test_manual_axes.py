"""te_async's custom VJPs and FFI calls inside jax.shard_map with check_vma=True (JAX's default):
replicated weights times rows sharded over 4 CPU devices; each gradient equals the one-device
gradient of the whole batch (the replicated weights' summed over the devices by vary_alike's cast)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import te_async
from helpers import four_device_mesh, random_top_k
from te_async import dense
from te_async.manual_axes import vary_alike
from te_async.models.embedding import embed
from te_async.routing import combine, dispatch_rows, plan_dispatch


def _mesh():
    return four_device_mesh("d")


def _check_gradients(f, args, specs, argnums):
    """jax.grad of sum(f) over the devices' shards (summed with psum) against one device's."""
    local = jax.shard_map(lambda *a: jax.lax.psum(jnp.sum(f(*a).astype(jnp.float32)), "d"), mesh=_mesh(),
                          in_specs=specs, out_specs=P())
    whole = lambda *a: jnp.sum(f(*a).astype(jnp.float32))
    got = jax.jit(jax.grad(local, argnums=argnums))(*args)
    want = jax.jit(jax.grad(whole, argnums=argnums))(*args)
    for ours, ref in zip(got, want):
        # float32 sums in another order (each device's, then psum): about 1e-6 apart for sums of a few
        # hundred O(1) terms, so a gradient that cancels to 0.03 (the shared scale's, seed 2527525212)
        # differs by 1.6e-5 of itself; a wrong gradient (a shard missed or counted twice) is off by far more.
        assert float(jnp.max(jnp.abs(ref))) > 0
        np.testing.assert_allclose(np.asarray(ours), np.asarray(ref), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("kw", [{}, {"transpose_w": True}, {"swiglu_input": True}])
def test_dense_linear(rng, kw):
    x = jnp.asarray(rng.standard_normal((8, 5, 32 if kw.get("swiglu_input") else 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((12, 16) if kw.get("transpose_w") else (16, 12)), jnp.float32)
    _check_gradients(lambda x, w: jnp.tanh(dense.linear(x, w, **kw)), (x, w), (P("d"), P()), (0, 1))


def test_embedding(rng):
    table = jnp.asarray(rng.standard_normal((50, 8)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 50, (8, 6)), jnp.int32)
    _check_gradients(lambda t, i: jnp.tanh(embed(t, i)), (table, tokens), (P(), P("d")), (0,))


def test_dispatch_and_combine(rng):
    tokens, experts, top_k, hidden = 16, 6, 2, 8
    x = jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.float32)
    chosen = random_top_k(rng, tokens, experts, top_k)
    scale = jnp.asarray(rng.random(top_k), jnp.float32)  # replicated: a weight every token's choices share

    def block(x, chosen, scale):
        d = plan_dispatch(chosen, experts)
        return combine(jnp.tanh(dispatch_rows(x, d)), d, jnp.broadcast_to(scale, chosen.shape))

    _check_gradients(block, (x, chosen, scale), (P("d"), P("d"), P()), (0, 2))


@pytest.mark.parametrize("mode", te_async.GROUP_SIZES_MODES)
def test_grouped_mlp_and_grouped_gemm(rng, mode):
    """Each device routes its own rows (group sizes sharded with them) through replicated experts."""
    rows, experts, hidden, ffn = 12, 3, 16, 4
    x = jnp.asarray(rng.standard_normal((4 * rows, hidden)), jnp.float32)
    sizes = jnp.asarray([[5, 4, 3], [0, 12, 0], [6, 0, 5], [1, 1, 1]], jnp.int32)
    w1 = jnp.asarray(rng.standard_normal((experts, hidden, 2 * ffn)) / 4, jnp.float32)
    w2 = jnp.asarray(rng.standard_normal((experts, ffn, hidden)) / 4, jnp.float32)

    def per_device(x, sizes, w1, w2):  # one device's rows: on the whole batch, a loop over the 4
        mlp = lambda x, s: te_async.grouped_mlp(x, s, w1, w2, group_sizes_mode=mode)
        wgrad = lambda x, s: te_async.grouped_gemm(x, x, s, ragged="k", group_sizes_mode=mode).sum(0)[:1]
        return jnp.concatenate([jnp.concatenate([mlp(xs, s), wgrad(xs, s)]) for xs, s in
                                zip(jnp.split(x, sizes.shape[0]), sizes)])

    _check_gradients(per_device, (x, sizes, w1, w2), (P("d"), P("d"), P(), P()), (0, 2, 3))


def test_vary_alike_leaves_arrays_alone_outside_shard_map():
    a, b = jnp.ones(3), jnp.zeros((2,), jnp.int32)
    assert all(x is y for x, y in zip(vary_alike(a, b), (a, b)))
