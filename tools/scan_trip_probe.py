"""What one trip of a lax.scan over stacked layers costs, apart from its work (wall clock).

A decode step scans its layers; each trip of XLA's while loop replays the body's CUDA graph from
the host. This probe times a scan of L trips whose body is one tiny GEMM (so the trip's fixed
cost dominates), XLA's or te_async's (dense.linear), with the layer's weight reached as the scan's
xs (a slice per trip: XLA fuses it into te_async's call as a DynamicSliceFusion), closed over and
indexed by the trip counter (XLA copies the slice first), one fixed weight for every trip, and, for
te_async, the whole stack read by a grouped GEMM whose only group with rows is the layer's. Run it
under different XLA_FLAGS to see what the loop costs. Measured on an H200 (2026-12-02,
docs/investigations.md, "Stacked weights read in place"): about 10 us a trip for XLA's GEMM and for the stack,
21-31 us for te_async's call on a sliced weight.

    python3 -P tools/scan_trip_probe.py [--layers 26] [--tag NAME] [--out DIR]
"""
import argparse
import json
import os
import pathlib

import jax
import jax.numpy as jnp

from te_async import dense
from te_async.gemm import grouped_gemm
from te_async.bench import timing


def variants(x, ws, kernel):
    layers = ws.shape[0]
    lin = lambda w: dense.linear(x, w, kernel=kernel)
    return {
        "xs": jax.jit(lambda ws: jax.lax.scan(lambda c, w: (c, lin(w)), 0, ws)[1]),
        "index": jax.jit(lambda ws: jax.lax.scan(lambda c, i: (c, lin(ws[i])), 0, jnp.arange(layers))[1]),
        "fixed": jax.jit(lambda ws: jax.lax.scan(lambda c, i: (c, lin(ws[0])), 0, jnp.arange(layers))[1]),
    } | ({} if kernel == "xla" else {"stack": jax.jit(lambda ws: jax.lax.scan(
        lambda c, i: (c, grouped_gemm(x, ws, (jnp.arange(layers) == i).astype(jnp.int32), group_sizes_mode="device")),
        0, jnp.arange(layers))[1])})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=26)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--tag", default="default")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("."))
    args = ap.parse_args()
    key = jax.random.key(0)
    ws = jax.random.normal(key, (args.layers, args.k, args.n), jnp.bfloat16)
    x = jax.random.normal(key, (1, args.k), jnp.bfloat16)
    rows = []
    for kernel in ("xla", "te_async"):
        for name, fn in variants(x, ws, kernel).items():
            t = timing.time_calls(fn, [(ws,)], reps=30).median_s
            rows.append(dict(kernel=kernel, weights=name, us_per_trip=1e6 * t / args.layers))
            print(f"{args.tag:12s} {kernel:9s} {name:6s} {1e6 * t / args.layers:8.2f} us per trip", flush=True)
            if name == "xs":
                (args.out / f"scan_{args.tag}_{kernel}.hlo.txt").write_text(fn.lower(ws).compile().as_text())
    (args.out / f"scan_trip_{args.tag}.json").write_text(json.dumps(dict(
        xla_flags=os.environ.get("XLA_FLAGS", ""), layers=args.layers, rows=rows,
        environment=timing.environment()), indent=1))


if __name__ == "__main__":
    main()
