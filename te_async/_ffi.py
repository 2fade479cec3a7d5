"""Loads the compiled handlers and registers them with XLA once, at import.

The CPU extension always exists. The CUDA one exists when the package was built with a CUDA
toolkit; it needs no GPU to import, so registering it is harmless on a CPU-only machine.
"""

import atexit
import functools
import os

import jax

from . import _te_async_cpu

try:
    from . import _te_async_cuda
except ImportError:  # built without a CUDA toolkit
    _te_async_cuda = None

MAX_GROUPS: int = _te_async_cpu.MAX_GROUPS

COPY_GROUP_SIZES = "te_async_copy_group_sizes"
GROUPED_GEMM = "te_async_grouped_gemm"
GROUPED_GEMM_DEVICE = "te_async_grouped_gemm_device"


def _register() -> None:
    for name, capsule in _te_async_cpu.registrations().items():
        jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    if _te_async_cuda is not None:
        for name, capsule in _te_async_cuda.registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
        # Pinned slots, streams and cuBLAS handles must go while the CUDA context still lives.
        atexit.register(_te_async_cuda.release)


_register()


def cuda_extension_built() -> bool:
    return _te_async_cuda is not None


def host_size_stats(device: int = 0) -> dict:
    """Counters of the CUDA group-sizes machinery on one device (all zero before first use).

    copies: copy_group_sizes calls; event_waits: GEMMs served from a pinned slot; sync_reads:
    GEMMs in sync mode; fallback_reads: async GEMMs that had to read synchronously.
    """
    if _te_async_cuda is None:
        return {"copies": 0, "event_waits": 0, "sync_reads": 0, "fallback_reads": 0}
    return dict(_te_async_cuda.host_size_stats(device))


def gpu_present() -> bool:
    if _te_async_cuda is None:
        return False
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@functools.lru_cache(maxsize=None)
def device_plan(groups: int, rows: int, k: int, n: int, ragged_k: bool, transpose_rhs: bool, in_dtype: str,
                out_dtype: str) -> tuple:
    """(kernel, workspace bytes) of a device-mode call on GPU 0; ("cpu", 0) without a GPU. The
    kernel is "small_groups", "portable", or the CUTLASS config name ("cutlass_sm90_...").

    The choice depends on static shapes only, so it is made at trace time and the workspace comes
    with the call as an extra result: the handler allocates nothing, as a CUDA graph requires.
    """
    if not gpu_present():
        return "cpu", 0
    _check_kernel_rule_env()
    return tuple(_te_async_cuda.device_plan(groups, rows, k, n, ragged_k, transpose_rhs, in_dtype, out_dtype, 0))


def cutlass_configs(form: str) -> list:
    """The CUTLASS configs a form ("m", "mt", "k") can run, the values TE_ASYNC_CUTLASS_CONFIG
    accepts; empty where CUTLASS is not built."""
    if _te_async_cuda is None:
        return []
    return list(_te_async_cuda.CUTLASS_CONFIGS.get(form, []))


def device_kernel_choice(*args, **kwargs) -> str:
    """The C++ kernel rule (csrc/device_kernel_choice.h) for any target, GPU or not."""
    _check_kernel_rule_env()
    return _te_async_cpu.device_kernel_choice(*args, **kwargs)


SMALL_GROUPS_MAX_ROWS_ENV = "TE_ASYNC_SMALL_GROUPS_MAX_ROWS"


def _check_kernel_rule_env() -> None:
    """The C++ rule reads TE_ASYNC_SMALL_GROUPS_MAX_ROWS once, with no error path (a typo would read
    as 0 rows, i.e. never small_groups), so a value that is not a row count is refused here,
    before the rule first runs."""
    value = os.environ.get(SMALL_GROUPS_MAX_ROWS_ENV)
    if value is not None and not value.strip().isdigit():
        raise ValueError(f"{SMALL_GROUPS_MAX_ROWS_ENV}={value!r}: expected a non-negative whole number of rows")


def device_mode_is_fast(groups: int, rows: int, k: int, n: int, dtype: str) -> bool:
    """Whether device mode has a fast kernel for a ragged-m GEMM of this shape (and for the wgrad
    of its rows): always off the GPU, where every mode runs the same reference; on the GPU where
    device_plan picks a kernel other than the portable SIMT one, i.e. at decode sizes (small_groups)
    and, when built, on CUTLASS. The portable kernel is correct but far slower than cuBLAS."""
    return device_plan(groups, rows, k, n, False, False, dtype, dtype)[0] != "portable"
