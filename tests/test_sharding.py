"""te_async.sharding.require_replicated on a grouped GEMM FFI call like gemm.py's, over 4 CPU
devices (conftest): sharded operands raise instead of being all-gathered; replicated operands,
shard_map bodies and vmap run as before."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import te_async
from te_async import _ffi
from te_async.sharding import require_replicated
from helpers import on_cpu  # unsharded results must come from the CPU mesh's handler, not cuBLAS

G, M, K, N = 8, 16, 4, 3
ARGS = ("lhs", "rhs", "group_sizes")


def raw_gemm(lhs, rhs, group_sizes):
    """gemm.py's host-sized FFI call, sync mode, without any sharding guard (its second result is
    the int32[1] scratch of the GPU's check of pinned sizes)."""
    out = jax.ShapeDtypeStruct((lhs.shape[0], rhs.shape[2]), lhs.dtype)
    call = jax.ffi.ffi_call(_ffi.GROUPED_GEMM, (out, jax.ShapeDtypeStruct((1,), jnp.int32)), vmap_method="sequential")
    return call(lhs, rhs, group_sizes, ragged_k=False, transpose_rhs=False, async_host_sizes=False)[0]


guarded_gemm = require_replicated(raw_gemm, "te_async.grouped_gemm", ARGS)


def operands(rng):
    sizes = np.full(G, M // G, np.int32)
    lhs = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    return lhs, jnp.asarray(rng.standard_normal((G, K, N)), jnp.float32), jnp.asarray(sizes)


def mesh(axis_type=AxisType.Auto):
    return Mesh(np.array(jax.devices("cpu")[:4]), ("ep",), axis_types=(axis_type,))


def put(mesh, a, *spec):
    return jax.device_put(a, NamedSharding(mesh, P(*spec)))


def test_unguarded_call_all_gathers_silently(rng):
    """The problem: XLA all-gathers an expert-sharded rhs in front of the custom call."""
    lhs, rhs, sizes = operands(rng)
    hlo = jax.jit(raw_gemm).lower(lhs, put(mesh(), rhs, "ep"), sizes).compile().as_text()
    assert "all-gather" in hlo


def test_replicated_operands_pass(rng):
    lhs, rhs, sizes = on_cpu(*operands(rng))
    want = np.asarray(te_async.grouped_gemm(lhs, rhs, sizes, group_sizes_mode="sync"))
    np.testing.assert_array_equal(guarded_gemm(lhs, rhs, sizes), want)  # eager
    np.testing.assert_array_equal(jax.jit(guarded_gemm)(lhs, rhs, sizes), want)  # one device
    for axis_type in (AxisType.Auto, AxisType.Explicit):
        m = mesh(axis_type)
        y = jax.jit(guarded_gemm)(*(put(m, a) for a in (lhs, rhs, sizes)))
        np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_sharded_operand_raises_at_compile_time_on_auto_axes(rng, which):
    args = list(operands(rng))
    args[which] = put(mesh(), args[which], "ep")
    message = rf"te_async.grouped_gemm got sharded operands \({ARGS[which]} .*shard_map"
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
        jax.jit(guarded_gemm)(*args)


def test_sharded_operand_raises_value_error_at_trace_time_on_explicit_axes(rng):
    lhs, rhs, sizes = operands(rng)
    with pytest.raises(ValueError, match=r"got sharded operands \(rhs \(8, 4, 3\) as P\('ep', None, None\)\)"):
        jax.jit(guarded_gemm).trace(lhs, put(mesh(AxisType.Explicit), rhs, "ep"), sizes)


def test_output_sharding_constraint_with_replicated_operands_passes(rng):
    lhs, rhs, sizes = operands(rng)
    m = mesh()
    f = jax.jit(lambda *a: jax.lax.with_sharding_constraint(guarded_gemm(*a), NamedSharding(m, P("ep"))))
    np.testing.assert_array_equal(f(lhs, rhs, sizes), raw_gemm(*on_cpu(lhs, rhs, sizes)))


def test_shard_map_body_runs_on_local_shards(rng):
    """Inside shard_map the call sees each device's shard: here 4 row blocks, all in group 0."""
    lhs, rhs, _ = operands(rng)
    sizes = jnp.zeros(G, jnp.int32).at[0].set(M // 4)
    m = mesh()
    f = jax.jit(jax.shard_map(guarded_gemm, mesh=m, in_specs=(P("ep"), P(), P()), out_specs=P("ep")))
    args = (put(m, lhs, "ep"), put(m, rhs), put(m, sizes))
    assert "all-gather" not in f.lower(*args).compile().as_text()
    want = np.concatenate([raw_gemm(*on_cpu(block, rhs, sizes)) for block in np.split(np.asarray(lhs), 4)])
    np.testing.assert_array_equal(f(*args), want)


def test_vmap_keeps_the_ffi_batching_and_the_guard(rng):
    lhs, rhs, sizes = operands(rng)
    batch = jnp.stack([lhs, 2 * lhs])
    got = jax.jit(jax.vmap(guarded_gemm, in_axes=(0, None, None)))(batch, rhs, sizes)
    np.testing.assert_array_equal(got, jax.vmap(raw_gemm, in_axes=(0, None, None))(batch, rhs, sizes))
    with pytest.raises(jax.errors.JaxRuntimeError, match="sharded operands"):
        jax.jit(jax.vmap(guarded_gemm, in_axes=(0, None, None)))(batch, put(mesh(), rhs, "ep"), sizes)


def test_tuple_results(rng):
    """Calls with several results (device mode's output and workspace) are guarded alike."""
    lhs, rhs, sizes = operands(rng)
    both = require_replicated(lambda a, b: (a @ b[0], jnp.sum(a)), "pair", ("a", "b"))
    out, total = jax.jit(both)(*(put(mesh(), a) for a in (lhs, rhs)))
    # Sums of O(1) terms that may cancel: an absolute bound beside the relative one (as below).
    np.testing.assert_allclose(out, lhs @ rhs[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(total, jnp.sum(lhs), rtol=1e-5, atol=1e-5)
    with pytest.raises(jax.errors.JaxRuntimeError, match=r"pair got sharded operands \(a "):
        jax.jit(both)(put(mesh(), lhs, "ep"), rhs)


def test_inside_custom_vjp_backward(rng):
    """grouped_mlp calls its GEMMs from a custom_vjp's forward and backward: the guard holds in
    both, and gradients of replicated operands are unchanged."""
    lhs, rhs, sizes = operands(rng)

    @jax.custom_vjp
    def layer(x, w):
        return guarded_gemm(x, w, sizes)

    def fwd(x, w):
        return layer(x, w), w

    def bwd(w, dy):
        return guarded_gemm(dy, jnp.swapaxes(w, 1, 2), sizes), None

    layer.defvjp(fwd, bwd)
    grad = jax.jit(jax.grad(lambda x, w: jnp.sum(layer(x, w))))
    want = np.repeat(np.asarray(rhs).sum(axis=2), np.asarray(sizes), axis=0)  # d sum(x @ w_g) / dx
    # float32 sums of O(1) terms in another order: a sum that cancels to near 0 keeps an absolute
    # error of about 1e-7 (CI saw 6e-8 at 0.0055), so a relative bound alone is not enough.
    np.testing.assert_allclose(grad(lhs, rhs), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(jax.errors.JaxRuntimeError, match="sharded operands"):
        grad(lhs, put(mesh(), rhs, "ep"))
