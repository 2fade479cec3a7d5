"""Does XLA run a device-mode MoE step inside CUDA graphs (command buffers)? GPU only.

Profiles a jitted 4-layer step (norm, router-free grouped_mlp, residual) in each group_sizes
mode and prints, per mode and per kernel name, how many launches CUPTI tagged with a CUDA graph
id, plus the host's graph launches and kernel launches. A te_async kernel with every launch
graph-tagged ran inside a command buffer; sync and async split the step where they wait on the
host, device mode should not. XLA forms command buffers on the thunk sequence
(--xla_gpu_experimental_enable_command_buffer_on_thunks), so the compiled HLO shows none.

    python3 -P tools/cmdbuf_probe.py [--out DIR]     (XLA_FLAGS as the run should have them)
"""

import argparse
import collections
import json
import pathlib
import tempfile

import jax
import jax.numpy as jnp

import te_async
from te_async.bench import presets, timing, trace

LAYERS, TOKENS = 4, 4  # a short decode step


def step_fn(mode):
    def step(x, w1, w2, gs):
        for layer in range(LAYERS):
            h = x * jax.lax.rsqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True)).astype(x.dtype)
            x = x + te_async.grouped_mlp(h, gs, w1[layer], w2[layer], group_sizes_mode=mode)
        return x
    return jax.jit(step)


def graph_report(log_dir) -> dict:
    events = trace.load_events(log_dir)
    dev = [d for d in trace.device_events(events) if d["kind"] == "kernel"]
    hosts = [e.get("name", "") for e in trace.host_events(events)]
    per_kernel = collections.defaultdict(lambda: [0, 0])
    for d in dev:
        tagged = any("graph_id" in k and v not in (None, 0, "0") for k, v in d["args"].items())
        name = d["name"][:80]
        per_kernel[name][0] += 1
        per_kernel[name][1] += tagged
    return dict(
        kernels=len(dev),
        graph_tagged_kernels=sum(t for _, t in per_kernel.values()),
        host_graph_launches=sum(n.startswith(("cuGraphLaunch", "cudaGraphLaunch")) for n in hosts),
        host_kernel_launches=sum(n.startswith(("cuLaunchKernel", "cudaLaunchKernel")) for n in hosts),
        te_async_kernels={k: dict(launches=n, graph_tagged=t) for k, (n, t) in per_kernel.items()
                          if "te_async" in k or "Gemm" in k or "gemm" in k},
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path(tempfile.mkdtemp()))
    presets.add_argument(p)
    args = p.parse_args()
    m = presets.resolve(args.preset)[1]
    rows = TOKENS * m.top_k
    key = jax.random.key(0)
    x = jax.random.normal(key, (rows, m.hidden), jnp.bfloat16)
    w1 = jax.random.normal(key, (LAYERS, m.experts, m.hidden, 2 * m.ffn), jnp.bfloat16) * 0.02
    w2 = jax.random.normal(key, (LAYERS, m.experts, m.ffn, m.hidden), jnp.bfloat16) * 0.02
    gs = jnp.zeros(m.experts, jnp.int32).at[: rows // 2].set(2)  # 2 rows for each of rows / 2 experts
    report = {"environment": timing.environment()}
    for mode in te_async.GROUP_SIZES_MODES:
        f = step_fn(mode)
        for _ in range(3):  # compile, then let XLA record its command buffers
            jax.block_until_ready(f(x, w1, w2, gs))
        log_dir = args.out / f"cmdbuf_{mode}"
        with jax.profiler.trace(str(log_dir)):
            for _ in range(2):
                jax.block_until_ready(f(x, w1, w2, gs))
        report[mode] = graph_report(log_dir)
    text = json.dumps(report, indent=1)
    print(text)
    (args.out / "cmdbuf_probe.json").write_text(text)


if __name__ == "__main__":
    main()
