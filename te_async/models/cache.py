"""The preallocated KV cache: per layer, grouped-query attention keeps k and v
[B, max_len, kv_heads, head_dim]; DeepSeek's MLA keeps its normalised latent "ckv"
[B, max_len, kv_lora_rank] and rotated rope key "kpe" [B, max_len, qk_rope_head_dim] (mla.py says
why). Entries past the current position are masked out, so the zeros never matter."""

import jax
import jax.numpy as jnp


def cache_shapes(config, batch: int, max_len: int) -> list:
    """Per layer, a dict of the cache arrays' shapes."""
    c = config
    if c.is_mla:
        layer = {"ckv": (batch, max_len, c.kv_lora_rank), "kpe": (batch, max_len, c.qk_rope_head_dim)}
    else:
        kv = (batch, max_len, c.num_key_value_heads, c.head_dim)
        layer = {"k": kv, "v": kv}
    return [dict(layer) for _ in range(c.num_hidden_layers)]


def init_cache(config, batch: int, max_len: int, dtype=jnp.bfloat16) -> list:
    """An empty cache for `batch` sequences of up to `max_len` tokens (prompt and generated)."""
    for name, value in (("batch", batch), ("max_len", max_len)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s, dtype), cache_shapes(config, batch, max_len),
                                  is_leaf=lambda x: isinstance(x, tuple))


def cache_length(cache: list) -> int:
    """max_len of a cache made by init_cache."""
    return jax.tree_util.tree_leaves(cache)[0].shape[1]
