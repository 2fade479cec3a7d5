"""te_async.dense.linear against float64: both of its paths (te_async's small-M kernel up to
dense.MAX_ROWS rows, XLA's GEMM past it), both weight layouts, shapes that are not
multiples of 8, and its errors; on the GPU also the plan it runs (small_groups, K split across the
SMs where the columns are few) and bit-identical repeated runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async import dense
from helpers import TOL, device_plan, on_gpu
from reference import rel_error

LIMIT = dense.MAX_ROWS


def operands(rng, lead, k, n, dtype, transpose_w):
    x = jnp.asarray(rng.standard_normal((*lead, k)), dtype)
    w = jnp.asarray(rng.standard_normal((n, k) if transpose_w else (k, n)) / np.sqrt(k), dtype)
    return x, w


def reference(x, w, transpose_w):
    w64 = np.asarray(w, np.float64)
    return np.asarray(x, np.float64) @ (w64.T if transpose_w else w64)


@pytest.mark.parametrize("lead", [(1,), (3, 1), (2, 5), (LIMIT,), (LIMIT + 1,), (4, 10)])
@pytest.mark.parametrize("transpose_w", [False, True])
@pytest.mark.parametrize("dtype,out", [(jnp.float32, None), (jnp.bfloat16, None), (jnp.bfloat16, jnp.float32)])
def test_linear_values(rng, lead, transpose_w, dtype, out):
    k, n = int(rng.integers(1, 300)), int(rng.integers(1, 300))
    x, w = operands(rng, lead, k, n, dtype, transpose_w)
    for kernel in dense.KERNELS:
        y = jax.jit(lambda x, w: dense.linear(x, w, transpose_w=transpose_w, preferred_element_type=out, kernel=kernel))(x, w)
        assert y.shape == (*lead, n) and y.dtype == jnp.dtype(out or dtype)
        assert rel_error(y, reference(x, w, transpose_w)) < TOL[out or dtype], (lead, k, n, kernel)


def test_linear_errors():
    x = jnp.zeros((2, 8), jnp.float32)
    with pytest.raises(ValueError, match="do not fit"):
        dense.linear(x, jnp.zeros((9, 4), jnp.float32))
    with pytest.raises(ValueError, match="do not fit"):
        dense.linear(x, jnp.zeros((4, 9), jnp.float32), transpose_w=True)
    with pytest.raises(TypeError, match="share one dtype"):
        dense.linear(x, jnp.zeros((8, 4), jnp.bfloat16))
    with pytest.raises(ValueError, match="kernel must be one of"):
        dense.linear(x, jnp.zeros((8, 4), jnp.float32), kernel="cublas")


@pytest.mark.gpu
@pytest.mark.parametrize("rows,k,n,transpose_w", [(1, 2048, 576, False), (1, 2816, 2048, False), (LIMIT, 2048, 5632, False),
                                                  (LIMIT, 1000, 37, False), (1, 2048, 3000, True)])
def test_linear_gpu(rng, rows, k, n, transpose_w):
    """DeepSeek-V2-Lite's decode GEMMs (and odd ones) run small_groups (the [K, N] ones with K split
    across the SMs); NaN-poisoned outputs under gpu_check.sh."""
    x, w = operands(rng, (rows,), k, n, jnp.bfloat16, transpose_w)
    p = device_plan(1, rows, k, n, "m", transpose_w, jnp.bfloat16, jnp.float32)
    assert p.kernel == "small_groups", p
    f = jax.jit(lambda x, w: dense.linear(x, w, transpose_w=transpose_w, preferred_element_type=jnp.float32))
    x, w = on_gpu(x), on_gpu(w)
    y = np.asarray(f(x, w))
    assert rel_error(y, reference(x, w, transpose_w)) < TOL[jnp.float32] * 10
    assert np.array_equal(y, np.asarray(f(x, w))), "split-K sums must not depend on the run"
