"""A dense x @ w that reads its weights near the bandwidth floor at decode sizes.

At a decode step a dense layer's GEMM (attention projections, shared experts, dense MLP layers,
routers) has as many rows as the batch, and its time is the read of its weights. Inside a scan
over stacked layers XLA copies each weight slice that one of its GEMMs reads (a memcpy per GEMM
and step), and at one row it runs the GEMM as a multiply fusion that writes the f32 product and a
reduction that reads it back. te_async's small-M kernel (csrc/cuda/dense_gemm.cc, on
small_groups) avoids both: XLA hands a scanned weight slice to a custom call in place, and the
kernel reads each weight once, splitting K over a thread-block cluster when the columns alone
would leave most SMs idle, so that each GEMM is one kernel with no workspace, inside the step's
CUDA graph. It also applies a SwiGLU MLP's activation as its second GEMM loads its input
(swiglu_input), one kernel fewer per MLP. ("In place" is a dynamic-slice fusion around the call,
which costs each scan trip 11-20 us of host time per such call on an H200,
tools/scan_trip_probe.py: hidden where a layer keeps the GPU busy longer, as in the models' decode
step; docs/investigations.md, "Stacked weights read in place".)

That kernel spends one FMA per weight element and row, so past CUDA_CORE_ROWS rows its
instruction issue, not the HBM, sets its time; there bf16 and f16 GEMMs whose K is a multiple of
16 and N of 8 run a tensor-core kernel instead (csrc/cuda/dense_mma.cu: one mma per 8 columns and
16 k-rows takes up to 16 rows at the cost of one, split K as above). linear() takes te_async's
kernels up to MAX_ROWS rows ([K, N] weights only; past CUDA_CORE_ROWS only where the tensor-core
kernel fits) and XLA's GEMM otherwise: for transposed weights (the LM head, [V, H]: XLA's GEMM
took 93 us of GPU time at one row against 101 for small_groups' [N, K] kernel on an H200), off
the GPU, and past CUDA_CORE_ROWS inside static_weight_slices(). docs/internals.md (tables DN and DM) has the measurements behind the two limits.
"""

import contextlib
import contextvars
import functools
import math

import jax
import jax.numpy as jnp

from . import _ffi, mixed_precision
from .mlp import activate

MAX_ROWS = 16  # rows up to which linear() runs te_async's kernels (see the module docstring)
CUDA_CORE_ROWS = 2  # rows up to which they run the CUDA-core small-M kernel, past which the tensor-core one
TENSOR_CORE_MAX_ROWS = _ffi.DENSE_MMA_MAX_ROWS  # the tensor-core kernel's limit
TENSOR_CORE_DTYPES = ("bfloat16", "float16")
_STATIC_SLICES = contextvars.ContextVar("te_async_dense_static_slices", default=False)
KERNELS = ("auto", "te_async", "xla")
DTYPES = ("bfloat16", "float16", "float32")  # the kernel's inputs; it writes their dtype or float32
DENSE_GEMM = "te_async_dense_gemm"


def linear(x: jax.Array, w: jax.Array, *, transpose_w: bool = False, preferred_element_type=None,
           kernel: str = "auto", swiglu_input: bool = False) -> jax.Array:
    """x [..., K] @ w [K, N] (w [N, K] with transpose_w) -> [..., N], accumulated in float32 from
    exact products (float32 inputs are not rounded to TF32) and returned in preferred_element_type
    (default x's dtype). x and w share a dtype. With swiglu_input, x is [..., 2K] = [gate | up] and
    the product reads te_async.mlp.activate(x, "swiglu") (silu(gate) * up in float32, rounded to
    x's dtype): a SwiGLU MLP's second GEMM. kernel: "auto" (te_async's small-M kernel up to MAX_ROWS
    rows, XLA's GEMM past them and for transpose_w), or "te_async" or "xla" whatever the rows (to
    compare; "te_async" reads w [K, N] only, on tensor cores where they would run under "auto")."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "te_async" and transpose_w:
        raise ValueError("kernel='te_async' reads w [K, N]; transpose_w runs XLA's GEMM (kernel='auto' or 'xla')")
    *lead, width = x.shape
    k = width // 2 if swiglu_input else width
    if w.ndim != 2 or (w.shape[1] if transpose_w else w.shape[0]) != k or (swiglu_input and width % 2):
        raise ValueError(f"linear: x {x.shape} and w {w.shape} (transpose_w={transpose_w}, "
                         f"swiglu_input={swiglu_input}) do not fit")
    if x.dtype != w.dtype:
        raise TypeError(f"linear: x and w must share one dtype, got {x.dtype} and {w.dtype}")
    rows, n = math.prod(lead), w.shape[0] if transpose_w else w.shape[1]
    out_type = jnp.dtype(preferred_element_type or x.dtype)
    runs = x.dtype.name in DTYPES and out_type in (x.dtype, jnp.float32)
    if kernel == "te_async" and not runs:
        raise ValueError(f"kernel='te_async' takes {DTYPES} inputs and writes their dtype or float32, "
                         f"got {x.dtype} -> {out_type}")
    tensor_cores = (x.dtype.name in TENSOR_CORE_DTYPES and CUDA_CORE_ROWS < rows <= TENSOR_CORE_MAX_ROWS
                    and k % 16 == 0 and n % 8 == 0)
    small_m = kernel == "te_async" or (kernel == "auto" and runs and not transpose_w and 0 < rows <= MAX_ROWS
                                       and (rows <= CUDA_CORE_ROWS or (tensor_cores and not _STATIC_SLICES.get())))
    if not small_m:
        return _xla(x, w, out_type, transpose_w, swiglu_input)
    y = _small_m(x.reshape(rows, width), w, out_type, swiglu_input, tensor_cores)
    return y.reshape(*lead, n)


@contextlib.contextmanager
def static_weight_slices():
    """Calls of linear() traced inside leave their GEMMs of more than CUDA_CORE_ROWS rows to XLA
    ("auto" only): for weights that are static slices of stacked arrays, as in a decode step with
    its layers written out, which XLA's GEMM reads in place, so that there is no copy to avoid,
    and which it ran faster than the tensor-core kernel at DeepSeek-V3's widths (an H200,
    2026-12-03, generate's loop at batch 8: 4.57 against 4.82 ms per token; scanned, where XLA
    copies each slice first, the tensor-core kernel made the step 1.34x faster)."""
    token = _STATIC_SLICES.set(True)
    try:
        yield
    finally:
        _STATIC_SLICES.reset(token)


def _xla(x, w, out_type, transpose_w=False, swiglu_input=False):
    """XLA's GEMM; its gradient's GEMMs read the operands' dtype (te_async.mixed_precision). Its
    SwiGLU is jax.checkpoint'ed: differentiated, it keeps its bf16 input alone and recomputes its
    float32 values in the backward, where JAX would keep five float32 arrays of the input's size
    (a DeepSeek-V2-Lite shared expert at 4096 tokens: 230 MB a layer)."""
    if swiglu_input:
        x = _swiglu(x)
    lead = "abcdefghij"[:x.ndim - 1]  # x's leading axes (linear's "...")
    spec = f"{lead}k,nk->{lead}n" if transpose_w else f"{lead}k,kn->{lead}n"
    return mixed_precision.einsum(spec, x, w, precision=jax.lax.Precision.HIGHEST).astype(out_type)


_swiglu = jax.checkpoint(functools.partial(activate, activation="swiglu"))


def _kernel(x, w, out_type, swiglu_input, tensor_cores):
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), out_type)
    return jax.ffi.ffi_call(DENSE_GEMM, out, vmap_method="sequential")(x, w, swiglu=swiglu_input,
                                                                       tensor_cores=tensor_cores)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _small_m(x, w, out_type, swiglu_input, tensor_cores):
    # The kernel where the call is lowered for a GPU; elsewhere XLA's GEMM of the same math.
    kernel = functools.partial(_kernel, out_type=out_type, swiglu_input=swiglu_input, tensor_cores=tensor_cores)
    return jax.lax.platform_dependent(x, w, cuda=kernel,
                                      default=functools.partial(_xla, out_type=out_type, swiglu_input=swiglu_input))


def _small_m_fwd(x, w, out_type, swiglu_input, tensor_cores):
    return _small_m(x, w, out_type, swiglu_input, tensor_cores), (x, w)


def _small_m_bwd(out_type, swiglu_input, tensor_cores, residuals, dy):
    """The gradients of XLA's GEMM of the same math (decode needs none; training shapes run XLA)."""
    return jax.vjp(functools.partial(_xla, out_type=out_type, swiglu_input=swiglu_input), *residuals)[1](dy)


_small_m.defvjp(_small_m_fwd, _small_m_bwd)
