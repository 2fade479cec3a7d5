"""Loads the compiled handlers and registers them with XLA once, at import.

The CPU extension always exists. The CUDA one exists when the package was built with a CUDA
toolkit (and TE_ASYNC_WITH_CUDA on); it needs no GPU to import, so registering it is harmless on a
CPU-only machine.
"""

import atexit
import os

import jax

try:
    from . import _te_async_cpu
except ImportError as e:  # the source folder, which has no compiled modules, shadows the package
    raise ImportError(
        "te_async's compiled modules are missing. Python imported te_async from the source folder "
        f"{os.path.dirname(__file__)}, which has none: install the package (bash tools/run_tests.sh, "
        "or pip install .) and run from another folder, or with `python -P` to keep the current folder off "
        "sys.path."
    ) from e

try:
    from . import _te_async_cuda
except ImportError:  # built without a CUDA toolkit
    _te_async_cuda = None

MAX_GROUPS: int = _te_async_cpu.MAX_GROUPS
SMALL_GROUPS_MAX_ROWS: int = _te_async_cpu.SMALL_GROUPS_MAX_ROWS
DENSE_MMA_MAX_ROWS: int = _te_async_cpu.DENSE_MMA_MAX_ROWS
kernel_rule = _te_async_cpu.kernel_rule

COPY_GROUP_SIZES = "te_async_copy_group_sizes"
KEEP_GROUP_SIZES = "te_async_keep_group_sizes"
REUSE_GROUP_SIZES = "te_async_reuse_group_sizes"
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


def cuda_module():
    """The compiled CUDA extension, or None."""
    return _te_async_cuda


def cuda_extension_built() -> bool:
    return _te_async_cuda is not None


def gpu_present() -> bool:
    if _te_async_cuda is None:
        return False
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


def host_size_stats(device: int = 0) -> dict:
    """Counters of the host-sized modes on one device (all zero before first use).

    copies: device-to-host copies issued (copy_group_sizes calls and reuse misses); event_waits:
    GEMMs served from a pinned slot; sync_reads: GEMMs in sync mode; fallback_reads: async GEMMs
    whose slot was gone, read synchronously; reused: backward passes served by their forward's copy
    (reuse_group_sizes); reused_by_order: of those, the ones found as the newest unclaimed forward
    copy (a scan's stacked handles), not by address; reuse_misses: backward passes that issued a
    fresh copy instead; per_group_gemms: cuBLAS GEMMs launched one per non-empty group (sync
    mode, TE's launches); grouped_calls: host-sized GEMMs whose groups went out in one grouped
    cuBLAS call (async mode);
    repaired_reads: async GEMMs whose pinned sizes the GPU found stale and recomputed (a device
    counter: read after the step, it costs a synchronous copy).
    """
    if not gpu_present():
        return dict.fromkeys(("copies", "event_waits", "sync_reads", "fallback_reads", "reused", "reused_by_order",
                              "reuse_misses", "per_group_gemms", "grouped_calls", "repaired_reads"), 0)
    stats = dict(_te_async_cuda.host_size_stats(device))
    stats["repaired_reads"] = _te_async_cuda.device_counters(device)["repaired_reads"]
    return stats


def size_errors(device: int = 0) -> int:
    """How many device-mode GEMM calls on GPU `device` received invalid group sizes (a negative
    size, or a sum past the rows) and clamped them, since the process started.

    Inside a CUDA graph a call cannot raise, so it counts instead: check this after a step (it
    costs a synchronous copy; the step pays nothing). Always 0 off the GPU, where every mode raises.
    """
    if not gpu_present():
        return 0
    return int(_te_async_cuda.device_counters(device)["clamped_calls"])
