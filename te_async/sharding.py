"""Keeps te_async's whole-array FFI calls from being silently all-gathered under jit.

An FFI custom call has no partitioning rule, so XLA's partitioner all-gathers every sharded
operand onto every device before it: an expert-sharded `rhs` becomes all experts on every GPU,
with no error. The grouped GEMM cannot be partitioned by its operands' shardings either: rows
sharded across devices break the group layout, and experts sharded across devices need the
tokens exchanged first (te_async.expert_parallel). So sharded operands are refused instead:

- at trace time, with a ValueError, where the sharding is in the type (mesh axes of
  `AxisType.Explicit`);
- at compile time otherwise (`AxisType.Auto`, the default for `jit(in_shardings=...)`): the call
  is wrapped in `custom_partitioning`, whose partition rule raises the same ValueError. XLA runs
  that rule while compiling, so it reaches the caller as a `JaxRuntimeError` carrying the message.

Replicated operands pass, on one device or many, and inside `shard_map` (all mesh axes manual)
the call is lowered as it is, on each device's local shard.
"""

import itertools
from typing import Callable, Sequence

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

_HOW = (
    "it runs on whole arrays, and XLA would all-gather the shards onto every device. Call it "
    "inside jax.shard_map on each device's local shard (te_async.expert_parallel.moe_block_ep does "
    "this for experts sharded over a mesh axis), or pass replicated operands."
)


def _sharded_message(name: str, sharded: Sequence[tuple]) -> str:
    what = ", ".join(f"{arg} {tuple(shape)} as {spec}" for arg, shape, spec in sharded)
    return f"{name} got sharded operands ({what}): {_HOW}"


def check_unsharded(name: str, **arrays) -> None:
    """Trace-time check: a ValueError if any array's type says it is sharded (Explicit axes; a jax
    without jax.typeof has no shardings in types)."""
    typeof = getattr(jax, "typeof", None)
    sharded = []
    for arg, x in arrays.items():
        spec = getattr(getattr(typeof(x), "sharding", None), "spec", None) if typeof else None
        if spec is not None and any(p is not None for p in spec):
            sharded.append((arg, x.shape, spec))
    if sharded:
        raise ValueError(_sharded_message(name, sharded))


def _independent_rule(in_ranks: Sequence[int], out_ranks: Sequence[int]) -> str:
    """A Shardy rule in which no dimension shares a factor with another, so that no sharding is
    propagated through the call: each operand arrives with its producer's sharding."""
    names = (f"d{i}" for i in itertools.count())
    dims = lambda ranks: ", ".join(" ".join(itertools.islice(names, r)) for r in ranks)
    return f"{dims(in_ranks)} -> {dims(out_ranks)}"


def _replicated(sharding):
    """A replicated sharding on the same devices, for a result of any rank."""
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec())
    return sharding  # a GSPMDSharding, already replicated (checked first), of any rank


def require_replicated(fn: Callable, name: str, arg_names: Sequence[str]) -> Callable:
    """fn(*arrays) -> array or tuple of arrays, refusing sharded operands (module docstring).

    `name` and `arg_names` (one per positional operand) go into the error message. Under vmap the
    vmapped fn is checked the same way, so `vmap_method` of an ffi_call still applies.
    """

    def partition(mesh, arg_shapes, result_shape):
        sharded = [
            (arg, a.shape, getattr(a.sharding, "spec", a.sharding))
            for arg, a in zip(arg_names, arg_shapes)
            if a.sharding is not None and not a.sharding.is_fully_replicated
        ]
        if sharded:
            raise ValueError(_sharded_message(name, sharded))
        results = infer_sharding_from_operands(mesh, arg_shapes, result_shape)
        return mesh, fn, results, tuple(a.sharding for a in arg_shapes)

    def infer_sharding_from_operands(mesh, arg_shapes, result_shape):  # also the pre-Shardy partitioner's
        return jax.tree.map(lambda _: _replicated(arg_shapes[0].sharding), result_shape)

    @jax.custom_batching.custom_vmap
    def call(*args):
        check_unsharded(name, **dict(zip(arg_names, args)))
        wrapped = custom_partitioning(fn)
        out_ranks = [r.ndim for r in jax.tree.leaves(jax.eval_shape(fn, *args))]
        rule = _independent_rule([a.ndim for a in args], out_ranks)
        wrapped.def_partition(partition, infer_sharding_from_operands=infer_sharding_from_operands,
                              sharding_rule=rule)
        return wrapped(*args)

    @call.def_vmap
    def _vmap(axis_size, in_batched, *args):
        batched = jax.vmap(fn, in_axes=tuple(0 if b else None for b in in_batched))
        out = require_replicated(batched, name, arg_names)(*args)
        return out, jax.tree.map(lambda _: True, out)

    return call
