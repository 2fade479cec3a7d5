"""Why bench decode's step with its layers written out is shorter on the GPU but not by the wall
clock at T = 4-16 (stop 61, docs/results/2026-12-06-h100-graph-flags/README.md, section 4).

Hypothesis: bench decode's harness rotates four inputs and allocates each step's output, so XLA
updates the written-out step's one graph (re-capturing the 26 te_async calls) before every launch
and the GPU waits for the host; generate's loop donates its state and replays the graph as it is.
Per T and layer order (written out, scanned), device mode, DeepSeek-V2-Lite's 26 MoE layers:
  harness   ms per step as bench decode times it (timing.time_calls over 4 rotated inputs)
  donated   ms per step of a loop that feeds each step's output back as the next input, donated
  dispatch  ms per step the host takes to enqueue `steps` donated steps (the GPU still running)
Usage: python3 -P unroll_probe.py [T ...]
"""

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from te_async.bench import decode, presets, timing


def donated_loop(step, params, x, steps):
    """(ms per step from the first dispatch to the last result, ms per step of the dispatches alone)."""
    run = jax.jit(step, donate_argnums=1)
    for _ in range(3):
        x = run(params, x)
    jax.block_until_ready(x)
    t0 = time.perf_counter()
    for _ in range(steps):
        x = run(params, x)
    t1 = time.perf_counter()
    jax.block_until_ready(x)
    t2 = time.perf_counter()
    return 1e3 * (t2 - t0) / steps, 1e3 * (t1 - t0) / steps


def main(batches):
    _, model = presets.resolve(None)
    params = decode.init_params(model, jnp.bfloat16, jax.random.key(0))
    print(f"{jax.devices()[0].device_kind}, {model.layers} layers; ms per step", flush=True)
    print("| T | layers | harness | donated | dispatch |\n|---|---|---|---|---|")
    for b in batches:
        xs = [jax.random.normal(jax.random.key(1 + i), (b, model.hidden), jnp.bfloat16) for i in range(decode.N_INPUTS)]
        for written_out in (True, False, True, False):
            step = decode.make_step(decode.MODES["device"], model, written_out=written_out)
            harness = timing.time_calls(step, [(params, x) for x in xs], reps=10, inner=decode.INNER).median_s
            donated, dispatch = donated_loop(step, params, jnp.array(xs[0]), steps=50)
            name = "written out" if written_out else "scanned"
            print(f"| {b} | {name} | {1e3 * harness:.3f} | {donated:.3f} | {dispatch:.3f} |", flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1, 8])
