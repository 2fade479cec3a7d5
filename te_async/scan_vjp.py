"""te_async.scan: jax.lax.scan for layer stacks, differentiated without zero-filling stacked buffers.

JAX's scan starts every stacked output at zero: the ys of the forward loop (a training step's
residuals) and of its transpose (the stacked weights' gradients). XLA keeps those fills although
the loop overwrites every row: in a scanned DeepSeek-V2-Lite MoE training step on an H200 they
took 1.6 of 7.3 ms of GPU time (docs/benchmarks.md, table TS). This scan differentiates its loop
itself (a jax.custom_vjp over two fori_loops): the forward stacks each step's pullback residuals,
and the backward the cotangents of xs, into `jax.lax.empty` buffers, which XLA's GPU backend
allocates without writing (AllocateBuffer; the CPU backend fills them with zeros). As in JAX's
scan, only residuals that change from step to step are stacked: one that is the step's own input
(its slice of the stacked weights, a value the step closes over) is passed again, and one computed
from closed-over values alone (a mask built inside the step) is computed once, before the loop.
The buffers are typed as the rows written into them (an explicit mesh's sharding, shard_map's
varying axes), so it runs where jax.lax.scan runs: one device, XLA's sharding, sharding in types,
inside shard_map.

Differences from jax.lax.scan: reverse mode only (no jax.jvp), as grouped_mlp; the step is traced
four times (the shape check, its jaxpr, the residual plan, the loop); a scan of length 0 is
jax.lax.scan's.
"""

import itertools
from typing import Any, Callable, Optional

import jax
import jax.extend.core as jex
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from .manual_axes import varying_axes


def _slice(tree, t):
    return jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, t, keepdims=False), tree)


def _put(stacks, values, t):
    return jax.tree.map(lambda s, v: lax.dynamic_update_index_in_dim(s, v, t, 0), stacks, values)


def _unwritten(shape: tuple, like):
    """A buffer of `shape` that nothing writes first, typed as `like` (an aval) stacked: its sharding
    (explicit mesh axes) with the new leading axes unsharded, varying over the manual axes `like`
    varies over (inside shard_map), as the rows written into it."""
    spec = tuple(like.sharding.spec) + (None,) * (len(like.shape) - len(like.sharding.spec))
    lead = (None,) * (len(shape) - len(like.shape))
    out = lax.empty(shape, like.dtype, out_sharding=like.sharding.update(spec=PartitionSpec(*lead, *spec)))
    axes = varying_axes(like)
    return lax.pcast(out, axes, to="varying") if axes else out


def _empty_stacks(n: int, avals):
    return jax.tree.map(lambda a: _unwritten((n, *a.shape), a), avals)


def _differentiable(a) -> bool:
    return jnp.issubdtype(a.dtype, jnp.inexact)


def _keep(values, flags) -> list:
    """The values whose flag is set."""
    return [v for v, f in zip(values, flags) if f]


def _merge(flags, when_set, otherwise) -> list:
    """_keep's inverse: the next of `when_set` where a flag is set, else the next of `otherwise`."""
    a, b = iter(when_set), iter(otherwise)
    return [next(a) if f else next(b) for f in flags]


def _fill(kept, wanted) -> list:
    """Cotangents for all values from those kept: None (no cotangent) where none was computed."""
    return _merge(wanted, kept, itertools.repeat(None))


# Call-like primitives whose params["jaxpr"] takes the eqn's inputs and gives its outputs, one for
# one, evaluated once: _varying_outputs looks inside them. Any other nested jaxpr (loops, custom
# derivatives) counts as depending on all of its inputs.
_CALLS = ("jit", "pjit", "closed_call", "checkpoint", "remat")


def _varying_outputs(jaxpr, varying_inputs) -> list:
    """Which outputs of `jaxpr` depend on the inputs flagged in `varying_inputs` (the step's carry
    and x): the residuals that change from step to step; the others are computed once."""
    varying = {v for v, f in zip(jaxpr.invars, varying_inputs) if f}
    for eqn in jaxpr.eqns:
        flags = [isinstance(v, jex.Var) and v in varying for v in eqn.invars]
        if not any(flags):
            continue
        inner = eqn.params.get("jaxpr")
        inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's jaxpr
        if eqn.primitive.name in _CALLS and isinstance(inner, jex.Jaxpr):
            out = _varying_outputs(inner, flags)
        else:
            out = [True] * len(eqn.outvars)
        varying.update(v for v, f in zip(eqn.outvars, out) if f)
    return [isinstance(v, jex.Var) and v in varying for v in jaxpr.outvars]


def _explicit_closure(f, carry, x):
    """f as step(carry, x, *consts) with every value it closes over an argument: the pullback's
    residuals that are such values (a mask, the group sizes of every layer) are then recognised
    and not stacked. jax.closure_convert hoists only the values that may be differentiated. Traced
    on a real carry and x: their types (sharding, shard_map's varying axes) are the loop's."""
    closed, out_shape = jax.make_jaxpr(f, return_shape=True)(carry, x)
    out_tree = jax.tree.structure(out_shape)

    def step(carry, x, *consts):
        flat = jex.jaxpr_as_fun(jex.ClosedJaxpr(closed.jaxpr, consts))(*jax.tree.leaves((carry, x)))
        return jax.tree.unflatten(out_tree, flat)

    return step, list(closed.consts)


def _pullback(step, consts, carry, x):
    """(the step's outputs, where each leaf of its pullback comes from, the pullback's treedef, the
    residuals to save). A leaf is ("x", i) or ("const", i), an input of the step that the backward
    passes again, or ("saved", j), the j-th residual to stack."""
    out, pullback = jax.vjp(lambda c, x_, k: step(c, x_, *k), carry, x, consts)
    leaves, treedef = jax.tree.flatten(pullback)
    known = {id(v): ("x", i) for i, v in enumerate(jax.tree.leaves(x))}
    known.update({id(v): ("const", i) for i, v in enumerate(consts)})
    saved = []
    kinds = []
    for v in leaves:
        if id(v) not in known:
            known[id(v)] = ("saved", len(saved))
            saved.append(v)
        kinds.append(known[id(v)])
    return out, tuple(kinds), treedef, saved


def _rebuild(kinds, treedef, consts, x, saved):
    """The pullback of a step from its inputs and its saved residuals' rows."""
    sources = {"x": jax.tree.leaves(x), "const": consts, "saved": saved}
    return jax.tree.unflatten(treedef, [sources[kind][i] for kind, i in kinds])


def scan(f: Callable, init: Any, xs: Any = None, length: Optional[int] = None, *, reverse: bool = False,
         unroll: int | bool = 1):
    """jax.lax.scan(f, init, xs, length, reverse=reverse, unroll=unroll), whose gradient writes the
    stacked residuals and the cotangents of xs (a layer stack's weight gradients) into buffers it
    does not fill first. Checks and errors are jax.lax.scan's own."""
    jax.eval_shape(lambda c, x: lax.scan(f, c, x, length, reverse=reverse, unroll=unroll), init, xs)
    n = length if length is not None else jax.tree.leaves(xs)[0].shape[0]
    if n == 0:  # nothing to stack
        return lax.scan(f, init, xs, length, reverse=reverse, unroll=unroll)
    x0 = _slice(xs, 0)  # a step's x, to trace the step with
    step, consts = _explicit_closure(f, init, x0)
    order = (lambda i: n - 1 - i) if reverse else (lambda i: i)

    traced = {}  # the pullback's leaf kinds (from a probe) and treedef (from the forward loop's trace)

    def probe(consts, carry, x):
        (_, y), traced["kinds"], _, saved = _pullback(step, consts, carry, x)
        return y, saved

    probe_jaxpr, shapes = jax.make_jaxpr(probe, return_shape=True)(consts, init, x0)
    y_avals, saved_avals = jax.tree.unflatten(jax.tree.structure(shapes), probe_jaxpr.out_avals)
    n_y = len(jax.tree.leaves(y_avals))  # the probe's outputs: y, then the saved residuals
    inputs = probe_jaxpr.jaxpr.invars  # consts, then the carry and x, which vary
    varying = _varying_outputs(probe_jaxpr.jaxpr, [i >= len(consts) for i in range(len(inputs))])[n_y:]

    def forward(consts, init, xs, save: bool):
        def body(i, state):
            carry, ys, saved = state
            t = order(i)
            x = _slice(xs, t)
            if save:
                (carry, y), kinds, traced["treedef"], rows = _pullback(step, consts, carry, x)
                if kinds != traced["kinds"]:
                    raise RuntimeError("te_async.scan: the step's residuals differ between two traces of it")
                saved = _put(saved, _keep(rows, varying), t)
            else:
                carry, y = step(carry, x, *consts)
            return carry, _put(ys, y, t), saved

        state = (init, _empty_stacks(n, y_avals), _empty_stacks(n, _keep(saved_avals, varying)) if save else [])
        return lax.fori_loop(0, n, body, state, unroll=unroll)

    @jax.custom_vjp
    def loop(consts, init, xs):
        carry, ys, _ = forward(consts, init, xs, save=False)
        return carry, ys

    def loop_fwd(consts, init, xs):
        carry, ys, stacks = forward(consts, init, xs, save=True)
        # The residuals that do not change, once: the probe's jaxpr on this call's values (any carry
        # and x give them; XLA drops the rest).
        if all(varying):
            fixed = []
        else:
            outs = jex.jaxpr_as_fun(probe_jaxpr)(*consts, *jax.tree.leaves((init, _slice(xs, 0))))
            fixed = _keep(outs[n_y:], [not v for v in varying])
        return (carry, ys), (consts, xs, stacks, fixed)

    def loop_bwd(residuals, cts):
        consts, xs, stacks, fixed = residuals
        ct_carry, ct_ys = cts
        x_leaves, x_tree = jax.tree.flatten(xs)
        x_wanted, c_wanted = [_differentiable(a) for a in x_leaves], [_differentiable(c) for c in consts]

        def body(i, state):
            ct_carry, ct_consts, ct_xs = state
            t = order(n - 1 - i)
            x = _slice(xs, t)
            rows = _merge(varying, _slice(stacks, t), fixed)
            pullback = _rebuild(traced["kinds"], traced["treedef"], consts, x, rows)
            d_carry, d_x, d_consts = pullback((ct_carry, _slice(ct_ys, t)))
            ct_consts = [a + d for a, d in zip(ct_consts, _keep(d_consts, c_wanted))]
            return d_carry, ct_consts, _put(ct_xs, _keep(jax.tree.leaves(d_x), x_wanted), t)

        state = (ct_carry, [jnp.zeros_like(c) for c in _keep(consts, c_wanted)],
                 [_unwritten(a.shape, jax.typeof(a)) for a in _keep(x_leaves, x_wanted)])
        ct_init, ct_consts, ct_xs = lax.fori_loop(0, n, body, state, unroll=unroll)
        return _fill(ct_consts, c_wanted), ct_init, jax.tree.unflatten(x_tree, _fill(ct_xs, x_wanted))

    loop.defvjp(loop_fwd, loop_bwd)
    return loop(consts, init, xs)
