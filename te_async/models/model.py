"""The decoder and its entry points: forward (whole sequence, no cache), prefill (fills a KV
cache), decode_step (one jitted step against the cache) and greedy generate.

Layers run unrolled (they differ: DeepSeek's first layer is dense). Token ids are checked on the
host where the values are at hand (forward, prefill, generate); inside jit, where they are not, an
id out of range and a decode position past the cache give NaN logits instead of a silent answer.
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from .attention import gqa_attention
from .cache import cache_length, cache_shapes, init_cache
from .config import Config
from .ffn import swiglu_mlp
from .mla import mla_attention
from .moe_layer import check_experts, moe_block
from .norm import rms_norm
from .params import check_params
from .rope import cos_sin

_STATIC = ("config", "group_sizes_mode", "experts")


def _embed(embed: jax.Array, tokens: jax.Array) -> jax.Array:
    valid = (tokens >= 0) & (tokens < embed.shape[0])
    x = jnp.take(embed, jnp.where(valid, tokens, 0), axis=0)
    return jnp.where(valid[..., None], x, jnp.nan)


def _decoder(params, cfg: Config, tokens, cache, position, group_sizes_mode, experts) -> tuple:
    """Final-normed hidden states [B, S, H] and the updated cache (None without one)."""
    check_experts(experts, group_sizes_mode)
    check_params(params, cfg)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be integer [batch, seq], got {tokens.dtype} {tuple(tokens.shape)}")
    x = _embed(params["embed"], tokens.astype(jnp.int32))
    positions = (0 if position is None else position) + jnp.arange(tokens.shape[1], dtype=jnp.int32)
    cos, sin = cos_sin(positions, cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling)
    attention = mla_attention if cfg.is_mla else gqa_attention
    eps = cfg.rms_norm_eps
    new_cache = []
    for i, layer in enumerate(params["layers"]):
        with jax.named_scope(f"layer{i}"):
            a, c = attention(layer["attn"], cfg, rms_norm(x, layer["attn_norm"], eps), cos, sin,
                             None if cache is None else cache[i], position, cfg.window(i))
            x = x + a
            h = rms_norm(x, layer["mlp_norm"], eps)
            if "moe" in layer:
                x = x + moe_block(layer["moe"], cfg, h, group_sizes_mode=group_sizes_mode, experts=experts)
            else:
                x = x + swiglu_mlp(layer["mlp"], h)
            new_cache.append(c)
    return rms_norm(x, params["final_norm"], eps), None if cache is None else new_cache


def _logits(params, x: jax.Array) -> jax.Array:
    """float32 logits; the LM head is the embedding where the config ties them."""
    head = params.get("lm_head", params["embed"])
    return jnp.einsum("...h,vh->...v", x, head, preferred_element_type=jnp.float32)


@functools.partial(jax.jit, static_argnames=_STATIC)
def _forward(params, config, tokens, group_sizes_mode, experts):
    x, _ = _decoder(params, config, tokens, None, None, group_sizes_mode, experts)
    return _logits(params, x)


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames=("cache",))
def _prefill(params, config, cache, tokens, group_sizes_mode, experts):
    x, cache = _decoder(params, config, tokens, cache, None, group_sizes_mode, experts)
    return _logits(params, x[:, -1]), cache


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames=("cache",))
def decode_step(params, config: Config, cache: list, tokens: jax.Array, position, *,
                group_sizes_mode: Optional[str] = None, experts: str = "te_async") -> tuple:
    """(logits [B, V] float32 of the last token, cache) for tokens [B, T] (T = 1 in a decode step)
    at positions position .. position + T - 1, attending to the cache before them.

    Jitted on its own (config, group_sizes_mode and experts static; position traced, so one
    compilation serves every step). The cache is donated: keep the returned one. The step
    attends over all max_len cache entries, masked; a position past the cache gives NaN logits.
    """
    if tokens.ndim != 2 or tokens.shape[0] != jax.tree_util.tree_leaves(cache)[0].shape[0]:
        raise ValueError(f"tokens must be [batch, T] with the cache's batch, got {tuple(tokens.shape)}")
    position = jnp.asarray(position, jnp.int32)
    x, cache = _decoder(params, config, tokens, cache, position, group_sizes_mode, experts)
    fits = (position >= 0) & (position + tokens.shape[1] <= cache_length(cache))
    return jnp.where(fits, _logits(params, x[:, -1]), jnp.nan), cache


def _check_tokens(tokens, config) -> jax.Array:
    """int32 [B, S] tokens; raises ValueError naming the first id outside the vocabulary."""
    if not isinstance(config, Config):
        raise TypeError(f"config must be a te_async.models.Config, got {type(config).__name__}")
    if isinstance(tokens, jax.core.Tracer):
        return tokens
    host = np.asarray(tokens)
    if host.ndim != 2 or host.shape[0] == 0 or host.shape[1] == 0 or not np.issubdtype(host.dtype, np.integer):
        raise ValueError(f"tokens must be a non-empty integer [batch, seq] array, got {host.dtype} {host.shape}")
    bad = np.argwhere((host < 0) | (host >= config.vocab_size))
    if bad.size:
        b, s = bad[0]
        raise ValueError(f"token id {host[b, s]} at [{b}, {s}] is outside the vocabulary [0, {config.vocab_size})")
    return jnp.asarray(host, jnp.int32)


def forward(params, config: Config, tokens, *, group_sizes_mode: Optional[str] = None,
            experts: str = "te_async") -> jax.Array:
    """Logits [B, S, V] float32 of a causal pass over tokens [B, S] from position 0, no cache."""
    return _forward(params, config, _check_tokens(tokens, config), group_sizes_mode, experts)


def prefill(params, config: Config, cache: list, tokens, *, group_sizes_mode: Optional[str] = None,
            experts: str = "te_async") -> tuple:
    """(logits [B, V] float32 of the last prompt token, cache) after writing the prompt tokens
    [B, S] into an empty cache from init_cache at positions 0 .. S-1. The cache is donated."""
    tokens = _check_tokens(tokens, config)
    leaves = jax.tree_util.tree_leaves(cache)
    want = jax.tree_util.tree_leaves(cache_shapes(config, tokens.shape[0], cache_length(cache)),
                                     is_leaf=lambda x: isinstance(x, tuple))
    if [tuple(a.shape) for a in leaves] != want:
        raise ValueError(f"the cache does not fit this config and a batch of {tokens.shape[0]}: "
                         "make it with init_cache")
    if tokens.shape[1] > cache_length(cache):
        raise ValueError(f"the prompt has {tokens.shape[1]} tokens, longer than the cache ({cache_length(cache)})")
    return _prefill(params, config, cache, tokens, group_sizes_mode, experts)


def generate(params, config: Config, prompt, max_new_tokens: int, *, group_sizes_mode: Optional[str] = None,
             experts: str = "te_async", max_len: Optional[int] = None) -> jax.Array:
    """Greedy decoding: tokens [B, S + max_new_tokens], the prompt [B, S] then the argmax tokens.

    One jitted prefill fills a cache of max_len tokens (default S + max_new_tokens, in the
    embedding's dtype), then one decode_step per further token.
    """
    prompt = _check_tokens(prompt, config)
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    batch, length = prompt.shape
    if max_new_tokens == 0:
        return prompt
    max_len = length + max_new_tokens if max_len is None else max_len
    if length + max_new_tokens > max_len:
        raise ValueError(f"the prompt ({length} tokens) and max_new_tokens ({max_new_tokens}) exceed max_len {max_len}")
    cache = init_cache(config, batch, max_len, params["embed"].dtype)
    modes = dict(group_sizes_mode=group_sizes_mode, experts=experts)
    logits, cache = prefill(params, config, cache, prompt, **modes)
    out = [prompt, jnp.argmax(logits, axis=-1).astype(jnp.int32)[:, None]]
    for i in range(max_new_tokens - 1):
        logits, cache = decode_step(params, config, cache, out[-1], length + i, **modes)
        out.append(jnp.argmax(logits, axis=-1).astype(jnp.int32)[:, None])
    return jnp.concatenate(out, axis=1)
