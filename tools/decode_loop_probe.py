"""Per-token time of greedy decode loops over one model (wall clock, p50 over --steps): the loop a
user writes around te_async.models.decode_step (new token, position and logits buffers in every
step), and generate's loop (models.model._greedy_step: the tokens kept in donated device state, so
every buffer keeps its address and XLA replays the step's CUDA graphs without updating them) with
the layers scanned (`generate`) and written out (`generate_unrolled`). Writes decode_loop.json
(with the run's environment) to --out.

    python3 -P tools/decode_loop_probe.py [--preset deepseek-v2-lite] [--layers N] [--batches 1 8] [--loops ...] [--out DIR]
"""
import argparse
import functools
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from te_async import models
from te_async.bench import generate, timing
from te_async.models.model import greedy_tokens, _greedy_step, _GreedyState

WARMUP = 5
LOOPS = ("decode_step", "generate", "generate_unrolled")


def time_loop(step, state, steps: int) -> list:
    """Milliseconds of each of `steps` calls of state = step(state), after WARMUP untimed ones."""
    times = []
    for _ in range(WARMUP + steps):
        t0 = time.perf_counter()
        state = step(state)
        jax.block_until_ready(state)
        times.append(1e3 * (time.perf_counter() - t0))
    return times[WARMUP:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="deepseek-v2-lite")
    ap.add_argument("--layers", type=int, help="the first N decoder layers only (all by default)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--mode", default="device")
    ap.add_argument("--loops", nargs="+", choices=LOOPS, default=list(LOOPS))
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("."))
    args = ap.parse_args()
    params, config = generate.load_model(args.preset, layers=args.layers, dtype=jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32)
    start = args.context - args.steps - WARMUP - 1
    rows = []
    for batch in args.batches:
        row = dict(batch=batch)
        for loop in args.loops:
            cache, logits = generate.filled_cache(params, config, batch, args.context, 16)
            if loop == "decode_step":
                def step(s):
                    cache, token, position = s
                    logits, cache = models.decode_step(params, config, cache, token, position, group_sizes_mode=args.mode)
                    return cache, greedy_tokens(logits), position + 1
                state = (cache, greedy_tokens(logits), start)
            else:
                step = functools.partial(_greedy_step, params, config, group_sizes_mode=args.mode, experts="te_async",
                                         unroll=loop == "generate_unrolled")
                state = _GreedyState.first(cache, greedy_tokens(logits), start, WARMUP + args.steps + 1)
            del cache
            t = time_loop(step, state, args.steps)
            row[f"{loop}_p50_ms"], row[f"{loop}_min_ms"] = float(np.median(t)), float(min(t))
        if "generate" in args.loops:  # each loop's speed-up over the scanned generate loop
            for loop in args.loops:
                row[f"{loop}_speedup"] = row["generate_p50_ms"] / row[f"{loop}_p50_ms"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = dict(benchmark="decode_loop_probe", preset=args.preset, layers=args.layers, mode=args.mode, context=args.context,
                  steps=args.steps, environment=timing.environment(), results=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "decode_loop.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
