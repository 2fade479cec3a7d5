"""Decode step of an MoE transformer: step latency and GPU bubble per group-sizes mode.

One decode step is L MoE layers (router, dispatch, expert MLP, combine, residual) over stacked
layer weights under one jit; attention is left out because it has no group sizes and would only
dilute the bubble. The layers are scanned, or written out where te_async.models writes a decode
step's layers out (models.model.unrolls: device mode up to UNROLL_MAX_BATCH tokens, where a
scan trip's loop counter, copy and gaps cost more than a step of written-out layers); --unroll
forces either. Decode is where the group-sizes stall hurts most: each expert GEMM
is a few rows, so the host's wait for the sizes is not hidden behind GPU work.

Modes:
  sync, async   moe_block with that group_sizes_mode; async issues the copy before the permutation.
  async_late    async with early_copy=False: the copy issued by grouped_mlp, after the permutation,
                which shows what issuing it early buys.
  device        moe_block in device mode, when te_async has it: the routing kernel at decode sizes,
                and at T=1 the whole layer (norm, router, experts, residual) in one call of three
                kernels (te_async.token_moe).
  device_unfused  device mode without that fusion (the routing kernel still runs).
  ragged_dot    the same step with jax.lax.ragged_dot for fc1 and fc2: what plain JAX offers.
  nohost        the same step with each sorted row's expert weights gathered and applied by an
                einsum: equal math that never waits for the host. It reads T*k expert matrices,
                so it matches the floor's bytes only while the T*k routed experts are distinct;
                "nohost_reads_bytes" records what it reads.
  torch_graph   the same step in PyTorch (torch._grouped_mm, the routing and sort on the GPU), its
                layers captured in one CUDA graph and replayed, as a PyTorch server runs a decode
                step (torch_reference.moe_decode_step; where torch with CUDA imports, by default on
                a GPU). It reads the JAX weights in place. No profiled run: its bubble fields stay empty.

The floor is the bytes of the experts a batch actually hits (counted on the host from the routing,
per layer, averaged over the rotated inputs) over the HBM bandwidth measured in the same run;
active_experts_per_layer is the first input's count per layer, the input the profiled steps run, so
that a profiled scan trip (a layer) can be set against its own floor (the count varies by several
experts from layer to layer: at T = 8 on an H100, fc1's and fc2's times of a layer follow it).
Every mode's first layer is checked against sync at one batch (rel_error_vs_sync; the first layer
only, since later layers may route near-tied tokens differently after bf16 rounding, with no fault
in either mode). Wall-clock latency is measured unprofiled, two ways: steps on N_INPUTS rotated
inputs, blocked on every INNER steps (median_ms: each step on new buffers), and a loop whose state
(the step count and the last output) stays in donated buffers, as models.generate runs its steps
(loop_ms; the same rotated inputs, read by the count). The bubble comes from a separate profiled
run, because profiling turns XLA's command buffers off unless XLA_FLAGS says otherwise.
"""

import argparse
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import GROUP_SIZES_MODES
from ..mlp import EPS, activate, normalize
from ..models.model import UNROLL_MAX_BATCH, unrolls, written_out_scan
from ..moe import combine, dispatch_rows, moe_block, plan_dispatch, route_top_k
from . import presets, timing, torch_reference, trace

try:
    from tqdm import tqdm as _progress
except ImportError:  # tqdm is an optional extra

    def _progress(iterable, **_):
        return iterable


RESULT_KEYS = (
    "mode", "batch", "median_ms", "p10_ms", "p90_ms", "samples", "floor_ms", "ratio_to_floor",
    "active_experts", "active_experts_per_layer", "busy_us", "idle_us", "idle_fraction", "n_host_syncs",
    "n_graph_launches", "n_kernels", "rel_error_vs_sync", "nohost_reads_bytes", "written_out", "loop_ms", "error",
)
PROFILE_KEYS, CMDBUF_FLAG = timing.PROFILE_KEYS, timing.CMDBUF_FLAG
ANNOTATION = "decode_step"
NORM, ACTIVATION = "rmsnorm", "swiglu"
N_INPUTS = 4  # rotated hidden states, so that routing (and so the group sizes) differs call to call
INNER = 5  # steps per timing sample, so that one sample spans a millisecond or more
PROFILED_STEPS = 3


def _te_moe(mode, early_copy=True, fuse=True):
    def layer(x, p, model):
        return moe_block(x, p["router"], p["w_fc1"], p["w_fc2"], top_k=model.top_k, norm_scale=p["norm_scale"],
                         norm=NORM, activation=ACTIVATION, group_sizes_mode=mode, early_copy=early_copy, fuse=fuse,
                         residual=True)

    return layer


def _routed(expert_mlp):
    """moe_block's routing, dispatch and combine around another expert MLP, so that only the
    grouped GEMMs differ from the te_async modes."""

    def layer(x, p, model):
        routing = route_top_k(x, p["router"], model.top_k)
        dispatch = plan_dispatch(routing.experts, model.experts)
        rows = dispatch_rows(normalize(x, p["norm_scale"], None, NORM, EPS), dispatch)
        return x + combine(expert_mlp(rows, dispatch.group_sizes, p["w_fc1"], p["w_fc2"]), dispatch, routing.weights)

    return layer


def ragged_dot_mlp(rows, group_sizes, w_fc1, w_fc2, ragged_dot=jax.lax.ragged_dot):
    """The expert MLP (fc1, activation, fc2) with jax.lax.ragged_dot, what plain JAX offers, or a
    drop-in for it (te_async.ragged_dot)."""
    h = ragged_dot(rows, w_fc1, group_sizes)
    return ragged_dot(activate(h, ACTIVATION), w_fc2, group_sizes)


def _gathered_mlp(rows, group_sizes, w_fc1, w_fc2):
    expert = jnp.repeat(jnp.arange(w_fc1.shape[0]), group_sizes, total_repeat_length=rows.shape[0])
    h = jnp.einsum("mh,mhf->mf", rows, jnp.take(w_fc1, expert, axis=0))
    return jnp.einsum("mf,mfh->mh", activate(h, ACTIVATION), jnp.take(w_fc2, expert, axis=0))


# moe_block's arguments of each te_async mode; its group_sizes_mode also decides models.model.unrolls.
TE_MODES = {"sync": dict(mode="sync"), "async": dict(mode="async"), "async_late": dict(mode="async", early_copy=False)}
if "device" in GROUP_SIZES_MODES:
    TE_MODES.update(device=dict(mode="device"), device_unfused=dict(mode="device", fuse=False))
MODES = {name: _te_moe(**kw) for name, kw in TE_MODES.items()}
MODES.update(ragged_dot=_routed(ragged_dot_mlp), nohost=_routed(_gathered_mlp))
TORCH = "torch_graph"
UNROLL = ("auto", "never", "always")


def default_modes(gpu: bool) -> list:
    """Every mode, torch's on a GPU only."""
    return [*MODES, *([TORCH] if gpu else [])]


def writes_out(unroll: str, mode: str, batch: int) -> bool:
    """Whether the step of `mode` at `batch` tokens has its layers written out: --unroll, or
    with "auto" where te_async.models' decode step does."""
    if mode == TORCH:
        return True  # a Python loop over the layers, captured in its graph
    if unroll != "auto":
        return unroll == "always"
    return mode in TE_MODES and unrolls(batch, TE_MODES[mode]["mode"])


def make_step(layer, model, with_experts=False, written_out=False):
    """The jitted decode step, its layers scanned or written out; with_experts also returns each
    layer's routing [L, T, k] for the floor."""

    def body(h, xs):
        p, _ = xs
        experts = route_top_k(h, p["router"], model.top_k).experts if with_experts else None
        return layer(h, p, model), experts

    scan = written_out_scan if written_out else jax.lax.scan

    def step(params, x):
        layers = jax.tree_util.tree_leaves(params)[0].shape[0]  # the model's, or one for the first-layer check
        h, experts = scan(body, x, (params, np.arange(layers)))
        return (h, experts) if with_experts else h

    return jax.jit(step)


def init_params(m: presets.Model, dtype, key):
    """Layer weights stacked on a leading [L] axis, normal and scaled by 1/sqrt(fan-in); drawn one
    layer at a time so that no single draw approaches 2**32 elements."""

    def layer(key):
        k1, k2, k3 = jax.random.split(key, 3)
        normal = lambda k, shape, fan_in: jax.random.normal(k, shape, dtype) / math.sqrt(fan_in)
        return dict(
            router=normal(k1, (m.hidden, m.experts), m.hidden),
            w_fc1=normal(k2, (m.experts, m.hidden, 2 * m.ffn), m.hidden),
            w_fc2=normal(k3, (m.experts, m.ffn, m.hidden), m.ffn),
            norm_scale=jnp.ones((m.hidden,), jnp.float32),
        )

    return jax.jit(jax.vmap(layer))(jax.random.split(key, m.layers))


def _floor(params, model, xs, expert_bytes, hbm_bytes_per_s):
    """Active experts (the sync step's routing, averaged over the layers and inputs), the floor, and
    the first input's count per layer: the profiled steps run that input (_profile), so that each
    scan trip (a layer) of the timeline can be set against its own floor."""
    step = make_step(MODES["sync"], model, with_experts=True)
    counts = [[len(np.unique(layer)) for layer in np.asarray(step(params, x)[1])] for x in xs]
    active = float(np.mean(counts))
    return dict(active_experts=active, active_experts_per_layer=counts[0],
                floor_ms=1e3 * active * model.layers * expert_bytes / hbm_bytes_per_s)


def _first_layer_check(params, model, x):
    """Inputs and sync output of the first layer alone, which every mode is checked against. Only
    the first layer routes identical inputs: after it, bf16 rounding differences between modes
    flip near-tied router choices, and the error of a whole step grows with depth for no fault."""
    first = jax.tree_util.tree_map(lambda a: a[:1], params)
    return first, x, make_step(MODES["sync"], model)(first, x)


def _rel_error(y, ref):
    y, ref = (np.asarray(a, np.float32) for a in (y, ref))
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def _profile(step, first_input, log_dir):
    """Bubble figures of the median of PROFILED_STEPS steps of the first input (whose routing
    active_experts_per_layer gives), and that step's device window."""
    return timing.profile_steps(lambda i: step(*first_input), log_dir, steps=PROFILED_STEPS, annotation=ANNOTATION)


def _loop_s(step, step_inputs, steps):
    """Seconds per step of a loop that carries (step count, last output) in donated buffers and
    feeds step n the same rotated input as the timed calls (so the same routing and floor; the
    previous output, fed back, would drift towards a few experts over the steps)."""
    params = step_inputs[0][0]
    xs = jnp.stack([x for _, x in step_inputs])

    def loop_step(const, state):
        (params, xs), (n, _) = const, state
        return n + 1, step(params, xs[n % xs.shape[0]])

    return timing.chained_calls(loop_step, (params, xs), (jnp.int32(0), jnp.zeros_like(xs[0])), steps=steps)


def _torch_layers(params):
    """torch_reference.moe_decode_step's weights per layer: views of the stacked JAX params (DLPack,
    no copy), the router cast to float32 once."""
    t = torch_reference.tensor
    router, w_fc1, w_fc2, scale = (t(params[k]) for k in ("router", "w_fc1", "w_fc2", "norm_scale"))
    return [(router[i].float(), w_fc1[i], w_fc2[i], scale[i]) for i in range(router.shape[0])]


def _torch_contender(model, step_inputs):
    """(call(x), its input sets, block, check(params, x) -> output): torch's step over the params of
    step_inputs replayed from one CUDA graph, and the same step run eagerly for the check."""
    step_of = lambda params: torch_reference.moe_decode_step(_torch_layers(params), model.top_k, EPS)
    sets = [(torch_reference.tensor(x),) for _, x in step_inputs]
    call = torch_reference.graphed(step_of(step_inputs[0][0]), sets[0][0])
    check = lambda params, x: torch_reference.to_numpy(step_of(params)(torch_reference.tensor(x)))
    return call, sets, torch_reference.block, check


def _measure(mode, batch, step_inputs, ref, model, args, profile, expert_bytes):
    """One result row; a mode that raises (out of memory, unsupported) gets an error, not a crash."""
    row = dict.fromkeys(RESULT_KEYS) | dict(mode=mode, batch=batch)
    row.update({k: ref.get(k) for k in ("floor_ms", "active_experts", "active_experts_per_layer")})
    if mode == "nohost":
        row["nohost_reads_bytes"] = batch * model.top_k * expert_bytes * model.layers
    row["written_out"] = writes_out(args.unroll, mode, batch)
    window = None
    try:
        if mode == TORCH:
            step, sets, block, check = _torch_contender(model, step_inputs)
        else:
            step = check = make_step(MODES[mode], model, written_out=row["written_out"])
            sets, block = step_inputs, jax.block_until_ready
        if "check" in ref:
            first, x, y_sync = ref["check"]
            row["rel_error_vs_sync"] = _rel_error(check(first, x), y_sync)
        row.update(timing.time_calls(step, sets, reps=args.reps, inner=INNER, block=block).as_dict())
        steps = args.reps * INNER
        # torch's replays go out back to back and are blocked on once, as the JAX loop's calls are
        row["loop_ms"] = 1e3 * (timing.time_calls(step, sets, reps=1, inner=steps, block=block).median_s
                                if mode == TORCH else _loop_s(step, step_inputs, steps=steps))
        if row["floor_ms"]:
            row["ratio_to_floor"] = row["median_ms"] / row["floor_ms"]
        if profile and mode != TORCH:
            fields, window = _profile(step, step_inputs[0], args.out / "traces" / f"{mode}_T{batch}")
            row.update(fields)
    except Exception as e:  # noqa: BLE001 -- the sweep goes on; the row says why this one failed
        row["error"] = f"{type(e).__name__}: {e}"[:1000]
    return row, window


def markdown(results, modes, batches):
    """Rows are batch sizes, columns modes; a cell is median ms (ratio to floor, GPU idle fraction,
    and "written out" where the step's layers were), then the ms per step of a donated loop."""
    cell = {(r["mode"], r["batch"]): r for r in results}

    def fmt(r):
        if r["median_ms"] is None:
            return "error"
        ratio = f"{r['ratio_to_floor']:.1f}x" if r["ratio_to_floor"] is not None else "-"
        idle = f"{100 * r['idle_fraction']:.0f}% idle" if r["idle_fraction"] is not None else "-"
        layers = ", written out" if r["written_out"] else ""
        loop = f", loop {r['loop_ms']:.3f}" if r["loop_ms"] is not None else ""
        return f"{r['median_ms']:.3f} ({ratio}, {idle}{layers}){loop}"

    floors = {r["batch"]: r["floor_ms"] for r in results}
    lines = ["| T | floor ms | " + " | ".join(modes) + " |", "|---" * (len(modes) + 2) + "|"]
    for b in batches:
        floor = f"{floors[b]:.3f}" if floors.get(b) is not None else "-"
        lines.append(f"| {b} | {floor} | " + " | ".join(fmt(cell[m, b]) for m in modes) + " |")
    return "\n".join(lines) + "\n"


def plot_latency(results, modes, out_png, *, key="median_ms", xlabel="tokens per decode step (T)",
                 ylabel="step latency, median (ms)", floor_label="floor (active expert bytes / HBM)", title=None):
    """Latency (results' `key`) against batch, one line per mode, and the floor (`floor_ms`) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mode in modes:
        pts = sorted((r["batch"], r[key]) for r in results if r["mode"] == mode and r[key] is not None)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=mode)
    floor = sorted({(r["batch"], r["floor_ms"]) for r in results if r["floor_ms"] is not None})
    if floor:
        ax.plot(*zip(*floor), "k--", label=floor_label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def add_arguments(parser):
    presets.add_argument(parser)
    for name in presets.Model._fields:
        flag = "--topk" if name == "top_k" else f"--{name}"
        parser.add_argument(flag, dest=name, type=int, help=f"override the preset's {name.replace('_', '-')}"
                            + (" (fewer make a quicker run)" if name == "layers" else ""))
    parser.add_argument("--batches", type=int, nargs="+",
                        help="tokens per step (default: 1 to 256, powers of 2, on a GPU; 1 8 64 elsewhere)")
    parser.add_argument("--modes", nargs="+", choices=[*MODES, TORCH],
                        help=f"default: all ({TORCH} on a GPU only)")
    parser.add_argument("--unroll", choices=UNROLL, default="auto",
                        help="the step's layers written out (always) or scanned (never); auto (default): written out where "
                             f"te_async.models' decode step writes them out (device mode up to T={UNROLL_MAX_BATCH})")
    parser.add_argument("--reps", type=int, default=30, help=f"timing samples of {INNER} steps each (default: 30)")
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                        help="a profiled run for the GPU's bubble (default: on a GPU only)")
    parser.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True, help="draw PNG plots (default: on)")
    parser.add_argument("--detail-batch", type=int, default=8,
                        help="batch (nearest of --batches) whose first layer is checked against sync "
                             "and whose profiled step is drawn per mode")
    parser.add_argument("--hbm-gib", type=float, help="GiB read by the bandwidth probe (default: 2 on a GPU, "
                        "1/32 elsewhere, where the floor means little and a large probe is slow)")
    parser.add_argument("--cmdbuf-during-profiling", action="store_true",
                        help=f"require {CMDBUF_FLAG} in XLA_FLAGS. XLA reads its flags when the backend starts, "
                             "before this benchmark runs, so the caller must set XLA_FLAGS; this only checks")


def run(args) -> dict:
    cmdbuf = timing.cmdbuf_during_profiling()
    if args.cmdbuf_during_profiling and not cmdbuf:
        raise SystemExit(f"--cmdbuf-during-profiling: run with XLA_FLAGS='{CMDBUF_FLAG}' set by the caller")
    gpu = jax.default_backend() == "gpu"
    profile = gpu if args.profile is None else args.profile
    dtype = jnp.bfloat16 if gpu else jnp.float32
    preset, model = presets.resolve(args.preset)
    model = model._replace(**{k: getattr(args, k) for k in presets.Model._fields if getattr(args, k)})
    modes = args.modes or default_modes(gpu)
    batches = args.batches or ([1, 2, 4, 8, 16, 32, 64, 128, 256] if gpu else [1, 8, 64])
    expert_bytes = model.expert_bytes(dtype)
    hbm = timing.hbm_bandwidth(args.hbm_gib)
    params = init_params(model, dtype, jax.random.key(0))

    detail = min(batches, key=lambda b: abs(b - args.detail_batch))
    inputs, refs = {}, {}
    for b in batches:
        xs = [jax.random.normal(jax.random.key(1 + i), (b, model.hidden), dtype) for i in range(N_INPUTS)]
        inputs[b] = [(params, x) for x in xs]
        try:
            refs[b] = _floor(params, model, xs, expert_bytes, hbm)
            if b == detail:
                refs[b]["check"] = _first_layer_check(params, model, xs[0])
        except Exception as e:  # noqa: BLE001 -- rows of this batch then carry no floor and no check
            refs[b] = dict(error=f"{type(e).__name__}: {e}"[:1000])

    results, intervals = [], {}
    for b, mode in _progress(list(itertools.product(batches, modes)), desc="decode"):
        row, window = _measure(mode, b, inputs[b], refs[b], model, args, profile, expert_bytes)
        results.append(row)
        if window is not None and b == detail:
            intervals[mode] = trace.timeline_intervals(args.out / "traces" / f"{mode}_T{b}", window=window)

    trace.write_timeline(intervals, args.out / f"decode_timeline_T{detail}", args.plots)
    if args.plots:
        plot_latency(results, modes, args.out / "decode_latency.png")
    table = markdown(results, modes, batches)
    (args.out / "decode.md").write_text(table)
    print(table)
    return {
        "benchmark": "decode",
        "config": dict(preset=preset, **model._asdict(), dtype=jnp.dtype(dtype).name, norm=NORM,
                       activation=ACTIVATION, expert_bytes=expert_bytes, batches=batches, modes=modes,
                       unroll=args.unroll, reps=args.reps, inner=INNER, inputs=N_INPUTS, profile=profile,
                       profiled_steps=PROFILED_STEPS, detail_batch=detail,
                       reference_errors={b: r["error"] for b, r in refs.items() if "error" in r}),
        "hbm_bytes_per_s": hbm,
        "cmdbuf_during_profiling": cmdbuf,
        "results": results,
    }
