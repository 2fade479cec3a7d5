"""Greedy generation with a whole MoE model: per-token decode latency per group-sizes mode.

A te_async.models decoder with the real shapes of DeepSeek-V2-Lite, Qwen3-30B-A3B or
Mixtral-8x7B (random weights: te_async.models.preset + init_params; --hf PATH loads a local
checkpoint instead) decodes B sequences, one token each per step, against a KV cache of
--context tokens, once per mode:
  sync, async, device   the routed experts through te_async.grouped_mlp in that group-sizes mode
                        (device with one token per step: the routed and shared experts in
                        one kernel, te_async.token_ffn);
  device_unfused        device mode without that fusion;
  ragged_dot            the same model with jax.lax.ragged_dot for the experts (plain JAX).
Everything else in the step (attention, shared experts, routers, LM head) is the same code.

The KV cache. A 4096-token prefill at batch 64 does not fit the models' attention, which forms
[B, heads, S, S] scores, so every run, for each batch and mode alike, makes its cache this way:
  - positions 0 .. P-1 (P = --prompt): a real prompt of random token ids, prefilled by
    te_async.models.prefill (default mode);
  - positions P .. --context - 1: random entries, drawn per channel of each layer's cache arrays
    (k and v per head and feature; DeepSeek's MLA: latent and rope key per feature) from a normal
    distribution with that channel's mean and standard deviation over the prompt's entries, so
    that they have the scale this model writes;
  - the decode steps of one mode (n of them: the check, timed and profiled steps below) run at
    positions --context - n .. --context - 1, each writing its own entry before attending; the
    last step attends to all --context tokens.
Decode timing does not depend on these values: decode_step reads its whole cache array (max_len =
--context) at every step and masks the entries past its position, so every step reads and
multiplies the same bytes whatever they hold. Their values matter only through the attention
output, hence the routing, which the random tokens vary anyway.

Agreement. Each mode first decodes --check-tokens tokens from the same cache: the reference mode
(the first of --modes) greedily, from the argmax of the prompt's logits; the others teacher-forced
with the reference's tokens. A mode agrees where its argmax equals the reference's at every step
and batch row (then its own greedy run emits the same tokens); tokens_agree is that fraction,
logits_rel_error the relative error of its logits, and disagree_margin, where some differ, the
largest gap in the reference's logits between its token and this mode's: in bfloat16, random
weights give near-tied logits over a large vocabulary, and rounding can flip a few of them (on an
H200 at 3 layers: relative errors near 3e-3, one token in 4 or 32 flipped). These steps also
compile and warm up.

Timing. Then --steps steps of a jitted te_async.models.decode_step, fed fresh random tokens each
(the same ones in every mode) so that routing changes from step to step. Each step is dispatched
and blocked on (its logits) alone, as a generation loop that reads each token does: per-token
latency p50 and p99 on the host's clock, and tokens/s = batch / p50. So a step's host dispatch is
not hidden behind the previous step's GPU work, and counts in its latency.

Generate's loop. Then the same number of steps of te_async.models.generate's own loop
(models.model._greedy_step: the tokens and cache in donated device state, the layers written out
where generate writes them out) from the first timed step's position, dispatched back to back and
blocked on once at the end: generate_loop_ms per token, what a caller of models.generate gets. The
host dispatches step n + 1 while the GPU runs step n, so the host's time per step is hidden where
it is shorter than the GPU's (in a profiled DeepSeek-V2-Lite step at B=1, about 0.3 ms before
the first kernel and 0.15-0.2 ms after the last, of a 3.4 ms blocked step).

GPU idle. A few more steps of generate's loop under jax.profiler, each blocked on, measured with
trace.py's bubble meter as the decode benchmark does: (span - busy) / span of the median profiled
step. So the profile shows the step generate runs (at B=1, since 0e9ee4c, the layers written out:
no scan trips). The CLI adds
--xla_enable_command_buffers_during_profiling=true to XLA_FLAGS (unless they name that flag), so
that a profiled step keeps the CUDA graphs of the timed ones.

Floor. te_async.models.decode_bytes(config, B, --context, active) over the HBM read bandwidth
measured in the same run (timing.hbm_bandwidth): every weight a step reads (attention, norms,
dense layers, shared experts, routers, LM head), the KV cache up to --context, and the routed
experts the batch activates. active, per MoE layer, is counted from the routing: the timed steps
run decode_step(..., return_routing=True) (every step of a mode does, so that one compilation
serves them all), and each MoE layer's count is the number of distinct experts its B tokens
chose, the mean over the timed steps; decode_bytes is linear in each layer's count and takes the
fractional mean as it is. Each row counts its own mode's
routing (the modes see the same tokens and cache, so they agree but for near ties).

Memory. The run prints the weights' and the largest cache's bytes first (bfloat16, all layers,
cache at batch 64 and 4096 tokens: DeepSeek-V2-Lite 31 + 8 GB, Qwen3-30B-A3B 61 + 26 GB,
Mixtral-8x7B 93 + 34 GB). JAX takes 75 % of a GPU's memory by default, 105 GB of a 141 GB H200:
for Mixtral raise XLA_PYTHON_CLIENT_MEM_FRACTION (e.g. 0.95) or use fewer --layers. A mode or
batch that runs out of memory gets a row with its error; the sweep goes on.
"""

import argparse
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from .. import GROUP_SIZES_MODES, models
from ..models.cost import tree_bytes
from ..models.model import _GreedyState, _greedy_step, greedy_tokens, unrolls
from . import decode, presets, timing, trace

MODES = {m: dict(group_sizes_mode=m, experts="te_async") for m in ("sync", "async", "device") if m in GROUP_SIZES_MODES}
if "device" in MODES:  # the unfused device path, beside the fused one (te_async.decode_moe) it replaces at B=1
    MODES["device_unfused"] = dict(group_sizes_mode="device", experts="te_async_unfused")
MODES["ragged_dot"] = dict(group_sizes_mode=None, experts="ragged_dot")
XLA_FLAGS = (timing.CMDBUF_FLAG,)  # the CLI adds them before the backend starts
ANNOTATION = "generate_step"
PROFILED_STEPS = 3
RESULT_KEYS = (
    "mode", "batch", "p50_ms", "p99_ms", "mean_ms", "min_ms", "steps", "tokens_per_s", "generate_loop_ms",
    "generate_loop_tokens_per_s", "floor_ms",
    "ratio_to_floor", "active_experts", "busy_us", "idle_us", "idle_fraction", "n_host_syncs",
    "n_graph_launches", "n_kernels", "reference_mode", "tokens_agree", "logits_rel_error", "disagree_margin",
    "greedy_tokens", "first_step_s", "active_experts_per_layer", "error",
)
ACTIVE_EXPERTS_SOURCE = ("counted from the routing: distinct experts per MoE layer among the batch's tokens in each "
                         "timed step (decode_step return_routing=True), mean over the timed steps")


# ----------------------------------------------------------------------------------- the model


def load_model(preset=None, hf=None, layers=None, dtype=jnp.float32, seed=0) -> tuple:
    """(params, config): a local checkpoint (hf, cast to dtype), or a preset's config with random
    weights (te_async.models.init_params); layers keeps the first `layers` decoder layers."""
    if hf is not None:
        params, config = models.load_hf(hf, dtype)
        return (params, config) if layers is None else truncate(params, config, layers)
    config = presets.config(presets.default_name(preset), **({} if layers is None else {"num_hidden_layers": layers}))
    # An RBG key: XLA compiles its generator far faster than threefry's, for one program that draws every weight.
    return models.init_params(config, jax.random.key(seed, impl="rbg"), dtype), config


def truncate(params: dict, config, layers: int) -> tuple:
    """The first `layers` decoder layers of a loaded model."""
    if not 0 < layers <= config.num_hidden_layers:
        raise ValueError(f"--layers must be in [1, {config.num_hidden_layers}], got {layers}")
    types = None if config.layer_types is None else config.layer_types[:layers]
    short = dataclasses.replace(config, num_hidden_layers=layers, layer_types=types)
    runs = []  # the short config's runs are the first runs of the full one, the last maybe cut
    for run, (_, n) in zip(params["layers"], models.layer_runs(short)):
        full = jax.tree_util.tree_leaves(run)[0].shape[0]
        runs.append(run if n == full else jax.tree_util.tree_map(lambda a, n=n: a[:n], run))
    return {**params, "layers": runs}, short


def count_active_experts(routing: list) -> list:
    """Per MoE layer, the mean over steps of the distinct experts in a step's routing
    (decode_step's int32 [moe_layers, tokens, k])."""
    counts = [[len(np.unique(layer)) for layer in np.asarray(r)] for r in routing]
    return [float(c) for c in np.mean(counts, axis=0)] if counts else []


# ------------------------------------------------------------------------------------ the cache


@functools.partial(jax.jit, static_argnames=("prompt_len",), donate_argnums=0)
def _fill_after_prompt(array, key, prompt_len):
    """array [layers, B, max_len, ...] (a run's stacked cache) with entries prompt_len.. drawn per
    layer and channel (trailing axes) from a normal of the mean and standard deviation of that
    layer's channel over the first prompt_len entries."""
    real = array[:, :, :prompt_len].astype(jnp.float32)
    mean, std = real.mean(axis=(1, 2), keepdims=True), real.std(axis=(1, 2), keepdims=True)
    shape = (*array.shape[:2], array.shape[2] - prompt_len, *array.shape[3:])
    noise = mean + std * jax.random.normal(key, shape, jnp.float32)
    return jax.lax.dynamic_update_slice_in_dim(array, noise.astype(array.dtype), prompt_len, axis=2)


def filled_cache(params, config, batch: int, context: int, prompt_len: int, seed: int = 0) -> tuple:
    """(cache, logits [B, V] of the prompt's last token): a cache of `context` entries, the first
    prompt_len a prefilled prompt of random tokens, the rest random at the prompt's scale (see the
    module docstring). The same seed gives the same cache."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, config.vocab_size, (batch, prompt_len), dtype=np.int32)
    cache = models.init_cache(config, batch, context, params["embed"].dtype)
    logits, cache = models.prefill(params, config, cache, prompt)
    leaves, treedef = jax.tree_util.tree_flatten(cache)
    del cache
    keys = jax.random.split(jax.random.key(seed, impl="rbg"), len(leaves))
    for i, key in enumerate(keys):
        leaves[i] = _fill_after_prompt(leaves[i], key, prompt_len=prompt_len)
    return jax.tree_util.tree_unflatten(treedef, leaves), logits


# ------------------------------------------------------------------------------------ one mode


def run_mode(params, config, mode: str, batch: int, *, context: int, prompt_len: int, check: int,
             tokens: list, positions: list, reference=None, profile_dir=None) -> tuple:
    """One mode at one batch: (row fields, reference, profiled window). `tokens` are the timed and
    profiled steps' inputs, `positions` every step's (device int32 scalars). reference=None makes
    this mode the reference: it decodes greedily and returns its inputs and logits for the others."""
    # Every step returns its routing (the timed steps' is counted), so that one compilation serves them all.
    step = functools.partial(models.decode_step, params, config, **MODES[mode], return_routing=True)
    cache, prompt_logits = filled_cache(params, config, batch, context, prompt_len)
    feed = [greedy_tokens(prompt_logits)] if reference is None else reference["inputs"]
    logits_seen = []
    t0 = time.perf_counter()
    for i in range(check):
        logits, cache, _ = step(cache, feed[i], positions[i])
        if i == 0:
            jax.block_until_ready(logits)
            first_step_s = time.perf_counter() - t0
        logits_seen.append(logits)
        if reference is None and i + 1 < check:
            feed.append(greedy_tokens(logits))
    if reference is None:
        reference = dict(inputs=feed, logits=logits_seen)
    got, want = np.stack([np.asarray(x) for x in logits_seen]), np.stack([np.asarray(x) for x in reference["logits"]])
    mine, theirs = got.argmax(-1), want.argmax(-1)
    # Where the tokens differ: how much the reference preferred its token to this mode's (a near tie when
    # small against the logits' error).
    margins = np.take_along_axis(want, theirs[..., None], -1) - np.take_along_axis(want, mine[..., None], -1)
    row = dict(first_step_s=first_step_s, tokens_agree=float(np.mean(mine == theirs)),
               logits_rel_error=float(np.linalg.norm(got - want) / np.linalg.norm(want)),
               disagree_margin=float(margins.max()) if (mine != theirs).any() else None,
               greedy_tokens=mine[:, 0].tolist())

    steps = len(tokens) - PROFILED_STEPS
    times, routing = [], []
    for s in range(steps):
        t0 = time.perf_counter()
        logits, cache, chosen = step(cache, tokens[s], positions[check + s])
        logits.block_until_ready()
        times.append(time.perf_counter() - t0)
        routing.append(chosen)
    p50, p99 = np.percentile(times, [50, 99])
    loop_s, loop_step, state = time_generate_loop(params, config, mode, cache, greedy_tokens(logits),
                                                  positions[check], steps)
    row.update(p50_ms=1e3 * p50, p99_ms=1e3 * p99, mean_ms=1e3 * float(np.mean(times)), min_ms=1e3 * min(times),
               steps=steps, tokens_per_s=batch / p50, generate_loop_ms=1e3 * loop_s,
               generate_loop_tokens_per_s=batch / loop_s, active_experts_per_layer=count_active_experts(routing))

    window = None
    if profile_dir is not None:
        state = [state]

        def profiled_step(j):
            state[0] = loop_step(state[0])
            return state[0].tokens

        fields, window = timing.profile_steps(profiled_step, profile_dir, steps=PROFILED_STEPS, annotation=ANNOTATION)
        row.update(fields)
    return row, reference, window


def time_generate_loop(params, config, mode: str, cache, first: jax.Array, start, steps: int) -> tuple:
    """(seconds per token, the loop's step, its state) of `steps` steps of models.generate's loop from
    position `start` (the module docstring): one step to compile, then steps - 1 dispatched back to
    back and blocked on once. The state has room for PROFILED_STEPS more."""
    step = functools.partial(_greedy_step, params, config, **MODES[mode], unroll=unrolls(first.shape[0], **MODES[mode]))
    state = jax.block_until_ready(step(_GreedyState.first(cache, first, start, steps + 1 + PROFILED_STEPS)))
    t0 = time.perf_counter()
    for _ in range(steps - 1):
        state = step(state)
    jax.block_until_ready(state)
    return (time.perf_counter() - t0) / (steps - 1), step, state


# ------------------------------------------------------------------------------------ the sweep


def sweep(params, config, *, batches, modes, context, prompt_len, steps, check, hbm_bytes_per_s,
          profile_dir=None, detail_batch=None, seed=0, log=print) -> tuple:
    """Every mode at every batch: (result rows, {mode: timeline intervals} of detail_batch's profiled
    steps). A mode that raises (out of memory, unsupported) gets a row with its error."""
    n_steps = check + steps + PROFILED_STEPS
    start = context - n_steps
    if start < prompt_len:
        raise ValueError(f"the context ({context}) must hold the prompt ({prompt_len}) and {n_steps} decode steps "
                         f"({check} checked, {steps} timed, {PROFILED_STEPS} profiled)")
    dtype = params["embed"].dtype
    positions = [jnp.asarray(start + i, jnp.int32) for i in range(n_steps)]
    results, intervals = [], {}
    for batch in batches:
        rng = np.random.default_rng([seed, batch])
        tokens = [jnp.asarray(rng.integers(0, config.vocab_size, (batch, 1), dtype=np.int32))
                  for _ in range(steps + PROFILED_STEPS)]
        reference = None
        for mode in modes:
            row = dict.fromkeys(RESULT_KEYS) | dict(mode=mode, batch=batch)
            folder = None if profile_dir is None else profile_dir / f"{mode}_B{batch}"
            window = None
            try:
                fields, ref, window = run_mode(params, config, mode, batch, context=context, prompt_len=prompt_len,
                                               check=check, tokens=tokens, positions=positions, reference=reference,
                                               profile_dir=folder)
                reference = reference or ref | dict(mode=mode)
                per_layer = fields["active_experts_per_layer"]
                floor_ms = 1e3 * models.decode_bytes(config, batch, context, per_layer, dtype=dtype) / hbm_bytes_per_s
                row.update(fields, floor_ms=floor_ms, ratio_to_floor=fields["p50_ms"] / floor_ms,
                           active_experts=float(np.mean(per_layer)) if per_layer else 0.0,
                           reference_mode=reference["mode"])
            except Exception as e:  # noqa: BLE001 -- the sweep goes on; the row says why this one failed
                row["error"] = f"{type(e).__name__}: {e}"[:1000]
            results.append(row)
            log(_progress_line(row))
            if window is not None and batch == detail_batch:
                intervals[mode] = trace.timeline_intervals(str(folder), window=window)
    return results, intervals


def _progress_line(r) -> str:
    head = f"  B={r['batch']:<3d} {r['mode']:10s}"
    if r["error"]:
        return f"{head} error: {r['error'][:200]}"
    idle = "" if r["idle_fraction"] is None else f", GPU idle {100 * r['idle_fraction']:.0f}%"
    margin = "" if r["disagree_margin"] is None else f" (logit margin {r['disagree_margin']:.2g})"
    return (f"{head} p50 {r['p50_ms']:8.3f} ms  p99 {r['p99_ms']:8.3f} ms  {r['tokens_per_s']:9.1f} tok/s  "
            f"generate's loop {r['generate_loop_ms']:8.3f} ms  "
            f"{r['ratio_to_floor']:5.1f}x floor{idle}  tokens agree {100 * r['tokens_agree']:.0f}%{margin} "
            f"(first step {r['first_step_s']:.1f} s)")


def markdown(results, modes, batches) -> str:
    """Rows are batches, columns modes; a cell: p50 / p99 ms, tokens/s, p50 over the floor, GPU idle."""
    cell = {(r["mode"], r["batch"]): r for r in results}

    def fmt(r):
        if r is None or r["p50_ms"] is None:
            return "error"
        parts = [f"{r['p50_ms']:.3f} / {r['p99_ms']:.3f}", f"{r['tokens_per_s']:.0f} tok/s", f"{r['ratio_to_floor']:.1f}x",
                 f"generate's loop {r['generate_loop_ms']:.3f} ({r['generate_loop_tokens_per_s']:.0f} tok/s)"]
        if r["idle_fraction"] is not None:
            parts.append(f"{100 * r['idle_fraction']:.0f}% idle")
        if r["tokens_agree"] < 1:
            parts.append(f"tokens agree {100 * r['tokens_agree']:.0f}%")
        return ", ".join(parts)

    floors = {}  # per batch, the first mode's that has one (each mode's is from its own routing)
    for r in results:
        if r["floor_ms"] is not None:
            floors.setdefault(r["batch"], r["floor_ms"])
    lines = ["| B | floor ms | " + " | ".join(modes) + " |", "|---" * (len(modes) + 2) + "|"]
    for b in batches:
        floor = f"{floors[b]:.3f}" if b in floors else "-"
        lines.append(f"| {b} | {floor} | " + " | ".join(fmt(cell.get((m, b))) for m in modes) + " |")
    lines.append("")
    lines.append("Cell: per-token latency p50 / p99 (ms) of steps blocked on one by one, tokens/s (B / p50), p50 over "
                 "the floor, ms per token of models.generate's loop (steps dispatched back to back) and its tokens/s, "
                 "GPU idle of a profiled step; the floor is decode_bytes over the HBM read bandwidth, with the active "
                 "experts per MoE layer counted from the timed steps' routing (the first mode's).")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------- the CLI


def add_arguments(parser) -> None:
    presets.add_argument(parser)
    parser.add_argument("--hf", metavar="PATH", help="a local Hugging Face checkpoint (config.json + safetensors) "
                        "instead of a preset's random weights (--preset is then ignored)")
    parser.add_argument("--layers", type=presets.positive_int, help="decoder layers (default: the model's; fewer make a quicker run)")
    parser.add_argument("--batches", type=presets.positive_int, nargs="+",
                        help="sequences per step (default: 1 2 4 8 16 32 64 on a GPU; 1 4 elsewhere)")
    parser.add_argument("--context", type=presets.positive_int, help="cached tokens the last step attends to, the cache's length "
                        "(default: 4096 on a GPU; 128 elsewhere)")
    parser.add_argument("--prompt", type=presets.positive_int, default=16, help="prefilled prompt tokens at the cache's start (default: 16)")
    parser.add_argument("--steps", type=presets.positive_int, help="timed decode steps per mode and batch (default: 200 on a GPU; 16 elsewhere)")
    parser.add_argument("--check-tokens", type=presets.positive_int, default=4,
                        help="greedy tokens checked against the reference mode before timing (default: 4)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), help="default: all; the first is the reference")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"],
                        help="weights and cache (default: bfloat16 on a GPU, float32 elsewhere)")
    parser.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                        help="a profiled run for the GPU's idle time (default: on a GPU only)")
    parser.add_argument("--plots", action=argparse.BooleanOptionalAction, default=True, help="draw PNG plots (default: on)")
    parser.add_argument("--detail-batch", type=int, default=8,
                        help="batch (nearest of --batches) whose profiled step is drawn per mode (default: 8)")
    parser.add_argument("--hbm-gib", type=float, help="GiB read by the bandwidth probe (default: 2 on a GPU, 1/32 elsewhere)")


def run(args) -> dict:
    gpu = jax.default_backend() == "gpu"
    profile = gpu if args.profile is None else args.profile
    dtype = jnp.dtype(args.dtype or ("bfloat16" if gpu else "float32"))
    batches = args.batches or ([1, 2, 4, 8, 16, 32, 64] if gpu else [1, 4])
    context = args.context or (4096 if gpu else 128)
    steps = args.steps or (200 if gpu else 16)
    modes = args.modes or list(MODES)
    preset = None if args.hf else presets.default_name(args.preset)
    detail = min(batches, key=lambda b: abs(b - args.detail_batch))
    cmdbuf = timing.cmdbuf_during_profiling()
    if profile and gpu and not cmdbuf:
        print(f"note: XLA_FLAGS lacks {timing.CMDBUF_FLAG}: profiled steps run without CUDA graphs")

    t0 = time.perf_counter()
    params, config = load_model(preset, args.hf, args.layers, dtype)
    jax.block_until_ready(params)
    moe_layers = sum(map(config.is_moe_layer, range(config.num_hidden_layers)))
    print(f"generate: {args.hf or preset}, {config.model_type}, {config.num_hidden_layers} layers ({moe_layers} MoE: "
          f"{config.num_experts} experts, top-{config.num_experts_per_tok}), {params['embed'].dtype}, "
          f"weights ready in {time.perf_counter() - t0:.1f} s", flush=True)
    cache_bytes = tree_bytes(jax.eval_shape(lambda: models.init_cache(config, max(batches), context, params["embed"].dtype)))
    size = lambda n: f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"
    print(f"  weights {size(tree_bytes(params))}; cache {size(cache_bytes)} at batch {max(batches)}", flush=True)
    hbm = timing.hbm_bandwidth(args.hbm_gib)
    print(f"  HBM read bandwidth {hbm / 1e12:.2f} TB/s; context {context} (prompt {args.prompt} + random), "
          f"{steps} timed steps, batches {batches}, modes {modes}", flush=True)

    results, intervals = sweep(params, config, batches=batches, modes=modes, context=context, prompt_len=args.prompt,
                               steps=steps, check=args.check_tokens, hbm_bytes_per_s=hbm,
                               profile_dir=args.out / "traces" if profile else None, detail_batch=detail,
                               log=lambda line: print(line, flush=True))

    trace.write_timeline(intervals, args.out / f"generate_timeline_B{detail}", args.plots)
    if args.plots:
        decode.plot_latency(results, modes, args.out / "generate_latency.png", key="p50_ms",
                            xlabel="batch (sequences, one token each per step)", ylabel="per-token latency, p50 (ms)",
                            floor_label="floor (decode_bytes / HBM read bandwidth)",
                            title=f"{args.hf or preset}, {config.num_hidden_layers} layers, context {context}")
    table = markdown(results, modes, batches)
    (args.out / "generate.md").write_text(table)
    print(table)
    return {
        "benchmark": "generate",
        "config": dict(preset=preset, hf=args.hf, model=dataclasses.asdict(config), moe_layers=moe_layers,
                       dtype=jnp.dtype(params["embed"].dtype).name, batches=batches, modes=modes,
                       context=context, prompt=args.prompt, steps=steps,
                       check_tokens=args.check_tokens, profile=profile, profiled_steps=PROFILED_STEPS,
                       detail_batch=detail, first_decode_position=context - args.check_tokens - steps - PROFILED_STEPS,
                       active_experts_source=ACTIVE_EXPERTS_SOURCE),
        "hbm_bytes_per_s": hbm,
        "cmdbuf_during_profiling": cmdbuf,
        "results": results,
    }
