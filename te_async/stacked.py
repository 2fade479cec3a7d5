"""Layer `index` of a stacked array [L, ...], for the kernels that read it in place.

A decoder scans its layers over stacked params. When the scan slices a weight per trip and hands
the slice to a custom call, XLA fuses the slice into the call (a DynamicSliceFusion whose address
changes every trip), and each such call costs the trip host time. Measured on an H200 (2026-12-02,
tools/scan_trip_probe.py, wall clock per trip of a 26-trip scan whose body is one te_async GEMM of
[1, 2048] x [2048, 64]): 21.6-31 us with the weight sliced that way, 10.1 us with the call reading
the whole stack at a fixed address and the layer picked on the GPU, and 9.8 us for XLA's own GEMM.
So te_async's decode kernels take a LayerOf (the stack and the layer's index, a traced int32 scalar
inside a scan) and pick the layer on the device; every other consumer reads take(w).
"""

from typing import NamedTuple, Union

import jax
import jax.numpy as jnp


class LayerOf(NamedTuple):
    """Layer `index` of `stack` [L, ...]: a Python int, or a traced integer scalar."""

    stack: jax.Array
    index: Union[int, jax.Array]


def layer_index(a: LayerOf) -> jax.Array:
    """a's index as int32, clamped to the stack as take() (XLA's dynamic index) clamps it; a static
    index outside the stack raises ValueError."""
    layers = a.stack.shape[0]
    if isinstance(a.index, int) and not 0 <= a.index < layers:
        raise ValueError(f"layer {a.index} is outside the stack of {layers} layers")
    index = jnp.asarray(a.index)
    if index.shape != () or not jnp.issubdtype(index.dtype, jnp.integer):
        raise ValueError(f"a layer index must be an integer scalar, got {index.dtype} {index.shape}")
    return jnp.clip(index.astype(jnp.int32), 0, layers - 1)


def layer_aval(a) -> jax.ShapeDtypeStruct:
    """The shape and dtype of an array, or of a LayerOf's layer."""
    stack = a.stack if isinstance(a, LayerOf) else a
    return jax.ShapeDtypeStruct(stack.shape[1:] if isinstance(a, LayerOf) else stack.shape, stack.dtype)


def take(a: Union[jax.Array, LayerOf]) -> jax.Array:
    """The array itself, or a LayerOf's layer (a dynamic index, which XLA may copy)."""
    if isinstance(a, LayerOf):
        return jax.lax.dynamic_index_in_dim(a.stack, layer_index(a), axis=0, keepdims=False)
    return a
