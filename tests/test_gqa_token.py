"""te_async.gqa_token: grouped-query attention of one new token per sequence from the input
projections' output (the per-head q/k norms, the rope, the cache write, the attention) in one FFI
call, against the unfused path of te_async.models (rms_norm, apply_rope, the cache write,
decode_attention's kernel) and a float64 NumPy reference, with Qwen3-30B-A3B's and Mixtral's head
shapes; the cache rows it writes in place, inside a scan over the stacked cache too; bad positions
and layers; the whole attention half (gqa_token_block: input_layernorm, the projections, o_proj and the
residual in the same call) against the unfused path and float64; Qwen3-, Mixtral- and Qwen2-MoE-shaped
(q/k/v biases) models' decode steps through them, and where the models take them."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async.models as models
from te_async import decode_attention as da
from te_async import gqa_token
from te_async.models.attention import LayerOf, linear, write
from te_async.models.norm import rms_norm
from te_async.models.rope import apply_rope, cos_sin
from test_decode_attention import decode_logits, numpy_attention, rel_max

D = 128  # the kernel's head dims
EPS = 1e-6
THETA = 1e6  # Qwen3's rope theta


def make(rng, batch, heads, kv_heads, max_len, layers=3, norm=True):
    """Random bf16 (projected, q_norm, k_norm, k_cache, v_cache): q and k of about 1 (3 without the
    norms, which take the scale away) so that the scores spread over a few units."""
    x = lambda scale, *shape: jnp.asarray(scale * rng.standard_normal(shape), jnp.bfloat16)
    projected = x(1.0, batch, 1, (heads + 2 * kv_heads) * D)
    if not norm:
        projected = projected * 3
    norms = (x(0.2, D) + 1, x(0.2, D) + 1) if norm else (None, None)
    return (projected, *norms, x(1.0, layers, batch, max_len, kv_heads, D), x(1.0, layers, batch, max_len, kv_heads, D))


def rotation(position):
    cos, sin = cos_sin(jnp.asarray([position], jnp.int32), D, THETA, None)
    return cos[0], sin[0]


def kernel(operands, heads, position, layer, scale, window=None):
    projected, q_norm, k_norm, k_cache, v_cache = operands
    cos, sin = rotation(max(position, 0))
    f = jax.jit(lambda p, qn, kn, c, s, kc, vc, pos, lay: gqa_token.gqa_token_attention(
        p, kc, vc, c, s, pos, lay, heads=heads, scale=scale, q_norm=qn, k_norm=kn, eps=EPS, window=window))
    return f(projected, q_norm, k_norm, cos, sin, k_cache, v_cache, jnp.int32(position), jnp.int32(layer))


def unfused(operands, heads, position, layer, scale, window=None):
    """te_async.models.attention's decode path without the call, with decode_attention's kernel:
    (out, k_cache, v_cache, the rotated query)."""
    projected, q_norm, k_norm, k_cache, v_cache = operands
    cos, sin = (c[None] for c in rotation(position))
    hkv = k_cache.shape[3]

    def f(projected, k_cache, v_cache):
        b = projected.shape[0]
        q = projected[..., :heads * D].reshape(b, 1, heads, D)
        k = projected[..., heads * D:(heads + hkv) * D].reshape(b, 1, hkv, D)
        v = projected[..., (heads + hkv) * D:].reshape(b, 1, hkv, D)
        if q_norm is not None:
            q, k = rms_norm(q, q_norm, EPS), rms_norm(k, k_norm, EPS)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_cache, v_cache = write(LayerOf(k_cache, layer), k, position).stack, write(LayerOf(v_cache, layer), v,
                                                                                     position).stack
        out = da.decode_attention(q, k_cache, v_cache, position, scale=scale, layer=layer, window=window,
                                  kernel="te_async")
        return out, k_cache, v_cache, q

    return jax.jit(f)(projected, k_cache, v_cache)


def numpy_prep(operands, heads, position, norm):
    """float64 from `projected`: the rotated query [B, 1, H, D] and the new key and value [B, Hkv, D]."""
    projected, q_norm, k_norm = (None if a is None else np.asarray(a, np.float64) for a in operands[:3])
    hkv = operands[3].shape[3]
    b = projected.shape[0]
    q = projected[:, 0, :heads * D].reshape(b, heads, D)
    k = projected[:, 0, heads * D:(heads + hkv) * D].reshape(b, hkv, D)
    v = projected[:, 0, (heads + hkv) * D:].reshape(b, hkv, D)
    if norm:
        q = q / np.sqrt(np.mean(q ** 2, axis=-1, keepdims=True) + EPS) * q_norm
        k = k / np.sqrt(np.mean(k ** 2, axis=-1, keepdims=True) + EPS) * k_norm
    theta = position / THETA ** (np.arange(0, D, 2) / D)
    cos, sin = np.cos(np.concatenate([theta, theta])), np.sin(np.concatenate([theta, theta]))
    rope = lambda x: x * cos + np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1) * sin
    return rope(q)[:, None], rope(k), v


@pytest.mark.parametrize("bad", ["float32", "two tokens", "head dims", "group of 32", "one norm", "norm width",
                                 "width"])
def test_refuses_what_it_cannot_run(rng, bad):
    """What the call does not take (or no GPU): an error naming what it takes, on any machine."""
    projected, q_norm, k_norm, k_cache, v_cache = make(rng, 1, 8, 2, 64)
    heads = 8
    if bad == "float32":
        projected = projected.astype(jnp.float32)
    elif bad == "two tokens":
        projected = jnp.concatenate([projected] * 2, axis=1)
    elif bad == "head dims":
        k_cache, v_cache = k_cache[..., :64], v_cache[..., :64]
    elif bad == "group of 32":
        heads, projected = 32, make(rng, 1, 32, 1, 64)[0]
        k_cache, v_cache = k_cache[:, :, :, :1], v_cache[:, :, :, :1]
    elif bad == "norm width":
        q_norm = q_norm[:-8]
    elif bad == "width":
        projected = projected[..., :-8]
    cos, sin = rotation(3)
    if bad == "one norm":
        with pytest.raises(ValueError, match="q_norm and k_norm come together"):
            gqa_token.gqa_token_attention(projected, k_cache, v_cache, cos, sin, 3, heads=heads, scale=0.1,
                                          q_norm=q_norm)
        return
    assert not gqa_token.applies(projected, k_cache, v_cache, heads, (q_norm, k_norm))
    with pytest.raises(ValueError, match="gqa_token_attention needs a GPU"):
        gqa_token.gqa_token_attention(projected, k_cache, v_cache, cos, sin, 3, heads=heads, scale=0.1,
                                      q_norm=q_norm, k_norm=k_norm)


CASES = [  # (batch, heads, kv_heads, max_len, position, window, norm)
    (1, 32, 4, 4096, 4095, None, True),    # Qwen3-30B-A3B at batch 1, the cache full
    (1, 32, 4, 4096, 2000, None, True),
    (2, 32, 8, 300, 150, 33, False),       # Mixtral's heads and a sliding window; keys that do not split evenly
    (3, 16, 16, 257, 200, None, False),    # Qwen2-MoE's: a kv head per query head
    (2, 4, 2, 64, 0, None, True),          # the first token: one key
    (8, 32, 4, 1024, 1000, None, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-H{}-Hkv{}-N{}-p{}-w{}-n{:d}".format(*c))
def test_matches_the_unfused_path_and_numpy(rng, case):
    batch, heads, kv_heads, max_len, position, window, norm = case
    operands = make(rng, batch, heads, kv_heads, max_len, norm=norm)
    layer, scale = int(rng.integers(3)), D ** -0.5
    out, k_cache, v_cache = (np.asarray(a, np.float64) for a in kernel(operands, heads, position, layer, scale,
                                                                       window))
    ref_out, ref_k, ref_v, ref_q = (np.asarray(a, np.float64) for a in unfused(operands, heads, position, layer, scale,
                                                                                window))
    # the cache: every other row untouched, the new row against float64 and the unfused path
    others = np.ones(k_cache.shape[:3], bool)
    others[layer, :, position] = False
    for got, given in ((k_cache, operands[3]), (v_cache, operands[4])):
        np.testing.assert_array_equal(got[others], np.asarray(given, np.float64)[others])
    q64, k64, v64 = numpy_prep(operands, heads, position, norm)
    np.testing.assert_array_equal(v_cache[layer, :, position], v64)  # the value as projected
    new_k = k_cache[layer, :, position]
    np.testing.assert_allclose(new_k, k64, rtol=2e-2, atol=1e-2 * np.abs(k64).max())  # bf16 roundings
    # the same rounding points as the unfused path; the norm's sum runs in another order than XLA's
    # and the rope's products may be fused otherwise, so a few values round the other way
    assert np.mean(new_k == ref_k[layer, :, position]) > 0.95
    # the output against float64 over the cache as written, with the unfused path's query
    ref = numpy_attention(ref_q, k_cache, v_cache, position, layer, None, None, scale, window)
    assert not np.isnan(out).any()
    assert rel_max(out, ref) < max(2 * rel_max(ref_out, ref), 8e-3), (rel_max(out, ref), rel_max(ref_out, ref))
    np.testing.assert_allclose(np.asarray(ref_q), q64, rtol=2e-2, atol=1e-2 * np.abs(q64).max())
    again = kernel(operands, heads, position, layer, scale, window)
    np.testing.assert_array_equal(out, np.asarray(again[0], np.float64))  # deterministic


@pytest.mark.gpu
def test_the_same_query_and_cache_give_decode_attentions_output(rng):
    """Where the prep's rows equal the unfused path's, the heads' outputs are decode_attention's
    kernel's bit for bit: the split and merge kernels are the same, with the same splits. Without
    the norms and at position 0 (cos 1, sin 0) the rope leaves q and k as projected."""
    operands = make(rng, 2, 32, 4, 512, norm=False)
    out, k_cache, _ = kernel(operands, 32, 0, 1, 0.09)
    ref_out, ref_k, _, _ = unfused(operands, 32, 0, 1, 0.09)
    np.testing.assert_array_equal(np.asarray(k_cache), np.asarray(ref_k))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref_out))


@pytest.mark.gpu
def test_writes_the_stacked_cache_in_a_scan(rng):
    """The decoder's use: inside lax.scan, the stacked cache a carry written in place at each layer."""
    layers, position, heads = 4, 500, 32
    operands = make(rng, 1, heads, 4, 512, layers)
    projected, q_norm, k_norm, k_cache, v_cache = operands
    cos, sin = rotation(position)

    def over_layers(k_cache, v_cache):
        def body(cache, layer):
            out, k, v = gqa_token.gqa_token_attention(projected, *cache, cos, sin, position, layer, heads=heads,
                                                      scale=0.09, q_norm=q_norm, k_norm=k_norm, eps=EPS)
            return (k, v), out
        return jax.lax.scan(body, (k_cache, v_cache), jnp.arange(layers, dtype=jnp.int32))

    (k, v), outs = jax.jit(over_layers, donate_argnums=(0, 1))(jnp.array(k_cache), jnp.array(v_cache))
    k, v = np.asarray(k), np.asarray(v)
    others = np.ones(k.shape[:3], bool)
    others[:, 0, position] = False
    np.testing.assert_array_equal(k[others], np.asarray(k_cache)[others])
    np.testing.assert_array_equal(v[others], np.asarray(v_cache)[others])
    for layer in range(layers):
        ref_out, ref_k, ref_v, _ = unfused(operands, heads, position, layer, 0.09)
        assert np.mean(k[layer, 0, position] == np.asarray(ref_k[layer, 0, position])) > 0.95
        np.testing.assert_array_equal(v[layer, 0, position], np.asarray(ref_v[layer, 0, position]))
        assert rel_max(np.asarray(outs[layer], np.float64), np.asarray(ref_out, np.float64)) < 3e-2, layer


@pytest.mark.gpu
@pytest.mark.parametrize("call", ["attention", "block"])
def test_a_bad_position_or_layer_writes_nothing(rng, call):
    if call == "attention":
        operands, run = make(rng, 1, 32, 4, 128), kernel
    else:
        operands, run = make_block(rng, 1, 32, 4, 128, 256), block_kernel
    k_cache, v_cache = np.asarray(operands[-2]), np.asarray(operands[-1])
    # a negative position, a layer past the stack, a position past the cache
    for position, layer, nan in ((-3, 0, True), (5, 7, True), (128, 1, False)):
        out, k, v = run(operands, 32, position, layer, 0.09)
        np.testing.assert_array_equal(np.asarray(k), k_cache)
        np.testing.assert_array_equal(np.asarray(v), v_cache)
        assert np.isnan(np.asarray(out, np.float64)).all() == nan, (position, layer)
        if not nan:
            assert not np.isnan(np.asarray(out, np.float64)).any()


def make_block(rng, batch, heads, kv_heads, max_len, hidden, norm=True, layers=3):
    """Random bf16 (x, norm, w_in, wo, q_norm, k_norm, k_cache, v_cache) at a layer's scales."""
    x = lambda scale, *shape: jnp.asarray(scale * rng.standard_normal(shape), jnp.bfloat16)
    width = (heads + 2 * kv_heads) * D
    _, q_norm, k_norm, k_cache, v_cache = make(rng, batch, heads, kv_heads, max_len, layers, norm)
    return (x(1.0, batch, 1, hidden), x(0.2, hidden) + 1, x(3 * hidden ** -0.5, hidden, width),
            x((heads * D) ** -0.5, heads * D, hidden), q_norm, k_norm, k_cache, v_cache)


def block_kernel(operands, heads, position, layer, scale, window=None):
    x, norm, w_in, wo, q_norm, k_norm, k_cache, v_cache = operands
    cos, sin = rotation(max(position, 0))
    f = jax.jit(lambda *a: gqa_token.gqa_token_block(*a[:10], heads=heads, scale=scale, eps=EPS, q_norm=a[10],
                                                     k_norm=a[11], window=window))
    return f(x, norm, w_in, wo, k_cache, v_cache, cos, sin, jnp.int32(position), jnp.int32(layer), q_norm, k_norm)


def block_unfused(operands, heads, position, layer, scale, window=None):
    """te_async.models' attention half without either call: (out, k_cache, v_cache, the rotated query)."""
    x, norm, w_in, wo, q_norm, k_norm, k_cache, v_cache = operands
    projected = linear(rms_norm(x, norm, EPS), w_in)
    out, k_cache, v_cache, q = unfused((projected, q_norm, k_norm, k_cache, v_cache), heads, position, layer, scale,
                                       window)
    return x + linear(out.reshape(x.shape[0], 1, -1), wo), k_cache, v_cache, q


def numpy_block(operands, heads, position, layer, scale, window, k_cache, v_cache):
    """float64 from x, over the cache as the call wrote it."""
    x, norm, w_in, wo = (np.asarray(a, np.float64) for a in operands[:4])
    h = x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + EPS) * norm
    q, _, _ = numpy_prep((h @ w_in, *operands[4:]), heads, position, operands[4] is not None)
    out = numpy_attention(q, k_cache, v_cache, position, layer, None, None, scale, window)
    return x + out.reshape(x.shape[0], 1, -1) @ wo


@pytest.mark.parametrize("bad", ["hidden 4096", "hidden 200", "wo rows", "float32 x", "o_proj rows 8192"])
def test_the_block_refuses_what_it_cannot_run(rng, bad):
    """What gqa_token_block does not take (or no GPU): an error naming what it takes, on any machine."""
    heads, hidden = 32, 2048
    if bad == "o_proj rows 8192":
        heads = 64
    if bad in ("hidden 4096", "hidden 200"):
        hidden = int(bad.split()[1])
    operands = list(make_block(rng, 1, heads, heads // 8, 64, hidden))
    if bad == "wo rows":
        operands[3] = operands[3][:-128]
    elif bad == "float32 x":
        operands[0] = operands[0].astype(jnp.float32)
    x, norm, w_in, wo, q_norm, k_norm, k_cache, v_cache = operands
    assert not gqa_token.block_applies(x, w_in, wo, k_cache, v_cache, heads, (q_norm, k_norm))
    cos, sin = rotation(3)
    with pytest.raises(ValueError, match="gqa_token_block needs"):
        gqa_token.gqa_token_block(x, norm, w_in, wo, k_cache, v_cache, cos, sin, 3, heads=heads, scale=0.1, eps=EPS,
                                  q_norm=q_norm, k_norm=k_norm)


BLOCK_CASES = [  # (batch, heads, kv_heads, max_len, position, window, norm, hidden)
    (1, 32, 4, 4096, 4095, None, True, 2048),   # Qwen3-30B-A3B at batch 1, the cache full
    (3, 32, 8, 300, 150, 33, False, 384),       # Mixtral's heads, a window, an odd batch (a block's second sequence)
    (2, 16, 16, 257, 0, None, True, 128),       # a kv head per query head, position 0, the smallest hidden size
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", BLOCK_CASES, ids=lambda c: "B{}-H{}-Hkv{}-N{}-p{}-w{}-n{:d}-h{}".format(*c))
def test_the_block_matches_the_unfused_path_and_numpy(rng, case):
    batch, heads, kv_heads, max_len, position, window, norm, hidden = case
    operands = make_block(rng, batch, heads, kv_heads, max_len, hidden, norm)
    layer, scale = int(rng.integers(3)), D ** -0.5
    out, k_cache, v_cache = (np.asarray(a, np.float64) for a in block_kernel(operands, heads, position, layer, scale,
                                                                             window))
    ref_out, ref_k, ref_v, _ = (np.asarray(a, np.float64) for a in block_unfused(operands, heads, position, layer,
                                                                                  scale, window))
    others = np.ones(k_cache.shape[:3], bool)
    others[layer, :, position] = False
    for got, given, ref in ((k_cache, operands[6], ref_k), (v_cache, operands[7], ref_v)):
        np.testing.assert_array_equal(got[others], np.asarray(given, np.float64)[others])
        # the projections' sums run in another order than the unfused path's: a few values round the other way
        new, ref_new = got[layer, :, position], ref[layer, :, position]
        assert np.mean(new == ref_new) > 0.9
        np.testing.assert_allclose(new, ref_new, rtol=2e-2, atol=1e-2 * np.abs(ref_new).max())
    ref64 = numpy_block(operands, heads, position, layer, scale, window, k_cache, v_cache)
    assert not np.isnan(out).any()
    assert rel_max(out, ref64) < max(2 * rel_max(ref_out, ref64), 8e-3), (rel_max(out, ref64), rel_max(ref_out, ref64))
    assert rel_max(out, ref_out) < 2e-2
    again = block_kernel(operands, heads, position, layer, scale, window)
    np.testing.assert_array_equal(out, np.asarray(again[0], np.float64))  # deterministic


QWEN3_SHAPED = dict(  # Qwen3-30B-A3B's attention shapes (q/k norms), everything else small
    model_type="qwen3_moe", vocab_size=300, hidden_size=256, intermediate_size=320, moe_intermediate_size=64,
    num_hidden_layers=3, num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=8,
    num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6,
    rope_theta=1e6, max_position_embeddings=4096, attention_bias=False, tie_word_embeddings=False)
MIXTRAL_SHAPED = dict(  # Mixtral's attention shapes and a sliding window, everything else small
    model_type="mixtral", vocab_size=300, hidden_size=256, intermediate_size=320, num_hidden_layers=3,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_local_experts=8, num_experts_per_tok=2,
    rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=4096, sliding_window=9, tie_word_embeddings=False)

QWEN2_SHAPED = dict(  # Qwen2-MoE's q/k/v biases and a shared expert, heads of 128 dims, everything else small
    model_type="qwen2_moe", vocab_size=300, hidden_size=512, intermediate_size=320, moe_intermediate_size=64,
    shared_expert_intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
    qkv_bias=True, use_sliding_window=False, sliding_window=None, max_window_layers=3, rms_norm_eps=1e-6,
    rope_theta=1e6, max_position_embeddings=4096, tie_word_embeddings=False)


@pytest.mark.gpu
@pytest.mark.parametrize("hf", [QWEN3_SHAPED, MIXTRAL_SHAPED, QWEN2_SHAPED], ids=["qwen3", "mixtral", "qwen2"])
@pytest.mark.parametrize("batch", [1, 3])
def test_model_decodes_the_same_through_the_call(monkeypatch, hf, batch):
    """The models' decode steps through the call against the same steps through the unfused path,
    both with decode_attention's kernel (TE_ASYNC_DECODE_ATTENTION=te_async: the call at any batch)."""
    through = decode_logits(monkeypatch, batch, {da: "te_async"}, hf)  # the block (Qwen3, Mixtral) or the call
    monkeypatch.setattr(gqa_token, "block_takes", lambda *a, **k: False)
    through_call = decode_logits(monkeypatch, batch, {da: "te_async"}, hf)
    monkeypatch.setattr(gqa_token, "takes", lambda *a, **k: False)
    unfused_run = decode_logits(monkeypatch, batch, {da: "te_async"}, hf)
    for run in (through, through_call):
        assert not np.isnan(run).any()
        assert rel_max(run, unfused_run) < 3e-2


@pytest.mark.gpu
def test_the_models_take_the_call_where_decode_attention_takes_its_kernel(monkeypatch):
    """The Qwen3-shaped decode step holds the block call under "auto" up to AUTO_MAX_BATCH sequences
    and under "te_async" up to BLOCK_MAX_BATCH, then gqa_token_attention's call; never under "xla";
    the prefill never. With q/k/v biases (Qwen2-MoE) the decode step holds gqa_token_attention's call."""
    config = models.from_hf_dict(QWEN3_SHAPED)
    params = models.init_params(config, jax.random.key(0), jnp.bfloat16)
    batches = (1, gqa_token.AUTO_MAX_BATCH + 1, gqa_token.BLOCK_MAX_BATCH, gqa_token.BLOCK_MAX_BATCH + 1)
    caches = {b: models.init_cache(config, b, 64, jnp.bfloat16) for b in batches}
    step = lambda b: models.decode_step.lower(params, config, caches[b], jnp.zeros((b, 1), jnp.int32), 5,
                                              group_sizes_mode="device").as_text()
    cases = [("auto", 1, "block"), ("auto", gqa_token.AUTO_MAX_BATCH + 1, None), ("te_async", 1, "block"),
             ("te_async", gqa_token.BLOCK_MAX_BATCH, "block"), ("te_async", gqa_token.BLOCK_MAX_BATCH + 1, "call"),
             ("xla", 1, None)]
    try:
        for setting, batch, held in cases:
            monkeypatch.setenv(da.KERNEL_ENV, setting)
            da.default_kernel.cache_clear()
            jax.clear_caches()  # decode_step's trace holds the setting it was traced with
            assert held_call(step(batch)) == held, (setting, batch)
    finally:
        monkeypatch.delenv(da.KERNEL_ENV)
        da.default_kernel.cache_clear()
        jax.clear_caches()
    prefill = jax.jit(lambda p, c, t: models.prefill(p, config, c, t, group_sizes_mode="device")).lower(
        params, caches[1], jnp.zeros((1, 12), jnp.int32)).as_text()
    assert gqa_token.GQA_TOKEN not in prefill
    config = models.from_hf_dict(QWEN2_SHAPED)
    params = models.init_params(config, jax.random.key(0), jnp.bfloat16)
    text = models.decode_step.lower(params, config, models.init_cache(config, 1, 64, jnp.bfloat16),
                                    jnp.zeros((1, 1), jnp.int32), 5, group_sizes_mode="device").as_text()
    assert held_call(text) == "call"


def held_call(text: str):
    """Which of gqa_token's calls a lowered step holds: "block", "call" or None."""
    if gqa_token.GQA_TOKEN_BLOCK in text:
        return "block"
    return "call" if re.search(gqa_token.GQA_TOKEN + "(?!_block)", text) else None
