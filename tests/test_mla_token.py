"""te_async.mla_token: a decoder layer's MLA attention half for one new token per sequence (the
norm, the input projections, the attention, o_proj and the residual add) in one FFI call, against
the unfused path of te_async.models (rms_norm, w_in, the latent's norm, rope, cache write,
mla_decode_unfused, o_proj, the add) and a float64 NumPy reference, with DeepSeek-V2-Lite's head
shape; the cache rows it writes in place, inside a scan over the stacked cache too; bad positions
and layers; a DeepSeek-shaped model's decode steps, and the batches at which "auto" takes the call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async.models as models
from te_async import decode_attention as da
from te_async import mla_decode as md
from te_async import mla_token
from te_async.mla_decode import mla_decode_unfused
from te_async.models.attention import LayerOf, linear, write
from te_async.models.mla import LATENT_NORM_EPS, _rope
from te_async.models.norm import rms_norm
from te_async.models.rope import cos_sin
from test_decode_attention import DEEPSEEK_SHAPED, decode_logits
from test_mla_decode import numpy_mla, rel_max

NOPE, ROPE, LATENT, VALUE = 128, 64, 512, 128
HIDDEN = 2048  # DeepSeek-V2-Lite's
SCALE = 0.07
EPS = 1e-6  # input_layernorm's (DeepSeek-V2-Lite's rms_norm_eps)


def make(rng, batch, heads, max_len, layers=3, hidden=HIDDEN):
    """Random bf16 (x, norm, w_in, kv_norm, w_kv, wo, ckv, kpe). x is small beside the attention's
    output (the norm takes its scale away), so that the residual add leaves the output's error
    visible; w_in gives q and kv_a of about 1 and 3, so that the scores spread over a few units."""
    x = lambda scale, *shape: jnp.asarray(scale * rng.standard_normal(shape), jnp.bfloat16)
    w_in = rng.standard_normal((hidden, heads * (NOPE + ROPE) + LATENT + ROPE)) / hidden ** 0.5
    w_in[:, heads * (NOPE + ROPE):] *= 3
    return (x(0.01, batch, 1, hidden), jnp.asarray(1 + 0.2 * rng.standard_normal(hidden), jnp.bfloat16),
            jnp.asarray(w_in, jnp.bfloat16), jnp.asarray(1 + 0.2 * rng.standard_normal(LATENT), jnp.bfloat16),
            x(0.05, heads, NOPE + VALUE, LATENT), x(0.05, heads * VALUE, hidden),
            x(1.0, layers, batch, max_len, LATENT), x(1.0, layers, batch, max_len, ROPE))


def rotation(position):
    cos, sin = cos_sin(jnp.asarray([position], jnp.int32), ROPE, 10000.0, None)
    return cos[0], sin[0]


def kernel(operands, position, layer, window=None, interleaved=True):
    x, norm, w_in, kv_norm, w_kv, wo, ckv, kpe = operands
    cos, sin = rotation(max(position, 0))
    f = jax.jit(lambda *a: mla_token.mla_token_block(*a, eps=EPS, latent_eps=LATENT_NORM_EPS, scale=SCALE,
                                                     interleaved=interleaved, window=window))
    return f(x, norm, w_in, kv_norm, w_kv, wo, cos, sin, ckv, kpe, jnp.int32(position), jnp.int32(layer))


def unfused(operands, position, layer, window=None, interleaved=True):
    """te_async.models' decode path without the call: (x + o_proj's output, ckv, kpe, the unrotated
    query, the rotated rope query)."""
    x, norm, w_in, kv_norm, w_kv, wo, ckv, kpe = operands
    cos, sin = (c[None] for c in rotation(position))
    heads = w_kv.shape[0]

    def f(x, ckv, kpe):
        projected = linear(rms_norm(x, norm, EPS), w_in)
        q = projected[..., :heads * (NOPE + ROPE)].reshape(*x.shape[:2], heads, -1)
        kv_a = projected[..., heads * (NOPE + ROPE):]
        c = rms_norm(kv_a[..., :LATENT], kv_norm, LATENT_NORM_EPS)
        k_pe = _rope(kv_a[..., None, LATENT:], cos, sin, interleaved)[:, :, 0]
        ckv, kpe = write(LayerOf(ckv, layer), c, position).stack, write(LayerOf(kpe, layer), k_pe, position).stack
        q_pe = _rope(q[..., NOPE:], cos, sin, interleaved)
        out = mla_decode_unfused(q[..., :NOPE], q_pe, w_kv, ckv, kpe, jnp.int32(position), jnp.int32(layer),
                                 scale=SCALE, window=window, attention="xla")
        return x + linear(out.reshape(*out.shape[:2], -1), wo), ckv, kpe, q, q_pe

    return jax.jit(f)(x, ckv, kpe)


def numpy_prep(operands, position, interleaved=True):
    """float64 from x: the normalised latent and the rotated rope key [B, ...] of the new token."""
    x, norm, w_in, kv_norm, w_kv = (np.asarray(a, np.float64) for a in operands[:5])
    x = x[:, 0] / np.sqrt(np.mean(x[:, 0] ** 2, axis=-1, keepdims=True) + EPS) * norm
    kv = x @ w_in[:, w_kv.shape[0] * (NOPE + ROPE):]
    c = kv[:, :LATENT] / np.sqrt(np.mean(kv[:, :LATENT] ** 2, axis=-1, keepdims=True) + LATENT_NORM_EPS)
    c = c * kv_norm
    k = kv[:, LATENT:]
    if interleaved:
        k = np.concatenate([k[:, 0::2], k[:, 1::2]], axis=-1)
    theta = position / 10000.0 ** (np.arange(0, ROPE, 2) / ROPE)
    cos, sin = np.cos(np.concatenate([theta, theta])), np.sin(np.concatenate([theta, theta]))
    rotated = np.concatenate([-k[:, ROPE // 2:], k[:, :ROPE // 2]], axis=-1)
    return c, k * cos + rotated * sin


def replaced(operands, index, value):
    return operands[:index] + (value,) + operands[index + 1:]


def test_refuses_what_it_cannot_run(rng):
    """float32 operands, two tokens, 17 heads, a latent of the wrong width, a hidden size that is not
    a multiple of 128 or past 2048 (or no GPU): an error naming what the call takes, on any machine."""
    good = make(rng, 1, 16, 64)
    bad = [tuple(jnp.asarray(a, jnp.float32) for a in good),
           replaced(good, 0, jnp.concatenate([good[0]] * 2, axis=1)),
           make(rng, 1, 17, 64),
           replaced(good, 2, good[2][:, :-8]),
           make(rng, 1, 16, 64, hidden=200),
           make(rng, 1, 16, 64, hidden=2176)]
    for operands in bad:
        x, _, w_in, _, w_kv, wo, ckv, _ = operands
        assert not mla_token.applies(x, w_in, w_kv, wo, ckv)
        with pytest.raises(ValueError, match="mla_token_block needs a GPU"):
            kernel(operands, 3, 0)


CASES = [  # (batch, heads, max_len, position, window, interleaved, hidden)
    (1, 16, 4096, 4095, None, True, HIDDEN),  # DeepSeek-V2-Lite at batch 1, the cache full
    (1, 16, 4096, 2000, None, False, HIDDEN),
    (2, 16, 300, 150, None, True, HIDDEN),    # keys that do not split evenly
    (3, 5, 257, 200, 33, True, 384),          # 5 heads, a window, a small hidden size
    (2, 16, 64, 0, None, True, 128),          # the first token: one key
    (8, 16, 1024, 1000, None, True, HIDDEN),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-H{}-N{}-p{}-w{}-i{:d}-h{}".format(*c))
def test_matches_the_unfused_path_and_numpy(rng, case):
    batch, heads, max_len, position, window, interleaved, hidden = case
    operands = make(rng, batch, heads, max_len, hidden=hidden)
    layer = int(rng.integers(3))
    out, ckv, kpe = (np.asarray(a, np.float64) for a in kernel(operands, position, layer, window, interleaved))
    ref_out, ref_ckv, ref_kpe, q, q_pe = unfused(operands, position, layer, window, interleaved)
    ref_ckv, ref_kpe = np.asarray(ref_ckv, np.float64), np.asarray(ref_kpe, np.float64)
    # the cache: every other row untouched, the new row against float64 from x and the unfused path
    others = np.ones(ckv.shape[:3], bool)
    others[layer, :, position] = False
    np.testing.assert_array_equal(ckv[others], np.asarray(operands[6], np.float64)[others])
    np.testing.assert_array_equal(kpe[others], np.asarray(operands[7], np.float64)[others])
    c64, k64 = numpy_prep(operands, position, interleaved)
    for got, want, unfused_row in ((ckv[layer, :, position], c64, ref_ckv[layer, :, position]),
                                   (kpe[layer, :, position], k64, ref_kpe[layer, :, position])):
        # bf16 rounding of the normed input, the projection and the row
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=1e-2 * np.abs(want).max())
        # the same rounding points as the unfused path; the projection's sums run in another order
        # than XLA's GEMM, so a few values of kv_a, and through its norm of the row, round the other way
        assert np.mean(got == unfused_row) > 0.95
    # the output against float64 over the cache as written, with the unfused path's query
    heads_out = numpy_mla(q[..., :NOPE], q_pe, operands[4], ref_ckv, ref_kpe, position, layer, SCALE, window)
    ref = np.asarray(operands[0], np.float64) + heads_out.reshape(batch, 1, -1) @ np.asarray(operands[5], np.float64)
    xla = np.asarray(ref_out, np.float64)
    assert not np.isnan(out).any()
    assert rel_max(out, ref) < max(2 * rel_max(xla, ref), 8e-3), (rel_max(out, ref), rel_max(xla, ref))
    again = kernel(operands, position, layer, window, interleaved)
    np.testing.assert_array_equal(out, np.asarray(again[0], np.float64))  # deterministic


@pytest.mark.gpu
def test_adds_the_residual():
    """A zero o_proj: the output is x itself, bit for bit."""
    operands = make(np.random.default_rng(7), 2, 16, 128)
    operands = replaced(operands, 5, jnp.zeros_like(operands[5]))
    np.testing.assert_array_equal(np.asarray(kernel(operands, 60, 1)[0]), np.asarray(operands[0]))


@pytest.mark.gpu
def test_writes_the_stacked_cache_in_a_scan(rng):
    """The decoder's use: inside lax.scan, the stacked cache a carry written in place at each layer."""
    layers, position = 4, 500
    operands = make(rng, 1, 16, 512, layers)
    x, norm, w_in, kv_norm, w_kv, wo, ckv, kpe = operands
    cos, sin = rotation(position)

    def over_layers(ckv, kpe):
        def body(cache, layer):
            out, c, k = mla_token.mla_token_block(x, norm, w_in, kv_norm, w_kv, wo, cos, sin, *cache, position, layer,
                                                  eps=EPS, latent_eps=LATENT_NORM_EPS, scale=SCALE, interleaved=True)
            return (c, k), out
        return jax.lax.scan(body, (ckv, kpe), jnp.arange(layers, dtype=jnp.int32))

    (c, k), outs = jax.jit(over_layers, donate_argnums=(0, 1))(jnp.array(ckv), jnp.array(kpe))
    c, k = np.asarray(c), np.asarray(k)
    others = np.ones(c.shape[:3], bool)
    others[:, 0, position] = False
    np.testing.assert_array_equal(c[others], np.asarray(ckv)[others])
    for layer in range(layers):
        ref_out, ref_ckv, ref_kpe, _, _ = unfused(operands, position, layer)
        assert np.mean(c[layer, 0, position] == np.asarray(ref_ckv[layer, 0, position])) > 0.95
        assert np.mean(k[layer, 0, position] == np.asarray(ref_kpe[layer, 0, position])) > 0.95
        assert rel_max(np.asarray(outs[layer], np.float64), np.asarray(ref_out, np.float64)) < 3e-2, layer


@pytest.mark.gpu
def test_a_bad_position_or_layer_writes_nothing(rng):
    operands = make(rng, 1, 16, 128)
    ckv, kpe = np.asarray(operands[6]), np.asarray(operands[7])
    # a negative position, a layer past the stack, a position past the cache
    for position, layer, nan in ((-3, 0, True), (5, 7, True), (128, 1, False)):
        out, c, k = kernel(operands, position, layer)
        np.testing.assert_array_equal(np.asarray(c), ckv)
        np.testing.assert_array_equal(np.asarray(k), kpe)
        assert np.isnan(np.asarray(out, np.float64)).all() == nan, (position, layer)
        if not nan:
            assert not np.isnan(np.asarray(out, np.float64)).any()


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 2])
def test_model_decodes_the_same_through_the_call(monkeypatch, batch):
    """The DeepSeek-shaped model's decode steps through the call ("auto") against the unfused path
    with decode_attention's kernel."""
    runs = {path: decode_logits(monkeypatch, batch, {md: path, da: "te_async"})
            for path in ("unfused", "auto")}
    assert not np.isnan(runs["auto"]).any()
    assert rel_max(runs["auto"], runs["unfused"]) < 3e-2


@pytest.mark.gpu
def test_auto_takes_the_call_up_to_its_batch():
    """The models' decode step at DeepSeek-V2-Lite's attention shapes (TE_ASYNC_MLA_DECODE unset:
    "auto") holds the call at B <= AUTO_MAX_BATCH and the unfused path past it."""
    assert md.default_kernel() == "auto"
    config = models.from_hf_dict(DEEPSEEK_SHAPED)
    params = models.init_params(config, jax.random.key(0), jnp.bfloat16)
    for batch in (1, mla_token.AUTO_MAX_BATCH, mla_token.AUTO_MAX_BATCH + 1):
        cache = models.init_cache(config, batch, 64, jnp.bfloat16)
        hlo = models.decode_step.lower(params, config, cache, jnp.zeros((batch, 1), jnp.int32), 5,
                                       group_sizes_mode="device").as_text()
        assert (mla_token.MLA_TOKEN in hlo) == (batch <= mla_token.AUTO_MAX_BATCH), batch
