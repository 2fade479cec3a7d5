"""MoE decoder-only transformers (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2, DeepSeek-V3) as pure JAX functions
over a params pytree, with the routed experts through te_async.grouped_mlp.

    params, config = load_hf(path)                       # a local Hugging Face checkpoint
    logits = forward(params, config, tokens)             # [B, S] -> [B, S, V] float32
    loss = next_token_loss(params, config, tokens, mask) # a training step's loss (jax.grad it)
    tokens = generate(params, config, prompt, 32)        # greedy, KV cache
    cache = init_cache(config, batch, max_len, dtype)    # the pieces generate is made of
    logits, cache = prefill(params, config, cache, prompt)
    logits, cache = decode_step(params, config, cache, token, position)
    config = preset("deepseek-v2-lite", num_hidden_layers=2); params = init_params(config, key)
    decode_bytes(config, batch, context_len, active_experts)   # for a bandwidth floor
    train_flops(config, batch, seq)                            # model FLOPs of a training step

params["layers"] and the cache hold one entry per run of consecutive layers of one structure
(layer_runs), stacked on a leading layer axis: the decoder scans each run. per_layer(params["layers"])
lists the layers one by one; stack_layers stacks them back.

Files: config.py (Config from config.json), presets.py, params.py (pytree layout, init), hf.py
(loading), embedding.py (the lookup; a deterministic gradient), norm.py, rope.py, attention.py
(grouped-query), mla.py (DeepSeek latent attention), cache.py, ffn.py (dense SwiGLU), routing.py,
moe_layer.py (MoE block), model.py (forward, next_token_loss, prefill, decode_step, generate),
loss.py (cross_entropy), cost.py (decode_bytes, train_flops).
"""

from .cache import init_cache
from .config import MODEL_TYPES, Config, YarnScaling, from_hf_dict
from .cost import decode_bytes, train_flops
from .hf import load_hf
from .loss import cross_entropy
from .model import decode_step, forward, generate, next_token_loss, prefill
from .moe_layer import EXPERTS
from .params import init_params, input_projections, layer_runs, param_shapes, per_layer, stack_layers
from .presets import PUBLISHED, preset

__all__ = [
    "EXPERTS",
    "MODEL_TYPES",
    "PUBLISHED",
    "Config",
    "YarnScaling",
    "cross_entropy",
    "decode_bytes",
    "decode_step",
    "forward",
    "from_hf_dict",
    "generate",
    "init_cache",
    "init_params",
    "input_projections",
    "layer_runs",
    "load_hf",
    "next_token_loss",
    "param_shapes",
    "per_layer",
    "prefill",
    "preset",
    "stack_layers",
    "train_flops",
]
