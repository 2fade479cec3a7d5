"""moe_block_ep: te_async.moe's block with the experts sharded over a mesh axis.

Tokens are sharded data-parallel over the same axis. Inside shard_map each device routes its own
tokens, normalises them and sorts them by expert (route_top_k, plan_dispatch), sends each
expert's rows to the device that holds that expert, runs grouped_mlp on its local experts, sends
the results back to where the rows came from, and combines them with the router weights (combine).

The exchange, with D devices, E experts and S = E / D local experts per device:
- Counts: one all_gather of each device's per-expert row counts, an int32 [D, E] matrix
  C[s, e]. From it every device computes every offset of the exchange on the device, and its
  local group sizes: local_sizes[j] = sum over sources s of C[s, me * S + j].
- Rows: one slice per (destination, expert), D * S = E slices per device. The slices land
  expert by expert, source by source, so the receive buffer is already grouped in the order
  grouped_mlp needs: no permutation before or after the expert MLP. The results go back by the
  same slices with the offsets swapped, straight into the sender's sorted rows.
- Transport "ragged": jax.lax.ragged_all_to_all (several slices per peer, as its docstring
  allows), which moves only the rows. XLA:CPU does not implement it (jax 0.10.2: "HLO opcode
  ragged-all-to-all is not supported"), so "dense" runs the same slices over jax.lax.all_to_all
  in per-destination chunks padded to the most a device can send there; the default picks
  "dense" on the CPU and "ragged" elsewhere.
- Receive buffer: `capacity` rows per device, by default D * T_local * top_k, the most one
  device can receive, so that no row is ever dropped. A smaller capacity bounds the memory; the
  buffer then fills expert by expert, source by source, and rows past its end are dropped: those
  (token, choice) pairs contribute zero, as with GShard's capacity.

Group-sizes modes pass through to grouped_mlp. In async mode each device issues copy_group_sizes
on its own local sizes right after the count exchange, before the rows move, so that the copy
overlaps the exchange; the pinned slots and events are per device ordinal.
"""

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from .group_sizes import copy_group_sizes
from .mlp import EPS, grouped_mlp, normalize, resolve_mlp_mode
from .moe import combine, dispatch_rows, plan_dispatch, route_top_k

TRANSPORTS = ("ragged", "dense")


class ExchangePlan(NamedTuple):
    """[D, E] int32 matrices over (source device s, global expert e)."""

    counts: jax.Array  # rows s sends to expert e (those that fit the receive buffer)
    send_offsets: jax.Array  # where they start among s's rows, sorted by expert
    recv_offsets: jax.Array  # where they start in the receive buffer of e's device


def plan_exchange(group_sizes: jax.Array, axis_name: str, num_devices: int, capacity: int) -> ExchangePlan:
    """The offsets of the whole exchange from each device's per-expert row counts [E]."""
    counts = jax.lax.all_gather(group_sizes.astype(jnp.int32), axis_name)
    exclusive = lambda a, axis: (jnp.cumsum(a, axis=axis, dtype=jnp.int32) - a).astype(jnp.int32)
    per_expert = counts.sum(axis=0, dtype=jnp.int32).reshape(num_devices, -1)
    expert_base = exclusive(per_expert, 1).reshape(-1)  # where each expert's block starts on its device
    recv_offsets = expert_base[None, :] + exclusive(counts, 0)
    kept = jnp.clip(capacity - recv_offsets, 0, counts).astype(jnp.int32)
    return ExchangePlan(kept, exclusive(counts, 1), recv_offsets)


def _chunk_rows(sizes, offsets, rows: int):
    """For each of D chunks packing S slices ([D, S] sizes and offsets) in order: the offset-side
    row of each of its `rows` positions, and whether the position holds data."""
    ends = jnp.cumsum(sizes, axis=1, dtype=jnp.int32)
    pos = jnp.arange(rows, dtype=jnp.int32)
    slot = jnp.minimum(jax.vmap(lambda e: jnp.searchsorted(e, pos, side="right"))(ends), sizes.shape[1] - 1)
    start = jnp.take_along_axis(ends - sizes, slot, axis=1)
    return jnp.take_along_axis(offsets, slot, axis=1) + pos - start, pos < ends[:, -1:]


def dense_ragged_all_to_all(
    operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name, num_devices
):
    """jax.lax.ragged_all_to_all's result, moved by a dense all_to_all: each device packs its
    slices for one destination into a chunk as long as the most it can send there."""
    rows = min(operand.shape[0], output.shape[0])
    by_peer = lambda a: a.reshape(num_devices, -1)
    src, live = _chunk_rows(by_peer(send_sizes), by_peer(input_offsets), rows)
    chunks = jnp.where(live[..., None], operand[jnp.where(live, src, 0)], 0)
    received = jax.lax.all_to_all(chunks, axis_name, 0, 0)
    landing = jax.lax.all_to_all(by_peer(output_offsets), axis_name, 0, 0)
    dst, live = _chunk_rows(by_peer(recv_sizes), landing, rows)
    return output.at[jnp.where(live, dst, output.shape[0])].set(received, mode="drop")


def _exchange(transport: str, axis_name: str, num_devices: int):
    if transport == "ragged":
        return lambda *args: jax.lax.ragged_all_to_all(*args, axis_name=axis_name)
    return lambda *args: dense_ragged_all_to_all(*args, axis_name=axis_name, num_devices=num_devices)


def default_transport(mesh) -> str:
    """"ragged" where XLA implements it; "dense" on the CPU or a jax without ragged_all_to_all."""
    ragged = hasattr(jax.lax, "ragged_all_to_all") and mesh.devices.flat[0].platform != "cpu"
    return "ragged" if ragged else "dense"


def moe_block_ep(
    x: jax.Array,
    router: jax.Array,
    w_fc1: jax.Array,
    w_fc2: jax.Array,
    *,
    mesh: jax.sharding.Mesh,
    top_k: int,
    axis_name: str = "ep",
    norm_scale: Optional[jax.Array] = None,
    norm: Optional[str] = "rmsnorm",
    activation: str = "swiglu",
    group_sizes_mode: Optional[str] = None,
    use_async_d2h_group_sizes: bool = False,
    capacity: Optional[int] = None,
    transport: Optional[str] = None,
) -> jax.Array:
    """te_async.moe.moe_block with experts sharded over `mesh` axis `axis_name`.

    x [T, H] is sharded over the axis by tokens (T divisible by its size D); router [H, E] and
    norm_scale [H] are replicated; w_fc1 [E, H, F1] and w_fc2 [E, F, H] are sharded by expert
    (E divisible by D). Returns y [T, H] sharded like x. `capacity`: receive-buffer rows per
    device (default: never drop); `transport`: "ragged" or "dense" (default: by platform).
    Differentiable like moe_block.
    """
    if not hasattr(jax, "shard_map"):
        raise RuntimeError(f"moe_block_ep needs jax.shard_map (tested: jax 0.10.2, 0.11.2), not jax {jax.__version__}")
    d = mesh.shape[axis_name]
    t, e = x.shape[0], router.shape[-1]
    if e % d or t % d:
        raise ValueError(f"experts ({e}) and tokens ({t}) must be divisible by the size {d} of mesh axis {axis_name!r}")
    if w_fc1.shape[0] != e or w_fc2.shape[0] != e:
        raise ValueError(f"router has {e} experts, w_fc1 {w_fc1.shape[0]}, w_fc2 {w_fc2.shape[0]}")
    if not 1 <= top_k <= e:
        raise ValueError(f"top_k must be in 1..{e}, got {top_k}")
    rows = t // d * top_k
    capacity = d * rows if capacity is None else int(capacity)
    if capacity < 1:
        raise ValueError(f"capacity must be a positive number of rows, got {capacity}")
    transport = transport or default_transport(mesh)
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS} or None, got {transport!r}")
    mode = resolve_mlp_mode(group_sizes_mode, use_async_d2h_group_sizes, None, groups=e // d, rows=capacity,
                            w_fc1=w_fc1, w_fc2=w_fc2)
    exchange = _exchange(transport, axis_name, d)

    def body(x, router, w_fc1, w_fc2, norm_scale):
        routing = route_top_k(x, router, top_k)
        dispatch = plan_dispatch(routing.experts, e)
        plan = plan_exchange(dispatch.group_sizes, axis_name, d, capacity)
        me = jax.lax.axis_index(axis_name)
        local = lambda m: jax.lax.dynamic_slice_in_dim(m, me * (e // d), e // d, axis=1)  # my experts' columns
        local_sizes = local(plan.counts).sum(axis=0, dtype=jnp.int32)
        sorted_x = dispatch_rows(normalize(x, norm_scale, None, norm, EPS), dispatch)  # as moe_block: the tokens' norm
        handle = None
        if mode == "async":
            handle = copy_group_sizes(local_sizes)
            # As in moe_block: the copy is enqueued before the exchange it should overlap.
            handle, sorted_x = jax.lax.optimization_barrier((handle, sorted_x))
        received = exchange(
            sorted_x, jnp.zeros((capacity, x.shape[1]), x.dtype),
            plan.send_offsets[me], plan.counts[me], plan.recv_offsets[me], local(plan.counts).reshape(-1),
        )
        y_local = grouped_mlp(
            received, local_sizes, w_fc1, w_fc2, norm=None, activation=activation,
            group_sizes_mode=mode, host_group_sizes=handle,
        )
        y_rows = exchange(
            y_local, jnp.zeros_like(sorted_x),
            local(plan.recv_offsets).reshape(-1), local(plan.counts).reshape(-1), local(plan.send_offsets).reshape(-1),
            plan.counts[me],
        )
        return combine(y_rows, dispatch, routing.weights)

    specs = (P(axis_name), P(), P(axis_name), P(axis_name), P())
    # check_vma=False as measured on the GPU. te_async's calls also run under the varying-axes
    # check now (manual_axes.vary_alike; this block passes its CPU tests with it), but the GPU's
    # ragged_all_to_all path has not run with it.
    sharded = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=P(axis_name), check_vma=False)
    return sharded(x, router, w_fc1, w_fc2, norm_scale)
