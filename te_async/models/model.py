"""The decoder and its entry points: forward (whole sequence, no cache), next_token_loss (what a
training step differentiates), prefill (fills a KV cache), decode_step (one jitted step against
the cache) and greedy generate.

Layers run by runs (params.layer_runs): a run of one layer runs inline, under the named scope
`layer{i}`; a longer run of consecutive layers of one structure is one scan over its stacked
params and cache, under the named scope `layers{first}-{last}`, so that the compiled program holds
one body per run whatever the depth (DeepSeek-V2-Lite: `layer0`, dense, then `layers1-26`). With a
cache (prefill, decode) that is jax.lax.scan; without one (forward, the pass a training step
differentiates) te_async.scan, whose gradient does not zero-fill the stacked weight gradients.
Inside a scan body each layer writes only its new cache entries into the run's stacked cache (a
carry, updated in place) and reads its layer of it. generate's decode steps write the runs out
layer by layer at the batches where that measured faster (unrolls). Token ids are
checked on the host where the values are at hand (forward, prefill, generate); inside jit, where
they are not, an id out of range and a decode position past the cache give NaN logits instead of
a silent answer.
"""

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .. import dense
from ..scan_vjp import scan as te_async_scan
from .attention import LayerOf, gqa_sublayer
from .cache import cache_batch, cache_length, cache_shapes, init_cache
from .config import Config
from .embedding import embed
from .ffn import swiglu_mlp
from .loss import cross_entropy
from .mla import mla_sublayer
from .moe_layer import check_experts, moe_sublayer
from .norm import rms_norm
from .params import check_params, layer_runs
from .rope import cos_sin

_STATIC = ("config", "group_sizes_mode", "experts")
# The largest batch at which generate writes its decode steps' layers out (device mode). DeepSeek-V2-Lite,
# 4096 cached tokens, generate's loop, written out against scanned (docs/internals.md, tables G4 and
# G4b): on an H200 without CUTLASS (2026-12-02) B=4 1.09x, 8 1.15x, 32 1.06x faster, B=1 and 2 0.93x
# and 0.99x (B=1 1.02x since the MLA and MoE calls, table UN); on an H100 with CUTLASS (2026-12-06)
# B=2 1.00x, 32 1.10x, 64 1.10x. Larger batches were not measured.
UNROLL_MAX_BATCH = 64


def scope_name(start: int, n: int) -> str:
    """The named scope of a run of n layers from layer `start` (op_name metadata carries it)."""
    return f"layer{start}" if n == 1 else f"layers{start}-{start + n - 1}"


def _layer(p, cfg: Config, x, cos, sin, cache, position, window, group_sizes_mode, experts) -> tuple:
    """One decoder layer: (x, its cache entries, the experts its tokens chose [B*S, k] or None)."""
    eps = cfg.rms_norm_eps
    if cfg.is_mla:
        x, cache = mla_sublayer(p["attn"], cfg, x, p["attn_norm"], eps, cos, sin, cache, position, window)
    else:
        x, cache = gqa_sublayer(p["attn"], cfg, x, p["attn_norm"], cos, sin, cache, position, window)
    if "moe" in p:
        x, chosen = moe_sublayer(p["moe"], p["mlp_norm"], cfg, x, group_sizes_mode=group_sizes_mode, experts=experts,
                                 return_routing=True)
        return x, cache, chosen
    return x + swiglu_mlp(p["mlp"], rms_norm(x, p["mlp_norm"], eps)), cache, None


def written_out_scan(body, carry, xs) -> tuple:
    """lax.scan(body, carry, xs) over the layers written out, xs = (stacked params, layer indices):
    layer i runs on static slices of the stacked params, with i a Python int (so the cache's
    LayerOf index is static too), which XLA's GEMMs read in place (dense.static_weight_slices)."""
    stacked, layers = xs
    outs = []
    with dense.static_weight_slices():
        for i in range(layers.shape[0]):
            carry, out = body(carry, (jax.tree_util.tree_map(lambda a, i=i: a[i], stacked), i))
            outs.append(out)
    return carry, None if outs[0] is None else jnp.stack(outs)


def _decoder(params, cfg: Config, tokens, cache, position, group_sizes_mode, experts, unroll=False,
             remat=False) -> tuple:
    """(final-normed hidden states [B, S, H], the updated cache (None without one), the experts
    the tokens chose in each MoE layer: int32 [moe_layers, B*S, k]). unroll: every run of layers
    written out layer by layer instead of a lax.scan (generate's loop at larger batches). remat:
    each layer under jax.checkpoint (its backward runs its forward again)."""
    check_experts(experts, group_sizes_mode)
    check_params(params, cfg)
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be integer [batch, seq], got {tokens.dtype} {tuple(tokens.shape)}")
    x = embed(params["embed"], tokens)
    positions = (0 if position is None else position) + jnp.arange(tokens.shape[1], dtype=jnp.int32)
    cos, sin = cos_sin(positions, cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling)
    new_cache, routing = [], []
    for r, (start, n) in enumerate(layer_runs(cfg)):

        def body(carry, xs, window=cfg.window(start)):
            x, stack = carry
            p, index = xs
            view = None if stack is None else {k: LayerOf(a, index) for k, a in stack.items()}
            x, view, chosen = _layer(p, cfg, x, cos, sin, view, position, window, group_sizes_mode, experts)
            return (x, None if view is None else {k: v.stack for k, v in view.items()}), chosen

        if remat:
            body = jax.checkpoint(body)
        carry = (x, None if cache is None else cache[r])
        with jax.named_scope(scope_name(start, n)):
            if n == 1:  # a run of one layer: inline, its params without the layer axis (a bitcast)
                layer = jax.tree_util.tree_map(lambda a: a.reshape(a.shape[1:]), params["layers"][r])
                (x, stack), chosen = body(carry, (layer, 0))
                chosen = None if chosen is None else chosen[None]
            else:
                scan = written_out_scan if unroll else (te_async_scan if cache is None else jax.lax.scan)
                (x, stack), chosen = scan(body, carry, (params["layers"][r], jnp.arange(n, dtype=jnp.int32)))
        new_cache.append(stack)
        if chosen is not None:
            routing.append(chosen)
    b, s = tokens.shape
    routing = jnp.concatenate(routing) if routing else jnp.zeros((0, b * s, cfg.num_experts_per_tok), jnp.int32)
    return rms_norm(x, params["final_norm"], cfg.rms_norm_eps), None if cache is None else new_cache, routing


def _logits(params, x: jax.Array, dtype=jnp.float32) -> jax.Array:
    """Logits in `dtype` (float32 accumulation); the LM head is the embedding where the config ties
    them."""
    head = params.get("lm_head", params["embed"])
    return dense.linear(x, head, transpose_w=True, preferred_element_type=dtype)


@functools.partial(jax.jit, static_argnames=_STATIC + ("remat",))
def _forward(params, config, tokens, group_sizes_mode, experts, remat):
    x, _, _ = _decoder(params, config, tokens, None, None, group_sizes_mode, experts, remat=remat)
    return _logits(params, x)


@functools.partial(jax.jit, static_argnames=_STATIC + ("remat",))
def _next_token_loss(params, config, tokens, mask, group_sizes_mode, experts, remat):
    x, _, _ = _decoder(params, config, tokens[:, :-1], None, None, group_sizes_mode, experts, remat=remat)
    return cross_entropy(_logits(params, x, x.dtype), tokens[:, 1:], None if mask is None else mask[:, 1:])


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames=("cache",))
def _prefill(params, config, cache, tokens, group_sizes_mode, experts):
    x, cache, _ = _decoder(params, config, tokens, cache, None, group_sizes_mode, experts)
    return _logits(params, x[:, -1]), cache


@functools.partial(jax.jit, static_argnames=_STATIC + ("return_routing", "unroll"), donate_argnames=("cache",))
def _decode_step(params, config, cache, tokens, position, group_sizes_mode, experts, return_routing, unroll=False):
    if tokens.ndim != 2 or tokens.shape[0] != cache_batch(cache):
        raise ValueError(f"tokens must be [batch, T] with the cache's batch, got {tuple(tokens.shape)}")
    x, cache, routing = _decoder(params, config, tokens, cache, position, group_sizes_mode, experts, unroll)
    fits = (position >= 0) & (position + tokens.shape[1] <= cache_length(cache))
    logits = jnp.where(fits, _logits(params, x[:, -1]), jnp.nan)
    return (logits, cache, routing) if return_routing else (logits, cache)


def _position(position) -> jax.Array:
    """position as an int32 scalar (a device array outside jit), whatever integer kind it came as."""
    if np.ndim(position) != 0 or not jnp.issubdtype(jnp.result_type(position), jnp.integer):
        raise ValueError(f"position must be an integer scalar, got {position!r}")
    return jnp.asarray(position, jnp.int32)


def decode_step(params, config: Config, cache: list, tokens: jax.Array, position, *,
                group_sizes_mode: Optional[str] = None, experts: str = "te_async",
                return_routing: bool = False) -> tuple:
    """(logits [B, V] float32 of the last token, cache) for tokens [B, T] (T = 1 in a decode step)
    at positions position .. position + T - 1, attending to the cache before them. With
    return_routing, (logits, cache, routing): the experts each token chose in each MoE layer, in
    layer order, int32 [moe_layers, B*T, top_k] (row b*T + t is token [b, t]).

    One jitted function (config, group_sizes_mode, experts and return_routing static). The
    position is traced: it is made an int32 scalar first, so a Python int, a numpy integer and a
    jax int32 scalar all run the same compilation, which serves every step. The cache is donated:
    keep the returned one. The step attends over all max_len cache entries, masked; a position
    past the cache gives NaN logits. decode_step.lower(...) takes the same arguments. A loop of
    decode_steps hands every step new token, position and logits buffers; generate's loop, which
    keeps them in donated device state, is 1.04-1.13x faster per token (_GreedyState).
    """
    return _decode_step(params, config, cache, tokens, _position(position), group_sizes_mode, experts,
                        return_routing)


def _lower_decode_step(params, config, cache, tokens, position, *, group_sizes_mode=None, experts="te_async",
                       return_routing=False):
    position = position if isinstance(position, jax.ShapeDtypeStruct) else _position(position)
    return _decode_step.lower(params, config, cache, tokens, position, group_sizes_mode, experts, return_routing)


decode_step.lower = _lower_decode_step


class _GreedyState(NamedTuple):
    """generate's loop state. It lives on the device and every step donates it, so that each of
    its buffers keeps its address from step to step: XLA then replays the step's CUDA graphs
    as they are, where new input and output buffers in every step make it update them first
    (H200, DeepSeek-V2-Lite, 4096 cached tokens, device mode, per token: 3.78 against 4.28 ms at
    batch 1, 8.87 against 9.61 at batch 8; docs/internals.md table G3)."""

    cache: list
    tokens: jax.Array  # int32 [B, max_new_tokens], generated so far up to `count`
    count: jax.Array  # int32 scalar, >= 1
    start: jax.Array  # int32 scalar: the cache position of tokens[:, 0]

    @classmethod
    def first(cls, cache: list, token: jax.Array, position, width: int) -> "_GreedyState":
        """The state holding one token [B, 1], the next step's input at cache `position`, with room
        for `width` tokens (width - 1 steps). The scalars are arrays of its own (jnp.array copies),
        since every step donates them: a caller's position array would be deleted by the first."""
        tokens = jnp.zeros((token.shape[0], width), jnp.int32).at[:, :1].set(token)
        return cls(cache, tokens, jnp.array(1, jnp.int32), jnp.array(position, jnp.int32))


@functools.partial(jax.jit, static_argnames=_STATIC + ("unroll",), donate_argnames=("state",))
def _greedy_step(params, config, state: _GreedyState, group_sizes_mode, experts, unroll=False) -> _GreedyState:
    """Feeds the last generated token through decode_step and appends the argmax of its logits."""
    cache, tokens, count, start = state
    last = jax.lax.dynamic_slice_in_dim(tokens, count - 1, 1, axis=1)
    logits, cache = _decode_step(params, config, cache, last, start + count - 1, group_sizes_mode, experts, False,
                                 unroll)
    tokens = jax.lax.dynamic_update_slice_in_dim(tokens, greedy_tokens(logits), count, axis=1)
    return _GreedyState(cache, tokens, count + 1, start)


def greedy_tokens(logits: jax.Array) -> jax.Array:
    """The argmax token of each row of logits [B, V], as int32 [B, 1]: the next step's input."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)[:, None]


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


def _check_remat(remat) -> None:
    if not isinstance(remat, bool):
        raise TypeError(f"remat must be True or False, got {remat!r}")


def forward(params, config: Config, tokens, *, group_sizes_mode: Optional[str] = None,
            experts: str = "te_async", remat: bool = False) -> jax.Array:
    """Logits [B, S, V] float32 of a causal pass over tokens [B, S] from position 0, no cache.
    remat=True runs each decoder layer under jax.checkpoint: differentiated, a layer keeps only its
    input for the backward, which runs the layer's forward again (training memory for time)."""
    _check_remat(remat)
    return _forward(params, config, _check_tokens(tokens, config), group_sizes_mode, experts, remat)


def next_token_loss(params, config: Config, tokens, mask=None, *, group_sizes_mode: Optional[str] = None,
                    experts: str = "te_async", remat: bool = False) -> jax.Array:
    """The mean cross-entropy (float32) of predicting tokens[:, 1:] from tokens[:, :-1] [B, S >= 2]:
    what a training step differentiates. mask [B, S] (bool or 0/1) marks the real tokens of
    right-padded sequences: a prediction counts where its target is marked (the padding after a
    sequence cannot reach its real tokens through causal attention); data-parallel shards with
    different counts of marked tokens then need their losses weighted by those counts. The logits
    stay in the hidden states' dtype (bf16 for a bf16 model) and the loss is
    models.loss.cross_entropy, whose gradient is one elementwise pass over them;
    cross_entropy(forward(...)) is the same loss over float32 logits."""
    _check_remat(remat)
    tokens = _check_tokens(tokens, config)
    if tokens.shape[1] < 2:
        raise ValueError(f"next_token_loss needs at least 2 tokens a sequence, got tokens {tokens.shape}")
    mask = None if mask is None else jnp.asarray(mask)
    if mask is not None and mask.shape != tokens.shape:
        raise ValueError(f"next_token_loss's mask must have the tokens' shape {tokens.shape}, got {mask.shape}")
    return _next_token_loss(params, config, tokens, mask, group_sizes_mode, experts, remat)


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


def unrolls(batch: int, group_sizes_mode: Optional[str] = None, experts: str = "te_async") -> bool:
    """Whether generate's decode steps write their layers out (one CUDA graph per step, which
    XLA replays as it is in generate's donated loop) rather than scan them (a graph per scan trip,
    whose operands move with the trip): up to UNROLL_MAX_BATCH, where that measured faster or level,
    and in device mode (the default), the only one measured."""
    return batch <= UNROLL_MAX_BATCH and experts == "te_async" and group_sizes_mode in (None, "device")


def generate(params, config: Config, prompt, max_new_tokens: int, *, group_sizes_mode: Optional[str] = None,
             experts: str = "te_async", max_len: Optional[int] = None,
             unroll_layers: Optional[bool] = None) -> jax.Array:
    """Greedy decoding: tokens [B, S + max_new_tokens], the prompt [B, S] then the argmax tokens.

    One jitted prefill fills a cache of max_len tokens (default S + max_new_tokens, in the
    embedding's dtype), then one jitted step per further token: decode_step on the last token and
    its argmax, with the tokens kept on the device (_GreedyState says why). unroll_layers: the
    decode steps' runs of layers written out rather than scanned; None decides by the batch and
    the mode (unrolls); either way the tokens are the same.
    """
    prompt = _check_tokens(prompt, config)
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    batch, length = prompt.shape
    if unroll_layers is not None and not isinstance(unroll_layers, bool):
        raise ValueError(f"unroll_layers must be None, True or False, got {unroll_layers!r}")
    if max_new_tokens == 0:
        return prompt
    max_len = length + max_new_tokens if max_len is None else max_len
    if length + max_new_tokens > max_len:
        raise ValueError(f"the prompt ({length} tokens) and max_new_tokens ({max_new_tokens}) exceed max_len {max_len}")
    cache = init_cache(config, batch, max_len, params["embed"].dtype)
    modes = dict(group_sizes_mode=group_sizes_mode, experts=experts)
    logits, cache = prefill(params, config, cache, prompt, **modes)
    state = _GreedyState.first(cache, greedy_tokens(logits), length, max_new_tokens)
    unroll = unrolls(batch, group_sizes_mode, experts) if unroll_layers is None else unroll_layers
    for _ in range(max_new_tokens - 1):
        state = _greedy_step(params, config, state, group_sizes_mode, experts, unroll)
    return jnp.concatenate([prompt, state.tokens], axis=1)
