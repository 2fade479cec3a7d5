"""Device mode on the GPU cannot raise from inside a CUDA graph: it clamps invalid group sizes (a
negative size counts as 0, groups are cut at row M) and counts the call in te_async.size_errors(),
which a user reads after a step. Checked for each kernel and form, eagerly and in jitted steps
(CUDA graphs replay the count too)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from helpers import TOL, cutlass_runs, device_plan, gemm_operands, mlp_inputs, on_gpu
from reference import grouped_gemm_reference, mlp_reference, rel_error

pytestmark = pytest.mark.gpu

# (kernel, dtype, groups, rows, k, n): shapes that each kernel's plan takes (checked below).
CASES = [
    ("small_groups", jnp.bfloat16, 8, 12, 64, 40),
    ("cutlass_sm90", jnp.bfloat16, 8, 200, 64, 64),
    ("portable", jnp.float32, 8, 600, 6, 5),
]


def clamp(sizes, rows: int) -> np.ndarray:
    """Device mode's reading of invalid sizes (csrc/cuda/group_layout.cuh)."""
    ends = np.minimum(np.cumsum(np.maximum(sizes, 0)), rows)
    return np.diff(np.concatenate([[0], ends])).astype(np.int32)


def bad_sizes(rng, groups: int, rows: int) -> dict:
    sizes = rng.multinomial(rows, np.ones(groups) / groups).astype(np.int32)
    negative = sizes.copy()
    negative[1] = -3
    past_m = sizes.copy()
    past_m[-2] += 7
    return {"negative": negative, "past_m": past_m, "valid": sizes}


@pytest.mark.parametrize("kernel, dtype, groups, rows, k, n", CASES)
@pytest.mark.parametrize("ragged, transpose_rhs", [("m", False), ("m", True), ("k", False)])
def test_clamped_calls_are_counted(rng, kernel, dtype, groups, rows, k, n, ragged, transpose_rhs):
    planned = device_plan(groups, rows, k, n, ragged, transpose_rhs, dtype).kernel
    if kernel == "cutlass_sm90" and not cutlass_runs():
        pytest.skip("needs the CUTLASS kernels on a Hopper GPU")
    if ragged == "k" and kernel == "small_groups":
        pytest.skip("small_groups runs ragged m only")
    assert planned == kernel
    lhs, rhs = gemm_operands(rng, dtype, groups, rows, k, n, ragged, transpose_rhs)
    gemm = jax.jit(lambda a, b, s: te_async.grouped_gemm(a, b, s, ragged=ragged, transpose_rhs=transpose_rhs,
                                                         group_sizes_mode="device"))
    for name, sizes in bad_sizes(rng, groups, rows).items():
        before = te_async.size_errors()
        for _ in range(3):  # the first call records the command buffer, the others replay it
            out = jax.block_until_ready(gemm(on_gpu(lhs), on_gpu(rhs), on_gpu(jnp.asarray(sizes))))
        assert te_async.size_errors() - before == (0 if name == "valid" else 3), (name, sizes)
        want = grouped_gemm_reference(lhs, rhs, clamp(sizes, rows), ragged, transpose_rhs)
        assert rel_error(out, want) < TOL[dtype], name


def test_grouped_mlp_counts_each_gemm(rng):
    sizes, p = mlp_inputs(rng, groups=8, rows=12, hidden=64, ffn=40, activation="swiglu", norm="rmsnorm",
                          dtype=jnp.bfloat16)
    sizes = sizes.copy()
    sizes[0] = -5
    mlp = jax.jit(lambda x, s, a, b, g: te_async.grouped_mlp(x, s, a, b, norm_scale=g, group_sizes_mode="device"))
    before = te_async.size_errors()
    out = mlp(*map(on_gpu, (p["x"], jnp.asarray(sizes), p["w_fc1"], p["w_fc2"], p["norm_scale"])))
    out = jax.block_until_ready(out)
    assert te_async.size_errors() - before == 2  # fc1 and fc2
    want = mlp_reference(p["x"], clamp(sizes, 12), p["w_fc1"], p["w_fc2"], p["norm_scale"])
    assert rel_error(out, want) < 2e-2
