"""Expert-parallel MoE block (te_async.expert_parallel) on N devices against moe_block on one.

One step is one MoE block forward: decode batches (a few tokens) and prefill (thousands), per
group-sizes mode and transport, tokens counted over all devices. Wall-clock step times of both
are measured unprofiled, back to back; then a profiled run of the expert-parallel step gives, per
device, its bubble (GPU-idle time in the step's window) and its all-to-all time (the union of the
collective kernels and peer copies in that window). The count exchange (an all_gather) is a
collective too and is counted in the all-to-all time. Traces have no GPU events on the CPU, so
there those fields are None.

On the CPU the devices come from XLA_FLAGS=--xla_force_host_platform_device_count=N (set before
jax starts), and only the "dense" transport runs (XLA:CPU has no ragged-all-to-all).
"""

import argparse
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from .. import GROUP_SIZES_MODES
from ..expert_parallel import TRANSPORTS, default_transport, moe_block_ep
from ..moe import moe_block
from . import presets, timing, trace
from .decode import NORM, init_params

N_INPUTS = 4  # rotated token batches, so that routing differs call to call
INNER = 5
PROFILED_STEPS = 3
ANNOTATION = "ep_step"
COLLECTIVE = re.compile(r"nccl|all.?to.?all|all.?gather|ragged|sendrecv", re.I)


def add_arguments(p) -> None:
    presets.add_argument(p)
    p.add_argument("--devices", type=int, help="devices the experts are spread over (default: all of the backend's)")
    p.add_argument("--tokens", type=int, nargs="+",
                   help="tokens per step over all devices (default: 8 64 4096 on a GPU, 8 32 elsewhere)")
    p.add_argument("--modes", nargs="+", choices=GROUP_SIZES_MODES, help="default: all")
    p.add_argument("--transports", nargs="+", choices=TRANSPORTS,
                   help="how rows reach their experts' devices: ragged (jax.lax.ragged_all_to_all) or dense "
                        "(a padded all_to_all); default: ragged where the platform has it")
    p.add_argument("--reps", type=int, default=30, help=f"timing samples of {INNER} steps each (default: 30)")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                   help="bubble and all-to-all time per device from a profiled run (default: on a GPU only)")


def _per_device(log_dir, devices: int) -> list:
    """Bubble and all-to-all time of the median profiled step, for each device."""
    events = trace.load_events(str(log_dir))
    rows = []
    for dev in range(devices):
        summary = trace.analyze_trace(str(log_dir), device=dev, annotation=ANNOTATION)["summary"]
        if summary["no_gpu_events"]:
            rows.append(dict(device=dev, busy_us=None, idle_us=None, idle_fraction=None, a2a_us=None, n_kernels=None))
            continue
        step = trace.steps(events, ANNOTATION, dev)[summary["step"]]["events"]
        collective = [e for e in step if COLLECTIVE.search(e["name"]) or e["kind"] == "memcpy_p2p"]
        a2a = trace.union((e["start"], e["end"]) for e in collective)
        rows.append(dict(device=dev, busy_us=summary["busy_us"], idle_us=summary["idle_us"],
                         idle_fraction=summary["idle_fraction"], a2a_us=sum(b - a for a, b in a2a),
                         n_kernels=summary["n_kernels"]))
    return rows


def _profile(step, inputs, log_dir, devices: int) -> list:
    with jax.profiler.trace(str(log_dir), create_perfetto_trace=True):
        for i in range(PROFILED_STEPS):
            with jax.profiler.StepTraceAnnotation(ANNOTATION, step_num=i):
                jax.block_until_ready(step(*inputs[i % len(inputs)]))
    return _per_device(log_dir, devices)


def _rel_error(y, ref) -> float:
    y, ref = (np.asarray(a, np.float32) for a in (y, ref))
    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))


def run(args) -> dict:
    gpu = jax.default_backend() == "gpu"
    preset, model = presets.resolve(args.preset)
    model = model._replace(layers=1)
    dtype = jnp.bfloat16 if gpu else jnp.float32
    devices = jax.devices()[: args.devices or len(jax.devices())]
    if len(devices) < 2:
        raise SystemExit(f"ep needs 2 or more devices, found {len(devices)} "
                         "(on the CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    mesh = Mesh(np.array(devices), ("ep",))
    modes = args.modes or list(GROUP_SIZES_MODES)
    transports = args.transports or [default_transport(mesh)]
    tokens_list = args.tokens or ([8, 64, 4096] if gpu else [8, 32])
    profile = gpu if args.profile is None else args.profile
    params = jax.tree.map(lambda a: a[0], init_params(model, dtype, jax.random.key(0)))
    block = dict(top_k=model.top_k, norm=NORM)
    sharded = lambda spec: NamedSharding(mesh, spec)
    by_expert = dict(router=P(), w_fc1=P("ep"), w_fc2=P("ep"), norm_scale=P())
    ep_params = jax.device_put(params, {k: sharded(spec) for k, spec in by_expert.items()})
    one_params = jax.device_put(params, devices[0])

    results = []
    for tokens in tokens_list:
        xs = [jax.random.normal(jax.random.key(1 + i), (tokens, model.hidden), dtype) for i in range(N_INPUTS)]
        ep_inputs = [(jax.device_put(x, sharded(P("ep"))), ep_params) for x in xs]
        one_inputs = [(jax.device_put(x, devices[0]), one_params) for x in xs]
        for mode in modes:
            one = jax.jit(lambda x, p, mode=mode: moe_block(x, **p, **block, group_sizes_mode=mode))
            one_t = timing.time_calls(one, one_inputs, reps=args.reps, inner=INNER)
            for transport in transports:
                row = dict(tokens=tokens, mode=mode, transport=transport, devices=len(devices), error=None)
                try:
                    ep = jax.jit(lambda x, p, mode=mode, transport=transport: moe_block_ep(
                        x, **p, **block, mesh=mesh, group_sizes_mode=mode, transport=transport))
                    row["rel_error_vs_one"] = _rel_error(ep(*ep_inputs[0]), one(*one_inputs[0]))
                    ep_t = timing.time_calls(ep, ep_inputs, reps=args.reps, inner=INNER)
                    row.update(one_device_ms=1e3 * one_t.median_s, ep_ms=1e3 * ep_t.median_s,
                               ep_p10_ms=1e3 * ep_t.p10_s, ep_p90_ms=1e3 * ep_t.p90_s,
                               speedup=one_t.median_s / ep_t.median_s)
                    if profile:
                        log_dir = args.out / "traces" / f"ep_{mode}_{transport}_T{tokens}"
                        row["per_device"] = _profile(ep, ep_inputs, log_dir, len(devices))
                except Exception as e:  # noqa: BLE001 -- the sweep goes on; the row says why this one failed
                    row["error"] = f"{type(e).__name__}: {e}"[:1000]
                results.append(row)
                print(row)
    table = markdown(results)
    (args.out / "ep.md").write_text(table)
    print(table)
    return {
        "benchmark": "ep",
        "config": dict(preset=preset, **model._asdict(), dtype=jnp.dtype(dtype).name, devices=len(devices),
                       tokens=tokens_list, modes=modes, transports=transports, reps=args.reps, inner=INNER,
                       inputs=N_INPUTS, profile=profile, profiled_steps=PROFILED_STEPS),
        "results": results,
    }


def markdown(results) -> str:
    """One row per (tokens, mode, transport); per-device figures as d0/d1/... lists."""
    lines = ["| tokens | mode | transport | 1 device ms | EP ms | speedup | all-to-all us per device "
             "| bubble us per device | rel err |", "|---|---|---|---|---|---|---|---|---|"]
    per = lambda r, k: "/".join("-" if d[k] is None else f"{d[k]:.0f}" for d in r.get("per_device", [])) or "-"
    for r in results:
        if r["error"]:
            lines.append(f"| {r['tokens']} | {r['mode']} | {r['transport']} | error: {r['error'][:80]} | | | | | |")
            continue
        lines.append(f"| {r['tokens']} | {r['mode']} | {r['transport']} | {r['one_device_ms']:.3f} | "
                     f"{r['ep_ms']:.3f} | {r['speedup']:.2f} | {per(r, 'a2a_us')} | {per(r, 'idle_us')} | "
                     f"{r['rel_error_vs_one']:.1e} |")
    return "\n".join(lines) + "\n"
