"""Bad group sizes and contradicting arguments raise, on the CPU in every mode, with sync mode's
messages: the CPU is where users debug, and there nothing stops an error from being raised. (On the
GPU device mode clamps and counts instead: tests/test_gpu_size_errors.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from helpers import gemm_operands, mlp_inputs, on_cpu

MODES = ("sync", "async", "device", None)
BAD = {
    "negative": ([5, -1, 3, 0], "negative group size -1 for group 1"),
    "past_m": ([5, 4, 3, 0], r"sum\(group_sizes\) = 12 exceeds the 10 rows"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("ragged, transpose_rhs", [("m", False), ("m", True), ("k", False)])
def test_grouped_gemm_raises_in_every_mode(rng, mode, bad, ragged, transpose_rhs):
    sizes, message = BAD[bad]
    lhs, rhs = on_cpu(*gemm_operands(rng, jnp.float32, 4, 10, 6, 5, ragged, transpose_rhs))
    gemm = lambda a, b, s: te_async.grouped_gemm(a, b, s, ragged=ragged, transpose_rhs=transpose_rhs,
                                                 group_sizes_mode=mode)
    for call in (gemm, jax.jit(gemm)):
        with pytest.raises(Exception, match=message):
            jax.block_until_ready(call(lhs, rhs, *on_cpu(jnp.asarray(sizes, jnp.int32))))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bad", BAD)
def test_grouped_mlp_raises_in_every_mode(rng, mode, bad):
    sizes, message = BAD[bad]
    _, p = mlp_inputs(rng, groups=4, rows=10, hidden=8, ffn=6, activation="swiglu", norm="rmsnorm")
    args = on_cpu(p["x"], jnp.asarray(sizes, jnp.int32), p["w_fc1"], p["w_fc2"])
    mlp = lambda x, s, a, b: te_async.grouped_mlp(x, s, a, b, norm_scale=p["norm_scale"], group_sizes_mode=mode)
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(jax.jit(mlp)(*args))
    loss = lambda x, s, a, b: jnp.sum(mlp(x, s, a, b).astype(jnp.float32))
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 2, 3)))(*args))


def test_zero_groups_has_its_own_message():
    lhs, rhs = jnp.zeros((4, 3), jnp.float32), jnp.zeros((0, 3, 2), jnp.float32)
    empty = jnp.zeros((0,), jnp.int32)
    with pytest.raises(ValueError, match="0 groups"):
        te_async.grouped_gemm(lhs, rhs, empty)
    with pytest.raises(ValueError, match="0 groups"):
        te_async.copy_group_sizes(empty)
    with pytest.raises(ValueError, match="too many groups"):
        te_async.copy_group_sizes(jnp.zeros((te_async.MAX_GROUPS + 1,), jnp.int32))


@pytest.mark.parametrize("mode", ["sync", "device"])
def test_contradicting_mode_arguments_raise(rng, mode):
    lhs, rhs = gemm_operands(rng, jnp.float32, 2, 4, 3, 2)
    sizes = jnp.asarray([2, 2], jnp.int32)
    with pytest.raises(ValueError, match="use_async_d2h_group_sizes=True asks for async mode"):
        te_async.grouped_gemm(lhs, rhs, sizes, group_sizes_mode=mode, use_async_d2h_group_sizes=True)
    with pytest.raises(ValueError, match="host_group_sizes is only used in async mode"):
        te_async.grouped_gemm(lhs, rhs, sizes, group_sizes_mode=mode, host_group_sizes=te_async.copy_group_sizes(sizes))
    _, p = mlp_inputs(rng, groups=2, rows=4, hidden=8, ffn=6, activation="swiglu", norm=None)
    with pytest.raises(ValueError, match="use_async_d2h_group_sizes=True asks for async mode"):
        te_async.grouped_mlp(p["x"], sizes, p["w_fc1"], p["w_fc2"], norm=None, group_sizes_mode=mode,
                             use_async_d2h_group_sizes=True)
    # The consistent spellings still work.
    out = te_async.grouped_gemm(lhs, rhs, sizes, group_sizes_mode="async", use_async_d2h_group_sizes=True)
    assert np.all(np.isfinite(np.asarray(out)))
