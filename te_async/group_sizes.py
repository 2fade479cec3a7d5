"""Group-sizes modes, copy_group_sizes and the HostGroupSizes handle.

A host-sized grouped GEMM must know the group sizes on the host. Reading them inside each GEMM
(TE's behaviour, mode "sync") stalls the host until the GPU drains. copy_group_sizes instead
enqueues the device-to-host copy early, into a pinned slot, and records a CUDA event; GEMMs that
take the handle wait for that event only (mode "async"), and the GPU checks the sizes they used
against the handle (csrc/cuda/host_sizes_guard.h). Mode "device", the default where it has fast
kernels, never copies: its kernels read the sizes on the GPU, so the call can sit inside a CUDA graph.
"""

import itertools
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from . import _ffi

GROUP_SIZES_MODES = ("sync", "async", "device")


class HostGroupSizes(NamedTuple):
    """The handle copy_group_sizes returns.

    `device_sizes` is a device snapshot of the sizes. Consumers take it as an operand: that data
    dependency orders the copy before them (no side effects needed), and its buffer address finds
    the pinned slot. Consume it in the same jitted computation (or scan body) that made it: that is
    where the lookup finds its own copy. Wherever XLA moves it, the result stays right: a slot that
    is gone is read synchronously (host_size_stats()["fallback_reads"]) and a stale one is redone
    on the GPU (host_size_stats()["repaired_reads"]).
    """

    device_sizes: jax.Array


def check_group_sizes(group_sizes) -> None:
    """Raises before lowering for what the type of group_sizes already tells."""
    if group_sizes.dtype != jnp.int32 or group_sizes.ndim != 1:
        raise TypeError(f"group_sizes must be int32 [G], got {group_sizes.dtype} {tuple(group_sizes.shape)}")
    if group_sizes.shape[0] == 0:
        raise ValueError("group_sizes has 0 groups; a grouped GEMM needs at least 1")
    if group_sizes.shape[0] > _ffi.MAX_GROUPS:
        raise ValueError(f"too many groups: {group_sizes.shape[0]} (at most {_ffi.MAX_GROUPS})")


def copy_group_sizes(group_sizes: jax.Array) -> HostGroupSizes:
    """Starts the device-to-host copy of `group_sizes` now and returns at once.

    Call it right after routing, before the token permutation, so that the copy overlaps the
    dispatch; then pass the handle as `host_group_sizes=` to grouped_gemm or grouped_mlp.
    """
    group_sizes = jnp.asarray(group_sizes)
    check_group_sizes(group_sizes)
    snapshot = jax.ffi.ffi_call(
        _ffi.COPY_GROUP_SIZES,
        jax.ShapeDtypeStruct(group_sizes.shape, jnp.int32),
        vmap_method="sequential",
    )(group_sizes)
    return HostGroupSizes(snapshot)


_keep_ids = itertools.count()


def keep_group_sizes(handle: Optional[HostGroupSizes], forward_input: jax.Array) -> Optional[HostGroupSizes]:
    """A forward's `handle` as the residual its backward passes to reuse_group_sizes (None stays
    None): a copy of the handle, filed under the same pinned slot for one reuse.

    Each keep must run once per forward, so that each backward finds one: `forward_input` (the
    forward's input, e.g. its GEMM's lhs; an operand the handler does not read) ties it to its
    layer's data, which keeps JAX's scan from hoisting it out of the loop when every layer shares
    one copy (its partial evaluation computes loop-invariant residuals once), and an id attribute
    per traced call keeps XLA from merging two keeps of one copy and one input (gate and up
    projections)."""
    if handle is None:
        return None
    if not isinstance(forward_input, jax.Array):
        raise TypeError(f"keep_group_sizes takes the forward's input as an array, got {type(forward_input).__name__}")
    return HostGroupSizes(_handle_call(_ffi.KEEP_GROUP_SIZES, "keep_group_sizes", handle, forward_input,
                                       id=next(_keep_ids)))


def reuse_group_sizes(kept: HostGroupSizes) -> HostGroupSizes:
    """The handle of a backward pass, made from the residual its forward kept (keep_group_sizes):
    where the forward's pinned slot still holds its copy, the new handle is filed under that slot
    and nothing is copied (the backward's GEMMs wait on an event that fired long ago;
    host_size_stats()["reused"]). The residual is found by its address, or, where it reaches the
    backward at an address of its own (a slice of a scan's stacked residuals), as the newest kept
    copy of the same execution that no backward took: a backward runs the layers last to first,
    so that is the layer's own (["reused_by_order"]). Where the slot has been recycled (64 copies
    later) or the forward ran in another execution, it issues a fresh copy (["reuse_misses"]). A
    wrong guess cannot give a wrong result: the GEMMs check pinned sizes on the GPU
    (repaired_reads).
    """
    return HostGroupSizes(_handle_call(_ffi.REUSE_GROUP_SIZES, "reuse_group_sizes", kept))


def _handle_call(target: str, name: str, handle: HostGroupSizes, *operands, **attrs) -> jax.Array:
    """The FFI call `target` on a handle (and `operands`): a new int32 [G] snapshot of the same sizes."""
    if not isinstance(handle, HostGroupSizes):
        raise TypeError(f"{name} takes a handle from copy_group_sizes, got {type(handle).__name__}")
    check_group_sizes(handle.device_sizes)
    return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(handle.device_sizes.shape, jnp.int32),
                            vmap_method="sequential")(handle.device_sizes, *operands, **attrs)


def resolve_group_sizes_mode(
    group_sizes_mode: Optional[str],
    use_async_d2h_group_sizes: bool,
    host_group_sizes: Optional[HostGroupSizes],
    device_is_fast: Callable[[], bool] = lambda: True,
) -> str:
    """One mode from the explicit name, or from TE's spelling `use_async_d2h_group_sizes`; a
    contradiction between them (or with `host_group_sizes`, which only async mode reads) raises.

    With neither: "device" where it has a fast kernel for every GEMM of the call (`device_is_fast()`,
    asked only then), else "async", the fastest host-sized mode.
    """
    if group_sizes_mode is not None and group_sizes_mode not in GROUP_SIZES_MODES:
        raise ValueError(f"group_sizes_mode must be one of {GROUP_SIZES_MODES} or None, got {group_sizes_mode!r}")
    if group_sizes_mode not in (None, "async"):
        if use_async_d2h_group_sizes:
            raise ValueError(f"use_async_d2h_group_sizes=True asks for async mode, but group_sizes_mode="
                             f"{group_sizes_mode!r}: pass one of the two")
        if host_group_sizes is not None:
            raise ValueError(f"host_group_sizes is only used in async mode, not {group_sizes_mode!r}")
    if group_sizes_mode is None:
        if use_async_d2h_group_sizes or host_group_sizes is not None or not device_is_fast():
            return "async"
        return "device"
    return group_sizes_mode


def async_handle(group_sizes, mode: str, host_group_sizes: Optional[HostGroupSizes]) -> Optional[HostGroupSizes]:
    """The handle an async-mode call reads: the caller's, else a copy issued now; None in the other
    modes. A forward that makes its own keeps it for its backward (reuse_group_sizes)."""
    if mode != "async":
        return None
    return host_group_sizes if host_group_sizes is not None else copy_group_sizes(group_sizes)


def host_sizes_operand(group_sizes, mode: str, host_group_sizes: Optional[HostGroupSizes]) -> jax.Array:
    """The int32 [G] operand a host-sized GEMM reads: the handle's snapshot in async mode."""
    if mode != "async":
        return group_sizes
    handle = async_handle(group_sizes, mode, host_group_sizes)
    if not isinstance(handle, HostGroupSizes):
        raise TypeError(f"host_group_sizes must come from copy_group_sizes, got {type(handle).__name__}")
    if handle.device_sizes.shape != group_sizes.shape:
        raise ValueError(
            f"host_group_sizes holds {handle.device_sizes.shape[0]} groups, group_sizes {group_sizes.shape[0]}"
        )
    return handle.device_sizes
