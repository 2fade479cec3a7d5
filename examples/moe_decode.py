"""A small MoE decoder loop on te_async's public API, on whatever backend JAX has.

Each decode step runs L MoE layers (router, sort by expert, grouped_mlp with the router weights
on its rows, each token's rows summed, residual) under one jit, scanning over the stacked layer
weights. It is run once per group-sizes mode, the outputs are checked against a dense float32
reference written in plain jnp, and the step time is printed. CPU: a tiny model. GPU:
DeepSeek-V2-Lite's expert shapes (te_async.bench.presets).

    python examples/moe_decode.py [--preset NAME] [--tokens 8] [--steps 20] [--layers N]
"""

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

import te_async
from te_async.bench import presets
from te_async.moe import moe_block, route_top_k


def init_params(key, layers, experts, hidden, ffn, dtype):
    k1, k2, k3 = jax.random.split(key, 3)
    return dict(
        router=jax.random.normal(k1, (layers, hidden, experts), dtype) / math.sqrt(hidden),
        w_fc1=jax.random.normal(k2, (layers, experts, hidden, 2 * ffn), dtype) / math.sqrt(hidden),
        w_fc2=jax.random.normal(k3, (layers, experts, ffn, hidden), dtype) / math.sqrt(ffn),
        norm_scale=jnp.ones((layers, hidden), jnp.float32),
    )


def decode_step(params, x, *, top_k, mode):
    def layer(h, p):
        y = moe_block(h, p["router"], p["w_fc1"], p["w_fc2"], top_k=top_k, norm_scale=p["norm_scale"], group_sizes_mode=mode)
        return h + y, None

    return jax.lax.scan(layer, x, params)[0]


def dense_reference_step(params, x, *, top_k):
    """Every expert on every token, masked by the router: no sorting, no grouped GEMM."""

    def layer(h, p):
        hf = h.astype(jnp.float32)
        top_w, top_e = route_top_k(h, p["router"], top_k)  # the same routing: it is not under test
        gate = jnp.zeros((h.shape[0], p["router"].shape[1])).at[jnp.arange(h.shape[0])[:, None], top_e].set(top_w)
        xn = hf * jax.lax.rsqrt(jnp.mean(hf * hf, -1, keepdims=True) + 1e-6) * p["norm_scale"]
        xn = xn.astype(h.dtype).astype(jnp.float32)
        u = jnp.einsum("th,ehf->etf", xn, p["w_fc1"].astype(jnp.float32))
        g, lin = jnp.split(u, 2, axis=-1)
        y = jnp.einsum("etf,efh->eth", jax.nn.silu(g) * lin, p["w_fc2"].astype(jnp.float32))
        return h + jnp.einsum("eth,te->th", y, gate).astype(h.dtype), None

    return jax.lax.scan(layer, x, params)[0]


def main():
    backend = jax.default_backend()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    presets.add_argument(parser)
    parser.add_argument("--tokens", type=int, default=8, help="tokens per decode step (default: 8)")
    parser.add_argument("--steps", type=int, default=20, help="decode steps per mode (default: 20)")
    parser.add_argument("--layers", type=int, help="MoE layers per step (default: the preset's)")
    args = parser.parse_args()
    experts, hidden, ffn, top_k, layers = presets.resolve(args.preset)[1]
    args.layers = args.layers or layers
    dtype = jnp.bfloat16 if backend == "gpu" else jnp.float32
    params = init_params(jax.random.key(0), args.layers, experts, hidden, ffn, dtype)
    x0 = jax.random.normal(jax.random.key(1), (args.tokens, hidden), dtype)
    print(f"backend {backend}, jax {jax.__version__}, CUDA handlers built: {te_async.cuda_extension_built()}")
    print(f"{args.layers} MoE layers: {experts} experts, hidden {hidden}, ffn {ffn}, top-{top_k}, {args.tokens} tokens/step, {dtype.__name__}")

    # Checked on the first layer alone: across layers, bf16 rounding can flip a near-tie in the
    # router, after which two correct implementations route differently.
    first_layer = jax.tree_util.tree_map(lambda a: a[:1], params)
    reference = jax.jit(lambda p, x: dense_reference_step(p, x, top_k=top_k))(first_layer, x0)
    for mode in te_async.GROUP_SIZES_MODES:
        step = jax.jit(lambda p, x, mode=mode: decode_step(p, x, top_k=top_k, mode=mode))
        first = step(first_layer, x0)
        x, times = x0, []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            x = step(params, x).block_until_ready()
            times.append(time.perf_counter() - t0)
            x = x / jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32)), -1, keepdims=True)).astype(dtype)
        err = float(jnp.linalg.norm((first - reference).astype(jnp.float32)) / jnp.linalg.norm(reference.astype(jnp.float32)))
        print(f"  mode {mode:5s}: step median {1e3 * np.median(times):8.3f} ms, rel. error vs dense reference {err:.2e}")
        assert err < (3e-2 if dtype == jnp.bfloat16 else 1e-5), f"{mode} disagrees with the dense reference"
    if backend == "gpu":
        print(f"  group-sizes counters on GPU 0: {te_async.host_size_stats(0)}")
    print("ok")


if __name__ == "__main__":
    main()
