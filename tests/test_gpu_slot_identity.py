"""Async mode's pinned slots under the ways XLA moves a handle: carried through lax.scan, stacked
as scan outputs and consumed in reverse, rematerialised, donated, 200 copies in flight (more
than the ring's 64 slots), and a backward pass reusing its forward's copy, unrolled and scanned
(jax.lax.scan and te_async.scan). A slot is found by its handle's address
(csrc/cuda/host_size_slots.h); the GPU checks every pinned read and redoes a stale one
(csrc/cuda/host_sizes_guard.h).

Every scenario compares its outputs with float64 and prints the counters. Under
TE_ASYNC_VERIFY_HOST_SIZES=1 (tools/gpu_check.sh's test stage) every pinned read is also
cross-checked on the host and a mismatch fails the call, so a passing run means no lookup found
another copy's slot. test_stale_slot_is_repaired forces stale reads to show the repair."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async
from helpers import TOL, on_gpu
from reference import grouped_gemm_reference, mlp_reference, random_group_sizes, rel_error

pytestmark = pytest.mark.gpu

GROUPS, ROWS, K, N = 8, 96, 32, 24


def operands(rng, count: int):
    sizes = np.stack([random_group_sizes(rng, GROUPS, ROWS, "random") for _ in range(count)])
    lhs = rng.standard_normal((count, ROWS, K)).astype(np.float32)
    rhs = rng.standard_normal((GROUPS, K, N)).astype(np.float32)
    return sizes, lhs, rhs


def references(sizes, lhs, rhs) -> np.ndarray:
    return np.stack([grouped_gemm_reference(a, rhs, s) for s, a in zip(sizes, lhs)])


def gemm(lhs, rhs, handle, sizes):
    return te_async.grouped_gemm(lhs, rhs, sizes, group_sizes_mode="async", host_group_sizes=handle)


def run(name, fn, *args):
    """fn(*args) on the GPU, with the counter deltas it caused (printed for the record)."""
    before = te_async.host_size_stats()
    out = jax.block_until_ready(fn(*map(on_gpu, args)))
    after = te_async.host_size_stats()
    delta = {k: after[k] - before[k] for k in after}
    print(name, json.dumps(delta))
    return out, delta


def test_handle_carried_through_scan(rng):
    """Each trip consumes the handle the previous trip made (a scan carry) and makes the next."""
    sizes, lhs, rhs = operands(rng, 12)

    def step(carry, xs):
        s, a = xs
        out = gemm(a, carry[1], carry[0], carry[2])
        return (te_async.copy_group_sizes(s), carry[1], s), out

    def f(sizes, lhs, rhs):
        first = (te_async.copy_group_sizes(sizes[0]), rhs, sizes[0])
        shifted = jnp.concatenate([sizes[1:], sizes[:1]])
        return jax.lax.scan(step, first, (shifted, lhs))[1]

    out, delta = run("scan carry", jax.jit(f), sizes, lhs, rhs)
    assert rel_error(out, references(sizes, lhs, rhs)) < TOL[jnp.float32]
    assert delta["copies"] == 13 and delta["repaired_reads"] == 0


def test_stacked_handles_consumed_in_reverse(rng):
    """A forward scan stacks its handles (as residuals are stacked); a second scan consumes them
    last to first."""
    sizes, lhs, rhs = operands(rng, 10)

    def f(sizes, lhs, rhs):
        handles = jax.lax.scan(lambda c, s: (c, te_async.copy_group_sizes(s)), None, sizes)[1]
        body = lambda c, xs: (c, gemm(xs[1], rhs, xs[0], xs[2]))
        return jax.lax.scan(body, None, (handles, lhs, sizes), reverse=True)[1]

    out, delta = run("stacked, reversed", jax.jit(f), sizes, lhs, rhs)
    assert rel_error(out, references(sizes, lhs, rhs)) < TOL[jnp.float32]
    assert delta["copies"] == 10 and delta["repaired_reads"] == 0


def test_rematerialised_copy(rng):
    """jax.checkpoint runs the copy again in the backward; gradients of two async layers against
    the float64 reference's."""
    sizes = random_group_sizes(rng, GROUPS, ROWS, "skewed")
    x = rng.standard_normal((ROWS, K)).astype(np.float32)
    w_fc1 = (rng.standard_normal((GROUPS, K, 2 * N)) / np.sqrt(K)).astype(np.float32)
    w_fc2 = (rng.standard_normal((GROUPS, N, K)) / np.sqrt(N)).astype(np.float32)

    @jax.checkpoint
    def layer(a, s, w1, w2):
        return te_async.grouped_mlp(a, s, w1, w2, norm=None, group_sizes_mode="async",
                                    host_group_sizes=te_async.copy_group_sizes(s))

    loss = lambda a, s, w1, w2: jnp.sum(layer(layer(a, s, w1, w2), s, w1, w2) ** 2)
    grads, delta = run("remat", jax.jit(jax.grad(loss, argnums=(0, 2, 3))), x, sizes, w_fc1, w_fc2)
    ref = lambda a, w1, w2: mlp_reference(mlp_reference(a, sizes, w1, w2, norm=None), sizes, w1, w2, norm=None)
    want = jax.grad(lambda a, w1, w2: jnp.sum(ref(a, w1, w2) ** 2), argnums=(0, 1, 2))(x, w_fc1, w_fc2)
    for got, expected in zip(grads, want):
        assert rel_error(got, expected) < 1e-4
    assert delta["copies"] >= 2 and delta["repaired_reads"] == 0  # XLA may merge the two layers' copies (same sizes)


def _mlp_layers(rng, layers: int):
    """Per-layer sizes (every kind, each layer its own), weights and an input of a grouped_mlp stack."""
    sizes = np.stack([random_group_sizes(rng, GROUPS, ROWS, kind) for kind in ("random", "skewed", "zeros", "random")[:layers]])
    x = rng.standard_normal((ROWS, K)).astype(np.float32)
    w_fc1 = (rng.standard_normal((layers, GROUPS, K, 2 * N)) / np.sqrt(4 * K)).astype(np.float32)
    w_fc2 = (rng.standard_normal((layers, GROUPS, N, K)) / np.sqrt(4 * N)).astype(np.float32)
    return sizes, x, w_fc1, w_fc2


# The stacks a layer stack runs as: written out, or one of the scans (te_async.scan runs its own
# backward loop, which must find the forward's copies as jax.lax.scan's transpose does).
STACKS = {"unrolled": None, "scan": jax.lax.scan, "te_async_scan": te_async.scan}


def _mlp_stack_grads(layer, stack: str):
    """Gradients of sum(y^2) through x + layer(x, sizes_i, w1_i, w2_i) per layer, as STACKS[stack]
    runs them: a jitted (x, sizes, w1, w2) -> (dx, dw1, dw2)."""
    scan = STACKS[stack]

    def forward(a, s, w1, w2):
        if scan is not None:
            return scan(lambda c, xs: (c + layer(c, *xs), None), a, (s, w1, w2))[0]
        for i in range(s.shape[0]):
            a = a + layer(a, s[i], w1[i], w2[i])
        return a

    return jax.jit(jax.grad(lambda a, s, w1, w2: jnp.sum(forward(a, s, w1, w2) ** 2), argnums=(0, 2, 3)))


def _reference_stack_grads(sizes, x, w_fc1, w_fc2):
    """float64 gradients of sum(y^2) through the same stack of grouped MLPs (no norm, swiglu)."""
    def ref_forward(a, w1, w2):
        for i in range(len(sizes)):
            a = a + mlp_reference(a, sizes[i], w1[i], w2[i], norm=None)
        return a

    return jax.grad(lambda a, w1, w2: jnp.sum(ref_forward(a, w1, w2) ** 2), argnums=(0, 1, 2))(x, w_fc1, w_fc2)


def _async_mlp(a, s, w1, w2):
    return te_async.grouped_mlp(a, s, w1, w2, norm=None, group_sizes_mode="async")


def _two_gemm_mlp(a, s, w1, w2):
    """A grouped MLP as two differentiated async grouped_gemm calls that share one copy of the
    sizes, made right after routing as a MoE block makes it: each forward keeps it for its backward."""
    handle = te_async.copy_group_sizes(s)
    gemm = lambda lhs, rhs: te_async.grouped_gemm(lhs, rhs, s, group_sizes_mode="async", host_group_sizes=handle)
    h = gemm(a, w1)
    f = h.shape[-1] // 2
    return gemm(jax.nn.silu(h[:, :f]) * h[:, f:], w2)


@pytest.mark.parametrize("shared", [False, True], ids=["per_layer", "shared"])
@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("remat", [False, True], ids=["saved", "remat"])
def test_backward_reuses_forward_copy(rng, stack, remat, shared):
    """Each layer's backward takes its forward's copy (keep_group_sizes, reuse_group_sizes), so
    an async training step copies the sizes at most once per layer: in an unrolled stack the kept
    handle is found by its address; under scan the stacked residuals reach the backward at new
    addresses and the newest kept copy is taken (reused_by_order). Under jax.checkpoint the
    backward runs the forward again, with its own copy, which its backward reuses. `shared`: every
    layer routes by one closed-over size vector (as bench train does), whose copy XLA or JAX's scan
    makes once for all layers, while each layer still keeps it. Gradients match float64, and under
    TE_ASYNC_VERIFY_HOST_SIZES=1 every pinned read is cross-checked, so a wrong guess fails."""
    layers = 4
    sizes, x, w_fc1, w_fc2 = _mlp_layers(rng, layers)
    base = _async_mlp
    if shared:
        sizes = np.repeat(sizes[:1], layers, axis=0)
        base = lambda a, s, w1, w2: _async_mlp(a, jnp.asarray(sizes[0]), w1, w2)
    layer = jax.checkpoint(base) if remat else base
    name = f"backward reuse ({stack}, {'remat' if remat else 'saved'}, {'shared' if shared else 'per layer'})"
    grads, delta = run(name, _mlp_stack_grads(layer, stack), x, sizes, w_fc1, w_fc2)
    for got, expected in zip(grads, _reference_stack_grads(sizes, x, w_fc1, w_fc2)):
        assert rel_error(got, expected) < 1e-4
    assert delta["reused"] == layers and delta["reuse_misses"] == 0
    if shared:
        assert 1 <= delta["copies"] <= (2 if remat else 1) * layers
    else:
        assert delta["copies"] == (2 if remat else 1) * layers
    assert delta["fallback_reads"] == 0 and delta["repaired_reads"] == 0 and delta["sync_reads"] == 0
    if not remat:  # (with remat XLA drops the recomputed forward's unused fc2)
        assert delta["event_waits"] == 6 * layers  # 2 forward, 2 dgrad, 2 wgrad


@pytest.mark.parametrize("stack", list(STACKS))
def test_shared_copy_serves_both_backwards(rng, stack):
    """One copy per layer feeds two differentiated grouped_gemm calls (fc1, fc2): each forward
    keeps it (two keeps XLA must not merge), and both backwards reuse it: one copy per layer in
    the whole step, none in the backward."""
    layers = 4
    sizes, x, w_fc1, w_fc2 = _mlp_layers(rng, layers)
    grads, delta = run(f"shared copy ({stack})", _mlp_stack_grads(_two_gemm_mlp, stack), x, sizes, w_fc1, w_fc2)
    for got, expected in zip(grads, _reference_stack_grads(sizes, x, w_fc1, w_fc2)):
        assert rel_error(got, expected) < 1e-4
    assert delta["copies"] == layers and delta["reused"] == 2 * layers and delta["reuse_misses"] == 0
    assert delta["fallback_reads"] == 0 and delta["repaired_reads"] == 0 and delta["sync_reads"] == 0


_WRONG_ORDER_CHILD = """
import json, jax, jax.numpy as jnp, numpy as np, te_async
rng = np.random.default_rng(0)
layers, groups, rows, k, n = 3, 8, 96, 32, 24
sizes = [rng.multinomial(rows, np.ones(groups) / groups, size=layers).astype(np.int32) for _ in range(2)]
x = [rng.standard_normal((rows, k)).astype(np.float32) for _ in range(2)]
w1 = (rng.standard_normal((layers, groups, k, 2 * n)) / np.sqrt(4 * k)).astype(np.float32)
w2 = (rng.standard_normal((layers, groups, n, k)) / np.sqrt(4 * n)).astype(np.float32)
mlp = lambda a, s, u, v: te_async.grouped_mlp(a, s, u, v, norm=None, group_sizes_mode="async")
stack = lambda a, s, u, v: jax.lax.scan(lambda c, xs: (c + mlp(c, *xs), None), a, (s, u, v))[0]

def step(x0, x1, s0, s1, u, v):
    # Two microbatches, both forwards before either backward, microbatch 0's backward first (as a
    # pipeline schedule may run them): the newest kept copy is microbatch 1's, not 0's.
    y0, pull0 = jax.vjp(lambda a, u, v: stack(a, s0, u, v), x0, u, v)
    y1, pull1 = jax.vjp(lambda a, u, v: stack(a, s1, u, v), x1, u, v)
    g0 = pull0(2 * y0 + 0.0 * jnp.sum(y1))
    g1 = pull1(2 * y1 + 0.0 * jnp.sum(g0[0]))
    return g0, g1

grads = jax.jit(step)(x[0], x[1], sizes[0], sizes[1], w1, w2)
out = dict(stats=te_async.host_size_stats(), grads=[[np.asarray(g, np.float64).tolist() for g in gs] for gs in grads],
           sizes=[s.tolist() for s in sizes], x=[a.tolist() for a in x], w1=w1.tolist(), w2=w2.tolist())
print("RESULT" + json.dumps(out))
"""


@pytest.mark.parametrize("by_order", [True, False], ids=["guess", "no_guess"])
def test_wrong_order_guess_is_repaired(by_order):
    """Interleaved microbatches under scan (a 1F1B schedule): each backward's order guess (the
    newest kept copy) is the other microbatch's sizes. The GPU's check must redo those GEMMs, so
    the gradients stay right (TE_ASYNC_VERIFY_HOST_SIZES off: it would fail the call on the first
    wrong guess); TE_ASYNC_NO_REUSE_BY_ORDER=1 makes fresh copies instead, with nothing to redo."""
    env = dict(os.environ, TE_ASYNC_VERIFY_HOST_SIZES="0", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               TE_ASYNC_NO_REUSE_BY_ORDER="0" if by_order else "1")
    proc = subprocess.run([sys.executable, "-P", "-c", _WRONG_ORDER_CHILD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    stats = result["stats"]
    print("wrong order" if by_order else "wrong order, no guess", stats)
    w1, w2 = np.array(result["w1"]), np.array(result["w2"])
    for grads, sizes, x in zip(result["grads"], result["sizes"], result["x"]):
        want = _reference_stack_grads(np.array(sizes), np.array(x), w1, w2)
        for got, expected in zip(grads, want):
            assert rel_error(np.array(got), expected) < 1e-4
    if by_order:  # every guess wrong: 6 backwards of 4 GEMMs each redone
        assert stats["reused_by_order"] == 6 and stats["repaired_reads"] == 24
    else:
        assert stats["reused"] == 0 and stats["reuse_misses"] == 6 and stats["repaired_reads"] == 0


def test_reused_copy_past_the_ring(rng):
    """66 copies between a forward and its backward: the forward's slot has been reissued, so the
    backward makes a fresh copy and the result stays right."""
    sizes, lhs, rhs = operands(rng, 1)

    def f(lhs, rhs, s):
        out, pull = jax.vjp(lambda a, b: te_async.grouped_gemm(a, b, s, group_sizes_mode="async"), lhs, rhs)
        # The backward (its residuals, the forward's handle among them) runs after all 66 copies,
        # which its cotangent uses (adding 0.0), so that they are not dead code.
        copies, out, pull = jax.lax.optimization_barrier(([te_async.copy_group_sizes(s + i) for i in range(1, 67)], out, pull))
        used = sum(jnp.sum(h.device_sizes) for h in copies).astype(out.dtype) * 0.0
        return pull(out + used)

    (dlhs, drhs), delta = run("reuse past the ring", jax.jit(f), lhs[0], rhs, sizes[0])
    y = grouped_gemm_reference(lhs[0], rhs, sizes[0])
    assert rel_error(dlhs, grouped_gemm_reference(y, rhs, sizes[0], transpose_rhs=True)) < TOL[jnp.float32]
    assert rel_error(drhs, grouped_gemm_reference(lhs[0], y, sizes[0], ragged="k")) < TOL[jnp.float32]
    assert delta["reuse_misses"] == 1 and delta["reused"] == 0 and delta["copies"] == 1 + 66 + 1
    assert delta["repaired_reads"] == 0


def test_donated_handle(rng):
    """The snapshot made in one jit and donated to another, whose output may reuse its buffer."""
    sizes, lhs, rhs = operands(rng, 4)
    consume = jax.jit(lambda h, a, b, s: (gemm(a, b, te_async.HostGroupSizes(h), s), h + 0), donate_argnums=(0,))
    outs = []
    before = te_async.host_size_stats()
    for i in range(4):
        handle = te_async.copy_group_sizes(on_gpu(sizes[i]))
        out, _ = consume(handle.device_sizes, on_gpu(lhs[i]), on_gpu(rhs), on_gpu(sizes[i]))
        outs.append(out)
    jax.block_until_ready(outs)
    print("donated", {k: v - before[k] for k, v in te_async.host_size_stats().items()})
    assert rel_error(np.stack(outs), references(sizes, lhs, rhs)) < TOL[jnp.float32]


def test_200_copies_in_flight(rng):
    """200 copies before the first consumer: the ring holds 64, so the oldest handles find their
    slots reissued and read synchronously (fallbacks); none reads another copy's sizes."""
    sizes, lhs, rhs = operands(rng, 200)

    def f(sizes, lhs, rhs):
        handles = [te_async.copy_group_sizes(sizes[i]) for i in range(200)]
        handles = jax.lax.optimization_barrier(handles)  # all copies are issued before any consumer
        return jnp.stack([gemm(lhs[i], rhs, handles[i], sizes[i]) for i in reversed(range(200))][::-1])

    out, delta = run("200 in flight", jax.jit(f), sizes, lhs, rhs)
    assert rel_error(out, references(sizes, lhs, rhs)) < TOL[jnp.float32]
    assert delta["copies"] == 200 and delta["repaired_reads"] == 0
    assert delta["event_waits"] + delta["fallback_reads"] == 200 and delta["fallback_reads"] >= 200 - 64


_REPAIR_CHILD = """
import json, jax, jax.numpy as jnp, numpy as np, te_async
rng = np.random.default_rng(0)
out = {}
for ragged, transpose_rhs, dtype in (("m", False, jnp.float32), ("m", True, jnp.bfloat16), ("k", False, jnp.float32)):
    sizes = np.array([40, 0, 7, 1, 30, 0, 12, 6], np.int32)  # rotated by one group, every group moves
    lhs = jnp.asarray(rng.standard_normal((96, 32)), dtype)
    rhs = jnp.asarray(rng.standard_normal((96, 24) if ragged == "k" else ((8, 24, 32) if transpose_rhs else (8, 32, 24))), dtype)
    f = jax.jit(lambda a, b, s: te_async.grouped_gemm(a, b, s, ragged=ragged, transpose_rhs=transpose_rhs, group_sizes_mode="async"))
    y = f(lhs, rhs, jnp.asarray(sizes))
    out[f"{ragged}{transpose_rhs}"] = dict(y=np.asarray(y, np.float64).tolist(), lhs=np.asarray(lhs, np.float64).tolist(),
                                          rhs=np.asarray(rhs, np.float64).tolist(), sizes=sizes.tolist())
out["stats"] = te_async.host_size_stats()
print("RESULT" + json.dumps(out))
"""


def test_stale_slot_is_repaired():
    """TE_ASYNC_DEBUG_ROTATE_PINNED_SIZES=1 serves every pinned read rotated by one group, as a
    stale slot would: the GPU's check must catch each one and the outputs must still be right."""
    env = dict(os.environ, TE_ASYNC_DEBUG_ROTATE_PINNED_SIZES="1", TE_ASYNC_VERIFY_HOST_SIZES="0",
               XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run([sys.executable, "-P", "-c", _REPAIR_CHILD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    stats = result.pop("stats")
    print("repair", stats)
    assert stats["event_waits"] == 3 and stats["repaired_reads"] == 3
    for key, r in result.items():
        ragged = key[0]
        want = grouped_gemm_reference(np.array(r["lhs"]), np.array(r["rhs"]), np.array(r["sizes"]), ragged,
                                      key.endswith("True"))
        assert rel_error(np.array(r["y"]), want) < TOL[jnp.bfloat16], key
