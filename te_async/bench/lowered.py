"""A step lowered to StableHLO text for a GPU (cuda_stablehlo), and what to read in it: the
scatters that add float rows and the buffers te_async.scan stacks into. tools/train_lowering.py
counts them for a model's training step; the tests check them per path."""

import re

import jax

_SCATTER = re.compile(r'"stablehlo\.scatter"(.*?)\}\) : \([^)]*\) -> tensor<([0-9x]+)x(\w+)>', re.DOTALL)
_ALLOCATED = re.compile(r"custom_call @AllocateBuffer\(\) : \(\) -> tensor<([0-9x]+\w+)>")


def cuda_stablehlo(fn, *args) -> str:
    """fn traced on args (jitted here unless it is a jitted function already) and lowered for a
    GPU, as StableHLO text: what the GPU would compile, read on any machine."""
    traced = fn if hasattr(fn, "trace") else jax.jit(fn)
    return traced.trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def row_scatter_adds(stablehlo: str, width: int) -> list:
    """The result types (e.g. "61x32xf32") of the scatters that add float rows of `width`: JAX's
    transpose of a row gather, which XLA's GPU backend runs with atomic adds in the rows' dtype, in
    no fixed order. Raises if the text has no scatter at all (a pattern that no longer matches
    would otherwise find no adds anywhere)."""
    found = _SCATTER.findall(stablehlo)
    if not found:
        raise ValueError("no scatter in the text")
    return [f"{dims}x{dtype}" for region, dims, dtype in found
            if "stablehlo.add" in region and dtype[0] in "fb" and int(dims.split("x")[-1]) == width]


def allocated_buffers(stablehlo: str) -> list:
    """The types (e.g. "5x4x4xf32") of the AllocateBuffer calls: the buffers te_async.scan stacks
    into without filling them."""
    return _ALLOCATED.findall(stablehlo)
