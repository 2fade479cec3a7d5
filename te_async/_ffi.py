"""Loads the compiled handlers and registers them with XLA once, at import.

The CPU extension always exists. The CUDA one exists when the package was built with a CUDA
toolkit; it needs no GPU to import, so registering it is harmless on a CPU-only machine.
"""

import atexit

import jax

from . import _te_async_cpu

try:
    from . import _te_async_cuda
except ImportError:  # built without a CUDA toolkit
    _te_async_cuda = None

MAX_GROUPS: int = _te_async_cpu.MAX_GROUPS

COPY_GROUP_SIZES = "te_async_copy_group_sizes"
GROUPED_GEMM = "te_async_grouped_gemm"


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
