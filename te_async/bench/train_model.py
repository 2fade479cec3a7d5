"""A real model's training step: the loss and every gradient of an MoE decoder, per expert path.

One step is jax.value_and_grad of te_async.models.next_token_loss (the mean next-token
cross-entropy, float32, over logits in the model's dtype) on --batch sequences of --seq random
tokens, differentiated in every parameter (embeddings, attention, norms, the router through its
routing weights, the shared and routed experts, the LM head): what a JAX training step computes
before its optimizer. The model is a preset's config with random weights (or --hf, a local
checkpoint), cut to its first --layers decoder layers. Contenders differ only in the routed experts:
te_async.grouped_mlp in each group_sizes_mode (device, sync, async), and jax.lax.ragged_dot (the
models' experts="ragged_dot", what plain JAX offers). Each is checked against the first (its loss,
and its gradients' relative error), and for determinism: a second step on the same input must give
the same gradient bits.

Per contender and depth: the step's wall clock (median of back-to-back steps) and GPU busy time
(the profiler's kernel time), the GB of temporary buffers XLA's compiled step allocates (its
memory besides the parameters, tokens and outputs: what the forward keeps for the backward, and
scratch), tokens per second, and model TFLOP/s by wall clock:
te_async.models.train_flops (every weight matrix a token passes through and causal attention, 3x
the forward) over the step's time, the count MFU uses. With two depths, the slope between them is
what one more decoder layer adds to a step. On a GPU one step of the deepest model is profiled per
contender: its GPU time per kernel (train_model_timeline_kernels.md: where a training step's time
goes) and its idle share.
"""

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from .. import models
from . import presets, timing, trace
from .generate import load_model, truncate

CONTENDERS = ("device", "sync", "async", "ragged_dot")


def add_arguments(p) -> None:
    presets.add_argument(p)
    p.add_argument("--hf", metavar="PATH", help="a local Hugging Face checkpoint instead of a preset's random weights")
    p.add_argument("--layers", type=presets.positive_int, nargs="+", default=[2, 4],
                   help="decoder layers of the timed models, the first ones of the model's (default: 2 4; two or more "
                        "give the slope per layer)")
    p.add_argument("--batch", type=presets.positive_int, default=1, help="sequences per step (default: 1)")
    p.add_argument("--seq", type=presets.positive_int, help="tokens per sequence (default: 4096; 256 with --preset tiny)")
    p.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS,
                   help="the routed experts' path (default: all; the first is the reference)")
    p.add_argument("--remat", action="store_true", help="each decoder layer under jax.checkpoint (models.forward's remat)")
    p.add_argument("--reps", type=presets.positive_int, default=10, help="timing samples of 3 steps each (default: 10)")
    p.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                   help="profile one step of the deepest model per contender (default: on a GPU only)")
    p.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True,
                   help="draw the profiled steps' timeline (default: on)")


def train_step(config, contender: str, remat: bool = False):
    """The jitted step (params, tokens [B, S + 1]) -> (loss, grads) of te_async.models.next_token_loss."""
    experts, mode = ("ragged_dot", None) if contender == "ragged_dot" else ("te_async", contender)

    loss = lambda params, tokens: models.next_token_loss(params, config, tokens, group_sizes_mode=mode,
                                                         experts=experts, remat=remat)
    return jax.jit(jax.value_and_grad(loss))


def _rel_error(out, ref) -> float:
    """Relative error of a pytree of gradients, over all its leaves at once."""
    diff = sum(float(np.sum((np.asarray(o, np.float64) - np.asarray(r, np.float64)) ** 2))
               for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)))
    norm = sum(float(np.sum(np.asarray(r, np.float64) ** 2)) for r in jax.tree.leaves(ref))
    return float(np.sqrt(diff / max(norm, 1e-300)))


def compile_step(step, inputs) -> tuple:
    """(the step compiled ahead of time for inputs' shapes, its temporary buffers in GB; None where
    the backend does not report them)."""
    compiled = step.lower(*inputs[0]).compile()
    stats = compiled.memory_analysis()
    return compiled, None if stats is None else stats.temp_size_in_bytes / 1e9


def _same_bits(a, b) -> bool:
    return all(np.array_equal(np.asarray(x).reshape(-1).view(np.uint8), np.asarray(y).reshape(-1).view(np.uint8))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def measure(step, inputs, reps: int, gpu: bool) -> tuple:
    """(wall clock and GPU time of a step, its host-size counters and whether a second step on the
    first input gives the same bits; the first input's output)."""
    out, counts = timing.counted_call(step, *inputs[0])
    t = timing.time_calls(step, inputs, reps=reps, inner=3)
    gpu_s = timing.device_time_s(step, inputs, calls=3) if gpu else None
    row = {**t.as_dict(), "gpu_ms": None if gpu_s is None else 1e3 * gpu_s,
           "deterministic": _same_bits(out, step(*inputs[0])), "host_sizes": counts}
    return row, out


def profile(step, inputs, log_dir) -> tuple:
    """(idle figures of a profiled step, its kernels' timeline intervals or None off a GPU)."""
    fields, window = timing.profile_steps(lambda i: step(*inputs[i % len(inputs)]), log_dir, steps=2,
                                          annotation="train_step")
    return fields, None if window is None else trace.timeline_intervals(log_dir, window=window)


def run(args) -> dict:
    gpu = jax.default_backend() == "gpu"
    profiled = gpu if args.profile is None else args.profile
    dtype = jnp.bfloat16 if gpu else jnp.float32
    preset = None if args.hf else presets.default_name(args.preset)
    seq = args.seq or presets.prefill_tokens(preset or presets.GPU_DEFAULT)
    depths = sorted(set(args.layers))
    t0 = time.perf_counter()
    full_params, full_config = load_model(preset, args.hf, max(depths), dtype)
    jax.block_until_ready(full_params)
    print(f"train-model: {args.hf or preset}, {full_config.model_type}, layers {depths}, batch {args.batch} x "
          f"{seq} tokens, {jnp.dtype(dtype).name}, weights ready in {time.perf_counter() - t0:.1f} s", flush=True)
    key = jax.random.key(1)
    results, timelines = [], {}
    for depth in depths:
        params, config = truncate(full_params, full_config, depth)
        flops = models.train_flops(config, args.batch, seq)
        inputs = [(params, jax.random.randint(jax.random.fold_in(key, i), (args.batch, seq + 1), 0, config.vocab_size))
                  for i in range(2)]
        reference = None
        for contender in args.contenders:
            row = {"contender": contender, "layers": depth, "tokens": args.batch * seq, "model_flops": flops}
            try:
                reps = args.reps if contender != "ragged_dot" or not gpu else max(3, args.reps // 3)  # XLA's is slow
                step, temp_gb = compile_step(train_step(config, contender, args.remat), inputs)
                timed, out = measure(step, inputs, reps, gpu)
                row.update(timed, temp_gb=temp_gb, tokens_per_s=args.batch * seq / (timed["median_ms"] / 1e3),
                           tflops=flops / (timed["median_ms"] / 1e3) / 1e12, loss=float(out[0]))
                if profiled and depth == depths[-1]:
                    fields, intervals = profile(step, inputs, args.out / "traces" / contender)
                    row.update(fields)
                    if intervals:
                        timelines[contender] = intervals
                if contender == args.contenders[0]:
                    reference = out
                elif reference is not None:
                    row.update(loss_rel_error=abs(float(out[0]) - float(reference[0])) / abs(float(reference[0])),
                               grad_rel_error=_rel_error(out[1], reference[1]))
            except Exception as e:  # a contender that cannot run here is recorded, not fatal
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            results.append(row)
            print(_line(row), flush=True)
    trace.write_timeline(timelines, args.out / "train_model_timeline", args.plots)
    slopes = per_layer_slopes(results, depths)
    result = {"benchmark": "train-model",
              "config": dict(preset=preset, hf=args.hf, model=dataclasses.asdict(full_config), layers=depths,
                             batch=args.batch, seq=seq, dtype=jnp.dtype(dtype).name, remat=args.remat,
                             contenders=args.contenders,
                             reference=args.contenders[0], profile=profiled,
                             cmdbuf_during_profiling=timing.cmdbuf_during_profiling()),
              "results": results, "slopes": slopes}
    table = markdown(result)
    (args.out / "train_model.md").write_text(table)
    print(table)
    return result


def per_layer_slopes(results: list, depths: list) -> dict:
    """contender -> ms one more decoder layer adds to a step, between the shallowest and the
    deepest model (wall clock)."""
    if len(depths) < 2:
        return {}
    ms = {(r["contender"], r["layers"]): r["median_ms"] for r in results if "error" not in r}
    lo, hi = depths[0], depths[-1]
    return {c: (ms[c, hi] - ms[c, lo]) / (hi - lo) for c, _ in ms if (c, lo) in ms and (c, hi) in ms}


def _line(row) -> str:
    head = f"{row['layers']:3d} layers {row['contender']:10s}"
    if "error" in row:
        return f"{head} error: {row['error'][:160]}"
    gpu = "" if row["gpu_ms"] is None else f" (GPU {row['gpu_ms']:.2f} ms)"
    if row.get("idle_fraction") is not None:
        gpu += f" idle {row['idle_fraction']:.0%} of a profiled step"
    check = "" if "grad_rel_error" not in row else f"  grads vs reference {row['grad_rel_error']:.1e}"
    gpu += "" if row["temp_gb"] is None else f" temp {row['temp_gb']:.3g} GB"
    return (f"{head} {row['median_ms']:9.2f} ms/step{gpu} {row['tokens_per_s']:10.0f} tokens/s "
            f"{row['tflops']:7.3g} TFLOP/s  loss {row['loss']:.4f}{check}  deterministic {row['deterministic']}")


def _cell(row) -> str:
    if row is None or "error" in row:
        return "error" if row else ""
    gpu = "" if row["gpu_ms"] is None else f" / {row['gpu_ms']:.2f}"
    return f"{row['median_ms']:.2f}{gpu} ({row['tflops']:.3g})"


def markdown(result) -> str:
    rows, cfg, slopes = result["results"], result["config"], result["slopes"]
    depths = cfg["layers"]
    find = lambda c, d: next((r for r in rows if r["contender"] == c and r["layers"] == d), None)
    head = ["contender"] + [f"{d} layers: ms per step (TFLOP/s)" for d in depths]
    head += ["ms per layer (slope)"] if slopes else []
    head += ["temp GB", "GPU idle", "grads vs " + cfg["reference"], "same bits twice"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for c in cfg["contenders"]:
        deepest = find(c, depths[-1])
        ok = deepest is not None and "error" not in deepest
        cells = [c] + [_cell(find(c, d)) for d in depths]
        cells += [f"{slopes[c]:.2f}" if c in slopes else ""] if slopes else []
        idle, temp = (deepest.get("idle_fraction"), deepest["temp_gb"]) if ok else (None, None)
        cells += ["" if temp is None else f"{temp:.3g}", "" if idle is None else f"{idle:.0%}",
                  f"{deepest['grad_rel_error']:.1e}" if ok and "grad_rel_error" in deepest else "",
                  str(deepest["deterministic"]) if ok else ""]
        lines.append("| " + " | ".join(cells) + " |")
    name = cfg["hf"] or cfg["preset"]
    remat = ", each layer under jax.checkpoint" if cfg["remat"] else ""
    lines += ["", f"{name}'s first layers, a training step (loss and every gradient{remat}) on {cfg['batch']} x "
              f"{cfg['seq']} tokens, {cfg['dtype']}: wall clock ms per step (median of back-to-back steps) / GPU busy ms, and model "
              "TFLOP/s by wall clock (te_async.models.train_flops); the slope is what one more layer adds (wall clock). "
              "Temp GB (XLA's temporary buffers of the compiled step: what the forward keeps for the backward, and "
              "scratch), GPU idle, gradients against the first contender's (relative error over all of them) and same bits (a second "
              "step on the same input) are the deepest model's; the idle share is of a profiled step, its GPU time per kernel "
              "in train_model_timeline_kernels.md."]
    return "\n".join(lines) + "\n"
