"""What a whole model's training step compiles to, read on any machine (no GPU needed): bench
train-model's step for a preset's first layers, lowered for CUDA, counted three ways: its GEMMs
by operand dtype (float32 ones run without tensor cores at precision HIGHEST, as TF32 at DEFAULT),
its scatters that add float rows (atomic adds on a GPU, in no fixed order) and the bytes of the
buffers te_async.scan stacks (its AllocateBuffer calls: the residuals kept for the backward, apart
from the stacked weight gradients). docs/internals.md, "Training", quotes it.

    python3 -P tools/train_lowering.py [--preset deepseek-v2-lite] [--layers 4] [--seq 4096] [--contender device]
"""

import argparse
import collections
import json
import math
import re

import jax
import jax.numpy as jnp

from te_async import models
from te_async.bench import lowered, presets, timing, train_model

DOT = re.compile(r"stablehlo\.dot_general .*: \(tensor<[0-9x]+x(\w+)>, tensor<[0-9x]+x(\w+)>\)")
ITEM_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i1": 1}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="deepseek-v2-lite", choices=list(presets.PRESETS))
    p.add_argument("--layers", type=presets.positive_int, default=4)
    p.add_argument("--seq", type=presets.positive_int, default=4096)
    p.add_argument("--contender", default="device", choices=train_model.CONTENDERS)
    args = p.parse_args()

    config = presets.config(args.preset, num_hidden_layers=args.layers)
    params = jax.eval_shape(lambda k: models.init_params(config, k, jnp.bfloat16), jax.random.key(0))
    tokens = jax.ShapeDtypeStruct((1, args.seq + 1), jnp.int32)
    text = lowered.cuda_stablehlo(train_model.train_step(config, args.contender), params, tokens)

    weight_shapes = {tuple(a.shape) for run in params["layers"] for a in jax.tree.leaves(run)}
    stacked = collections.Counter()
    for buffer in lowered.allocated_buffers(text):
        *dims, dtype = buffer.split("x")
        shape = tuple(map(int, dims))
        stacked["weight gradients" if shape in weight_shapes else "residuals"] += ITEM_BYTES[dtype] * math.prod(shape)
    result = {
        "preset": args.preset, "layers": args.layers, "seq": args.seq, "contender": args.contender,
        "gemm_operand_dtypes": {f"{a} x {b}": n for (a, b), n in collections.Counter(DOT.findall(text)).items()},
        "row_scatter_adds": lowered.row_scatter_adds(text, config.hidden_size),
        "stacked_gb": {k: round(v / 1e9, 2) for k, v in stacked.items()},
        "source": timing.source_commit(), "jax": jax.__version__,
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
