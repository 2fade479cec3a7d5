"""te_async.dense.linear against float64: both of its paths (te_async's kernels up to
dense.MAX_ROWS rows, XLA's GEMM past it and for transposed weights), the SwiGLU input, shapes that
are not multiples of 8, and its errors; on the GPU its two kernels (the CUDA-core small-M kernel
and the tensor-core one) at 1 to 16 rows (K split over a thread-block cluster where the columns
are few), every dtype they take, NaN-poisoned outputs under gpu_check.sh, bit-identical repeated
runs, and its gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async import dense
from helpers import TOL, cuda_stablehlo, on_gpu, small_groups_slices
from reference import rel_error

LIMIT = dense.MAX_ROWS


def operands(rng, lead, k, n, dtype, transpose_w=False, swiglu_input=False):
    x = jnp.asarray(rng.standard_normal((*lead, 2 * k if swiglu_input else k)), dtype)
    w = jnp.asarray(rng.standard_normal((n, k) if transpose_w else (k, n)) / np.sqrt(k), dtype)
    return x, w


def reference(x, w, transpose_w=False, swiglu_input=False):
    """float64 product; the SwiGLU input computed in float32 and rounded to x's dtype first, as the
    model's activation is. It is jnp's float32 silu, not a float64 one rounded to float32: the two
    differ by an ulp now and then, which can move a bfloat16 rounding by one step and the product
    past the float32 tolerance (seed 2610542248, CI on 2026-12-02)."""
    x64 = np.asarray(x, np.float64)
    if swiglu_input:
        gate, up = jnp.split(jnp.asarray(x, jnp.float32), 2, axis=-1)
        x64 = np.asarray((jax.nn.silu(gate) * up).astype(x.dtype), np.float64)
    w64 = np.asarray(w, np.float64)
    return x64 @ (w64.T if transpose_w else w64)


@pytest.mark.parametrize("lead", [(1,), (3, 1), (2, 5), (LIMIT,), (LIMIT + 1,), (4, 10)])
@pytest.mark.parametrize("transpose_w,swiglu_input", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("dtype,out", [(jnp.float32, None), (jnp.bfloat16, None), (jnp.bfloat16, jnp.float32)])
def test_linear_values(rng, lead, transpose_w, swiglu_input, dtype, out):
    k, n = int(rng.integers(1, 300)), int(rng.integers(1, 300))
    x, w = operands(rng, lead, k, n, dtype, transpose_w, swiglu_input)
    for kernel in ("auto", "xla") if transpose_w else dense.KERNELS:
        f = lambda x, w: dense.linear(x, w, transpose_w=transpose_w, preferred_element_type=out, kernel=kernel,
                                      swiglu_input=swiglu_input)
        y = jax.jit(f)(x, w)
        assert y.shape == (*lead, n) and y.dtype == jnp.dtype(out or dtype)
        assert rel_error(y, reference(x, w, transpose_w, swiglu_input)) < TOL[out or dtype], (lead, k, n, kernel)


def test_linear_errors():
    x = jnp.zeros((2, 8), jnp.float32)
    with pytest.raises(ValueError, match="do not fit"):
        dense.linear(x, jnp.zeros((9, 4), jnp.float32))
    with pytest.raises(ValueError, match="do not fit"):
        dense.linear(x, jnp.zeros((4, 9), jnp.float32), transpose_w=True)
    with pytest.raises(ValueError, match="do not fit"):  # swiglu_input halves x's width
        dense.linear(x, jnp.zeros((8, 4), jnp.float32), swiglu_input=True)
    with pytest.raises(ValueError, match="do not fit"):
        dense.linear(jnp.zeros((2, 7), jnp.float32), jnp.zeros((3, 4), jnp.float32), swiglu_input=True)
    with pytest.raises(TypeError, match="share one dtype"):
        dense.linear(x, jnp.zeros((8, 4), jnp.bfloat16))
    with pytest.raises(ValueError, match="kernel must be one of"):
        dense.linear(x, jnp.zeros((8, 4), jnp.float32), kernel="cublas")
    with pytest.raises(ValueError, match="reads w \\[K, N\\]"):
        dense.linear(x, jnp.zeros((4, 8), jnp.float32), transpose_w=True, kernel="te_async")
    with pytest.raises(ValueError, match="writes their dtype or float32"):
        dense.linear(x.astype(jnp.bfloat16), jnp.zeros((8, 4), jnp.bfloat16), preferred_element_type=jnp.float16,
                     kernel="te_async")


@pytest.mark.parametrize("rows,k,n,dtype,kernel", [
    (1, 64, 40, jnp.bfloat16, "cuda_core"), (2, 64, 40, jnp.float32, "cuda_core"),
    (3, 64, 40, jnp.bfloat16, "tensor_cores"), (16, 2048, 576, jnp.float16, "tensor_cores"),
    (17, 64, 40, jnp.bfloat16, "xla"), (8, 64, 40, jnp.float32, "xla"),  # past the tensor cores' rows; f32
    (8, 60, 40, jnp.bfloat16, "xla"), (8, 64, 36, jnp.bfloat16, "xla"),  # K not a multiple of 16; N of 8
])
def test_auto_rule(rows, k, n, dtype, kernel):
    """What "auto" lowers for a GPU (lowered here on any machine), and inside static_weight_slices,
    where XLA takes every GEMM past CUDA_CORE_ROWS rows."""
    x, w = jnp.zeros((rows, k), dtype), jnp.zeros((k, n), dtype)

    def lowered():
        return cuda_stablehlo(lambda x, w: dense.linear(x, w), x, w)

    text = lowered()
    assert ("te_async_dense_gemm" in text) == (kernel != "xla")
    assert ("tensor_cores = true" in text) == (kernel == "tensor_cores")
    with dense.static_weight_slices():
        assert ("te_async_dense_gemm" in lowered()) == (kernel == "cuda_core")
    assert lowered() == text, "the setting ends with its block"


def test_linear_gradients(rng):
    """The small-M path's gradients are XLA's GEMM's (a custom_vjp), with the SwiGLU input too."""
    x, w = operands(rng, (2,), 37, 19, jnp.float32, swiglu_input=True)
    loss = lambda kernel: lambda x, w: jnp.sum(dense.linear(x, w, kernel=kernel, swiglu_input=True) ** 2)
    got = jax.grad(loss("te_async"), argnums=(0, 1))(x, w)
    want = jax.grad(loss("xla"), argnums=(0, 1))(x, w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("rows,k,n,dtype,out,swiglu_input", [
    (1, 2048, 576, jnp.bfloat16, jnp.float32, False),     # DeepSeek-V2-Lite's kv_a: K split 8 ways
    (1, 2048, 3648, jnp.bfloat16, jnp.float32, False),    # its input projections, one GEMM
    (1, 2816, 2048, jnp.bfloat16, None, True),            # its shared experts' fc2, swiglu fused
    (2, 2048, 5632, jnp.bfloat16, None, False),           # their fc1
    (1, 2048, 64, jnp.float32, None, False),              # the router
    (3, 1000, 37, jnp.bfloat16, None, False),             # unaligned N: the scalar path
    (5, 1001, 300, jnp.float16, jnp.float32, True),       # K not a multiple of the slice granule
    (8, 4096, 96, jnp.bfloat16, None, False),
    (11, 700, 264, jnp.float32, None, True),              # two row chunks
    (1, 64, 4100, jnp.bfloat16, None, False),             # many column tiles, no split
    # the tensor-core kernel (bf16 / f16, K a multiple of 16, N of 8, past CUDA_CORE_ROWS rows)
    (3, 2048, 3648, jnp.bfloat16, jnp.float32, False),    # DeepSeek-V2-Lite's input projections at 3 rows
    (8, 7168, 576, jnp.bfloat16, None, False),            # DeepSeek-V3's kv_a: few column tiles, K split
    (16, 2816, 2048, jnp.bfloat16, None, True),           # 16 rows, swiglu fused
    (9, 1536, 4104, jnp.float16, None, False),            # a last tile of 8 columns
    (12, 16, 72, jnp.float16, jnp.float32, True),         # one k-step: most warps add nothing
    (4, 18432, 128, jnp.bfloat16, jnp.float32, False),    # long K over a cluster
])
def test_kernel_gpu(rng, rows, k, n, dtype, out, swiglu_input):
    check_kernel(rng, rows, k, n, dtype, out, swiglu_input)


def check_kernel(rng, rows, k, n, dtype, out, swiglu_input):
    """kernel="te_async" against float64, on the tensor cores exactly where "auto" would take them,
    and bit-identical over two runs."""
    x, w = operands(rng, (rows,), k, n, dtype, swiglu_input=swiglu_input)
    f = jax.jit(lambda x, w: dense.linear(x, w, preferred_element_type=out, kernel="te_async", swiglu_input=swiglu_input))
    text = f.lower(on_gpu(x), on_gpu(w)).as_text()
    tensor_cores = (dtype != jnp.float32 and dense.CUDA_CORE_ROWS < rows <= dense.TENSOR_CORE_MAX_ROWS
                    and k % 16 == 0 and n % 8 == 0)
    assert "te_async_dense_gemm" in text and f"tensor_cores = {str(tensor_cores).lower()}" in text
    y = np.asarray(f(on_gpu(x), on_gpu(w)), np.float64)
    assert rel_error(y, reference(x, w, swiglu_input=swiglu_input)) < TOL[out or dtype] * (10 if out else 1), (rows, k, n)
    assert np.array_equal(y, np.asarray(f(on_gpu(x), on_gpu(w)), np.float64)), "slice sums must not depend on the run"


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 15, 16])
@pytest.mark.parametrize("dtype,out,swiglu_input", [(jnp.bfloat16, None, False), (jnp.float16, jnp.float32, True)])
def test_tensor_cores_every_row_count(rng, monkeypatch, rows, dtype, out, swiglu_input):
    """The tensor-core kernel at every row count it takes, the first two included (where "auto" runs
    the CUDA-core kernel): rows past M are zero in its A fragments and never written."""
    monkeypatch.setattr(dense, "CUDA_CORE_ROWS", 0)
    check_kernel(rng, rows, int(rng.integers(1, 40)) * 16, int(rng.integers(1, 90)) * 8, dtype, out, swiglu_input)


@pytest.mark.gpu
def test_tensor_cores_reject_what_they_cannot_run():
    """The handler's check of the Python rule: a call the tensor-core kernel cannot run is an error."""
    x, w = on_gpu(jnp.ones((4, 32), jnp.float32)), on_gpu(jnp.ones((32, 8), jnp.float32))
    with pytest.raises(Exception, match="tensor_cores takes bf16 or f16"):
        jax.block_until_ready(dense._kernel(x, w, jnp.float32, False, True))


@pytest.mark.gpu
def test_kernel_splits_small_n():
    """Where the column tiles are few, K is split over a cluster (Hopper and up)."""
    if float(jax.devices("gpu")[0].compute_capability) < 9.0:
        pytest.skip("thread-block clusters need compute capability 9.0")
    assert small_groups_slices(1, 1, 2048, 576, jnp.bfloat16) == 8
    assert small_groups_slices(1, 1, 64, 4100, jnp.bfloat16) == 1

