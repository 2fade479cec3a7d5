"""The preallocated KV cache: per layer, grouped-query attention keeps k and v
[B, max_len, kv_heads, head_dim]; DeepSeek's MLA keeps its normalised latent "ckv"
[B, max_len, kv_lora_rank] and rotated rope key "kpe" [B, max_len, qk_rope_head_dim] (mla.py says
why). As the params do (params.py), the cache holds one dict per run of layers (layer_runs), each
array stacked on a leading layer axis: [layers, B, max_len, ...]. Entries past the current
position are masked out, so the zeros never matter."""

import jax
import jax.numpy as jnp

from .params import layer_runs


def cache_shapes(config, batch: int, max_len: int) -> list:
    """Per run of layers, a dict of the cache arrays' shapes [layers, batch, max_len, ...]."""
    c = config
    if c.is_mla:
        layer = {"ckv": (batch, max_len, c.kv_lora_rank), "kpe": (batch, max_len, c.qk_rope_head_dim)}
    else:
        kv = (batch, max_len, c.num_key_value_heads, c.head_dim)
        layer = {"k": kv, "v": kv}
    return [{k: (n, *s) for k, s in layer.items()} for _, n in layer_runs(c)]


def init_cache(config, batch: int, max_len: int, dtype=jnp.bfloat16) -> list:
    """An empty cache for `batch` sequences of up to `max_len` tokens (prompt and generated)."""
    for name, value in (("batch", batch), ("max_len", max_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s, dtype), cache_shapes(config, batch, max_len),
                                  is_leaf=lambda x: isinstance(x, tuple))


def cache_length(cache: list) -> int:
    """max_len of a cache made by init_cache."""
    return jax.tree_util.tree_leaves(cache)[0].shape[2]


def cache_batch(cache: list) -> int:
    """The batch of a cache made by init_cache."""
    return jax.tree_util.tree_leaves(cache)[0].shape[1]
