"""moe_block_ep against the single-device moe_block: CPU devices in CI (conftest asks for 4),
two GPUs where there are two. Also the dense transport against ragged_all_to_all's documented
semantics, the capacity's drop rule against a float64 reference, and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import te_async
from helpers import moe_params
from reference import mlp_reference, rel_error
from te_async.expert_parallel import dense_ragged_all_to_all, moe_block_ep
from te_async.moe import moe_block, route_top_k

TOP_K = 2


def mesh_of(devices):
    return Mesh(np.array(devices), ("ep",))


def cpu_mesh(n):
    devices = jax.devices("cpu")
    if len(devices) < n:
        pytest.skip(f"needs {n} CPU devices, have {len(devices)}")
    return mesh_of(devices[:n])


def setup(rng, tokens=16, experts=8, hidden=16, ffn=12):
    p = moe_params(rng, experts, hidden, ffn)
    return jnp.asarray(rng.standard_normal((tokens, hidden)), jnp.float32), p


def on_mesh(mesh, x, p):
    """x by tokens and the experts' weights by expert over the mesh, the router replicated."""
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
    specs = dict(router=P(), w_fc1=P("ep"), w_fc2=P("ep"))
    return put(x, P("ep")), {k: put(p[k], spec) for k, spec in specs.items()}


def ep(mesh, mode, **kw):
    return jax.jit(lambda x, p: moe_block_ep(x, **p, mesh=mesh, top_k=TOP_K, group_sizes_mode=mode, **kw))


def single(mode, device):
    f = jax.jit(lambda x, p: moe_block(x, **p, top_k=TOP_K, group_sizes_mode=mode))
    return lambda x, p: f(*jax.device_put((x, p), device))


@pytest.mark.parametrize("devices", [2, 4])
@pytest.mark.parametrize("mode", te_async.GROUP_SIZES_MODES)
def test_matches_single_device(rng, mode, devices):
    mesh = cpu_mesh(devices)
    x, p = setup(rng)
    y = ep(mesh, mode)(*on_mesh(mesh, x, p))
    assert y.sharding.spec == P("ep")
    assert rel_error(y, single(mode, jax.devices("cpu")[0])(x, p)) < 1e-5  # float32, another summation order


@pytest.mark.parametrize("mode", te_async.GROUP_SIZES_MODES)
def test_gradients_match_single_device(rng, mode):
    mesh = cpu_mesh(4)
    x, p = setup(rng)

    def grads(block, x, p):
        return jax.jit(jax.grad(lambda x, p: jnp.sum(jnp.tanh(block(x, p))), argnums=(0, 1)))(x, p)

    got = grads(lambda x, p: moe_block_ep(x, **p, mesh=mesh, top_k=TOP_K, group_sizes_mode=mode), *on_mesh(mesh, x, p))
    want = grads(lambda x, p: moe_block(x, **p, top_k=TOP_K, group_sizes_mode=mode),
                 *jax.device_put((x, p), jax.devices("cpu")[0]))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert rel_error(g, w) < 1e-5


def test_tokens_all_to_one_expert(rng):
    """Every row lands on one device, the worst case the default buffer is sized for."""
    mesh = cpu_mesh(4)
    x, p = setup(rng)
    p["router"] = p["router"].at[:, 5].add(100.0)  # expert 5, on device 2, wins every token
    want = single("sync", jax.devices("cpu")[0])(x, p)
    assert rel_error(ep(mesh, "sync")(*on_mesh(mesh, x, p)), want) < 1e-5  # float32, another summation order


def received_rows(x, p, devices, experts):
    """Rows each device receives, counted on the host from the routing."""
    chosen = np.asarray(route_top_k(x, p["router"], TOP_K).experts)
    return np.bincount(chosen.ravel() // (experts // devices), minlength=devices)


def dropping_reference(x, p, devices, capacity):
    """float64 moe output where each device's buffer fills expert by expert, source device by
    source device (tokens in order, then choices), and rows past `capacity` count as zero."""
    x, p = jax.device_put((x, p), jax.devices("cpu")[0])  # the mesh's backend: no TF32 routing on a GPU
    weights, chosen = (np.asarray(a) for a in route_top_k(x, p["router"], TOP_K))
    tokens, experts = x.shape[0], p["router"].shape[1]
    per_device = experts // devices
    filled = np.zeros(devices, int)
    kept = np.zeros_like(chosen, bool)
    for e in range(experts):
        for t in range(tokens):  # tokens in order are sources in order
            for j in np.flatnonzero(chosen[t] == e):
                owner = e // per_device
                kept[t, j] = filled[owner] < capacity
                filled[owner] += 1
    y = np.zeros(x.shape)
    for t, j in zip(*np.nonzero(kept)):
        one = np.zeros(experts, np.int32)
        one[chosen[t, j]] = 1
        y[t] += weights[t, j] * np.asarray(mlp_reference(x[t : t + 1], one, p["w_fc1"], p["w_fc2"]))[0]
    return y, kept


def test_capacity_drops_rows_past_the_buffer(rng):
    mesh = cpu_mesh(4)
    x, p = setup(rng, tokens=32)
    loads = received_rows(x, p, 4, 8)
    exact = ep(mesh, "sync", capacity=int(loads.max()))(*on_mesh(mesh, x, p))
    assert rel_error(exact, single("sync", jax.devices("cpu")[0])(x, p)) < 1e-5  # float32, another summation order
    tight = int(loads.max()) - 3
    want, kept = dropping_reference(x, p, 4, tight)
    assert not kept.all()
    assert rel_error(ep(mesh, "sync", capacity=tight)(*on_mesh(mesh, x, p)), want) < 1e-5


def test_dense_transport_follows_ragged_all_to_all(rng):
    """Random slices, several per peer, against ragged_all_to_all's documented pseudocode."""
    devices, slices = 4, 3
    rows = out_rows = devices * slices * 4  # room for every slice, and a row of gap after each
    sizes = rng.integers(0, 4, (devices, devices, slices))  # [sender, receiver, slice]
    in_off = np.zeros_like(sizes)
    out_off = np.zeros_like(sizes)
    for s in range(devices):  # a sender packs its slices in order
        in_off[s] = (np.cumsum(sizes[s].ravel()) - sizes[s].ravel()).reshape(devices, slices)
    for r in range(devices):  # a receiver places them source by source, a row of gap after each
        at = 0
        for s in range(devices):
            for j in range(slices):
                out_off[s, r, j] = at
                at += sizes[s, r, j] + 1
    operand = rng.standard_normal((devices, rows, 2)).astype(np.float32)
    want = np.full((devices, out_rows, 2), -1.0, np.float32)
    for s in range(devices):
        for r in range(devices):
            for j in range(slices):
                n = sizes[s, r, j]
                want[r, out_off[s, r, j] : out_off[s, r, j] + n] = operand[s, in_off[s, r, j] : in_off[s, r, j] + n]
    recv_sizes = np.transpose(sizes, (1, 0, 2))  # [receiver, sender, slice]
    flat = lambda a: jnp.asarray(a.reshape(devices, -1), jnp.int32)

    def body(op, out, io, ss, oo, rs):
        got = dense_ragged_all_to_all(op[0], out[0], io[0], ss[0], oo[0], rs[0], axis_name="ep", num_devices=devices)
        return got[None]

    f = jax.jit(jax.shard_map(body, mesh=cpu_mesh(devices), in_specs=P("ep"), out_specs=P("ep")))
    output = np.full((devices, out_rows, 2), -1.0, np.float32)
    got = f(operand, output, flat(in_off), flat(sizes), flat(out_off), flat(recv_sizes))
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(experts=6), "divisible"),
        (dict(tokens=15), "divisible"),
        (dict(capacity=0), "capacity"),
        (dict(transport="nccl"), "transport"),
        (dict(top_k=9), "top_k"),
    ],
)
def test_bad_input(rng, change, message):
    mesh = cpu_mesh(4)
    x, p = setup(rng, tokens=change.pop("tokens", 16), experts=change.pop("experts", 8))
    kw = dict(top_k=TOP_K) | change
    with pytest.raises(ValueError, match=message):
        moe_block_ep(x, **p, mesh=mesh, **kw)


def gpu_mesh_or_skip():
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if len(gpus) < 2:
        pytest.skip(f"needs 2 GPUs, have {len(gpus)}")
    return mesh_of(gpus[:2])


@pytest.mark.gpu
@pytest.mark.parametrize("transport", ["ragged", "dense"])
@pytest.mark.parametrize("mode", te_async.GROUP_SIZES_MODES)
def test_two_gpus_match_one(rng, mode, transport):
    mesh = gpu_mesh_or_skip()
    x, p = setup(rng, tokens=64, experts=8, hidden=64, ffn=96)
    x, p = jax.tree.map(lambda a: a.astype(jnp.bfloat16), (x, p))
    before = [te_async.host_size_stats(i)["copies"] for i in range(2)]
    y = ep(mesh, mode, transport=transport)(*on_mesh(mesh, x, p))
    copies = [te_async.host_size_stats(i)["copies"] - b for i, b in zip(range(2), before)]
    assert rel_error(y, single(mode, jax.devices("gpu")[0])(x, p)) < 2e-2
    if mode == "async":  # each GPU copied its own local sizes once, into its own slots
        assert copies == [1, 1], copies


def test_bench_ep_smoke(tmp_path):
    """The ep benchmark end to end through the CLI on 4 CPU devices, tiny preset, profiled (CPU
    traces have no GPU events, so the per-device figures are None)."""
    import json

    from te_async.bench import __main__ as cli

    cpu_mesh(4)
    if jax.default_backend() != "cpu":
        pytest.skip("the CPU smoke run; GPUs run the full benchmark")
    cli.main(["ep", "--devices", "4", "--tokens", "8", "--reps", "2", "--modes", "sync", "--profile",
              "--out", str(tmp_path)])
    result = json.loads((tmp_path / "ep.json").read_text())
    (row,) = result["results"]
    assert result["benchmark"] == "ep" and result["config"]["devices"] == 4
    assert row["error"] is None and row["transport"] == "dense", row
    assert row["rel_error_vs_one"] < 1e-5 and row["ep_ms"] > 0 and row["one_device_ms"] > 0
    assert [d["device"] for d in row["per_device"]] == [0, 1, 2, 3]
    assert all(d["a2a_us"] is None and d["idle_us"] is None for d in row["per_device"])
    assert (tmp_path / "ep.md").read_text().startswith("| tokens | mode | transport |")


def test_bench_ep_per_device_figures_from_a_gpu_trace(monkeypatch):
    """A fake two-GPU trace: the bubble and the all-to-all time come out per device."""
    from te_async.bench import ep as bench_ep

    meta = [{"ph": "M", "pid": 1 + d, "name": "process_name", "args": {"name": f"/device:GPU:{d}"}} for d in (0, 1)]
    stream = {"name": "Stream #7(Compute)"}
    meta += [{"ph": "M", "pid": 1 + d, "tid": 7, "name": "thread_name", "args": stream} for d in (0, 1)]
    x = lambda pid, ts, dur, name: {"ph": "X", "pid": pid, "tid": 7, "ts": ts, "dur": dur, "name": name}
    events = meta + [
        x(9, 0, 100, bench_ep.ANNOTATION),
        x(1, 10, 30, "gemm"), x(1, 40, 20, "ncclDevKernel_SendRecv"), x(1, 70, 10, "fusion"),
        x(2, 5, 10, "ncclDevKernel_AllGather_RING_LL"), x(2, 15, 15, "gemm"),
    ]
    monkeypatch.setattr(bench_ep.trace, "load_events", lambda path: events)
    d0, d1 = bench_ep._per_device("unused", 2)
    assert (d0["busy_us"], d0["idle_us"], d0["a2a_us"], d0["n_kernels"]) == (60, 10, 20, 3)
    assert (d1["busy_us"], d1["idle_us"], d1["a2a_us"]) == (25, 0, 10)
