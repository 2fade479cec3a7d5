"""te_async.mla_decode: absorbed MLA decode attention. The unfused path (every backend) and the
fused CUDA kernel (on the GPU) against a float64 NumPy reference written the other way round, with
kv_b_proj expanded into per-head keys and values as transformers' DeepseekV2Attention does; DeepSeek's
head shape with 16 heads (V2-Lite), 20 (a partial group of 16) and 128 (V2, V3), several tokens,
windows, positions at both ends, a traced layer in a scan, both cluster sizes; then a bf16
DeepSeek-shaped model decoding through the kernel against the unfused path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_bad_setting_refused
from te_async import decode_attention as da
from te_async import mla_decode as md
from te_async.mla_decode import mla_decode_attention, mla_decode_unfused
from test_decode_attention import decode_logits

V2 = dict(nope=128, rope=64, latent=512, value=128)  # DeepSeek-V2 / V3
ODD = dict(nope=12, rope=4, latent=24, value=20)     # the unfused path takes any dims


def numpy_mla(q_nope, q_pe, w_kv, ckv, kpe, position, layer, scale, window):
    """float64, expanded: per head, keys [c W_uk | k_pe] and values c W_uv over every cached token."""
    q_nope, q_pe, w_kv, ckv, kpe = (np.asarray(x, np.float64) for x in (q_nope, q_pe, w_kv, ckv, kpe))
    b, t, h, nope = q_nope.shape
    c, k_pe = ckv[layer], kpe[layer]  # [B, N, latent], [B, N, rope]
    n = c.shape[1]
    out = np.zeros((b, t, h, w_kv.shape[1] - nope))
    j = np.arange(n)
    for head in range(h):
        keys = np.einsum("bnr,dr->bnd", c, w_kv[head, :nope])
        values = np.einsum("bnr,dr->bnd", c, w_kv[head, nope:])
        s = np.einsum("btd,bnd->btn", q_nope[:, :, head], keys) + np.einsum("btd,bnd->btn", q_pe[:, :, head], k_pe)
        for i in range(t):
            seen = (j <= position + i) & ((j > position + i - window) if window else True)
            si = np.where(seen, s[:, i] * scale, -np.inf)
            with np.errstate(invalid="ignore"):
                p = np.exp(si - si.max(-1, keepdims=True))
                out[:, i, head] = np.einsum("bn,bnd->bd", p / p.sum(-1, keepdims=True), values)
    return out


def make(rng, nope, rope, latent, value, batch=2, tokens=1, heads=16, max_len=70, layers=3, dtype=jnp.float32):
    """Random (q_nope, q_pe, w_kv, ckv, kpe), scaled so that the scores spread over a few units."""
    x = lambda scale, *shape: jnp.asarray(scale * rng.standard_normal(shape), dtype)
    return (x(1.0, batch, tokens, heads, nope), x(1.0, batch, tokens, heads, rope),
            x(0.05 * (128 / nope) ** 0.5, heads, nope + value, latent), x(1.0, layers, batch, max_len, latent),
            x(1.0, layers, batch, max_len, rope))


def rel_max(out, ref) -> float:
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


def unfused(operands, position, layer, scale, window=None, attention="xla"):
    f = lambda qn, qp, w, c, k, p, l: mla_decode_unfused(qn, qp, w, c, k, p, l, scale=scale, window=window,
                                                          attention=attention)
    return np.asarray(jax.jit(f)(*operands, position, layer), np.float64)


@pytest.mark.parametrize("dims", [V2, ODD], ids=["v2", "odd"])
@pytest.mark.parametrize("tokens,position,window,heads", [(1, 0, None, 16), (1, 69, None, 3), (2, 40, None, 5),
                                                          (3, 30, 7, 4)])
def test_unfused_matches_expanded_numpy(rng, dims, tokens, position, window, heads):
    operands = make(rng, **dims, tokens=tokens, heads=heads)
    layer, scale = int(rng.integers(3)), 0.07
    with jax.default_matmul_precision("highest"):  # on a GPU XLA's f32 matmuls otherwise round to TF32
        out = unfused(operands, position, layer, scale, window)
    ref = numpy_mla(*operands, position, layer, scale, window)
    np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-4 * np.abs(ref).max())


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_auto_is_the_unfused_path(rng, dtype):
    """"auto" never takes the kernel (it measured slower, see the module): on a GPU with DeepSeek's
    bf16 shapes too, it gives the unfused path's values bit for bit."""
    operands = make(rng, **V2, batch=2, max_len=64, dtype=dtype)
    f = lambda kernel: np.asarray(mla_decode_attention(*operands, 50, scale=0.07, layer=1, kernel=kernel))
    np.testing.assert_array_equal(f("auto"), f("unfused"))


@pytest.mark.parametrize("bad,match", [
    (lambda o: (o[0][..., :1, :],) + o[1:], "q_pe .* must be"),
    (lambda o: o[:2] + (o[2][:, :1],) + o[3:], "w_kv .* must be"),
    (lambda o: o[:3] + (o[3][:, :1],) + o[4:], "ckv .* and kpe .* must be"),
    (lambda o: o[:4] + (o[4][..., :2],), "ckv .* and kpe .* must be"),
    (lambda o: (o[0][0],) + o[1:], "q_nope and q_pe must be"),
])
def test_bad_operands(rng, bad, match):
    with pytest.raises(ValueError, match=match):
        mla_decode_attention(*bad(make(rng, **ODD)), 3, scale=0.1)


def test_bad_layer_window_or_kernel(rng, monkeypatch):
    operands = make(rng, **ODD)
    with pytest.raises(ValueError, match="layer 3 is outside the stack of 3"):
        mla_decode_attention(*operands, 3, scale=0.1, layer=3)
    with pytest.raises(ValueError, match="window must be None or a positive"):
        mla_decode_attention(*operands, 3, scale=0.1, window=0)
    with pytest.raises(ValueError, match="kernel must be one of"):
        mla_decode_attention(*operands, 3, scale=0.1, kernel="flash")
    assert_bad_setting_refused(md, monkeypatch)


def test_kernel_refuses_what_it_cannot_run(rng):
    """Dims other than DeepSeek's, or f32: an error naming what the kernel takes (on any machine)."""
    with pytest.raises(ValueError, match="kernel='te_async' needs"):
        mla_decode_attention(*make(rng, **ODD, dtype=jnp.bfloat16), 3, scale=0.1, kernel="te_async")
    with pytest.raises(ValueError, match="kernel='te_async' needs"):
        mla_decode_attention(*make(rng, **V2, max_len=8), 3, scale=0.1, kernel="te_async")


# ---- the CUDA kernel ----

CASES = [  # (batch, tokens, heads, max_len, position, window, cluster, splits); 0: the kernel chooses
    (1, 1, 16, 4096, 4095, None, 0, 0),   # DeepSeek-V2-Lite at one token (split over several clusters)
    (1, 1, 16, 4096, 4095, None, 8, 0),
    (1, 1, 16, 4096, 4095, None, 16, 1),  # one cluster: its own merge and projection
    (1, 1, 16, 300, 299, None, 8, 3),     # keys that do not split evenly
    (2, 1, 16, 300, 150, None, 16, 0),
    (1, 3, 16, 100, 50, None, 0, 0),      # three tokens: each its own clusters and limit
    (3, 2, 20, 257, 200, 33, 0, 0),       # a partial second group of 4 heads, a window
    (3, 2, 20, 257, 200, 33, 8, 2),
    (1, 1, 128, 1024, 1000, None, 0, 0),  # DeepSeek-V2 / V3: 8 groups of 16 heads
    (1, 1, 128, 1024, 1000, None, 16, 1),
    (2, 1, 8, 64, 0, None, 0, 0),         # one key
    (2, 1, 8, 64, 0, None, 16, 8),        # one key: every split but the first sees none
    (4, 1, 16, 4096, 2047, 700, 16, 0),
]


def kernel(operands, position, layer, scale, window=None, cluster=0, splits=0):
    f = lambda qn, qp, w, c, k, p, l: md._kernel(qn, qp, w, c, k, p, l, scale=scale, window=window, cluster=cluster,
                                                 splits=splits)
    return np.asarray(jax.jit(f)(*operands, jnp.int32(position), jnp.int32(layer)), np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-T{}-H{}-N{}-p{}-w{}-c{}-s{}".format(*c))
def test_kernel_matches_numpy(rng, case):
    batch, tokens, heads, max_len, position, window, cluster, splits = case
    operands = make(rng, **V2, batch=batch, tokens=tokens, heads=heads, max_len=max_len, dtype=jnp.bfloat16)
    layer, scale = int(rng.integers(3)), 0.07
    ref = numpy_mla(*operands, position, layer, scale, window)
    out = kernel(operands, position, layer, scale, window, cluster, splits)
    xla = unfused(operands, position, layer, scale, window)
    assert not np.isnan(out).any()
    # bf16 latent query, probabilities, latent output and output, as the unfused path rounds them
    assert rel_max(out, ref) < max(2 * rel_max(xla, ref), 8e-3), (rel_max(out, ref), rel_max(xla, ref))
    np.testing.assert_array_equal(out, kernel(operands, position, layer, scale, window, cluster, splits))  # deterministic


@pytest.mark.gpu
def test_kernel_reads_a_traced_layer_in_a_scan(rng):
    """The decoder's use: inside lax.scan, the stacked cache read in place at the loop's layer."""
    operands = make(rng, **V2, batch=1, max_len=512, layers=5, dtype=jnp.bfloat16)

    def over_layers(*ops):
        def body(carry, layer):
            return carry, mla_decode_attention(*ops, 300, scale=0.07, layer=layer, kernel="te_async")
        return jax.lax.scan(body, 0, jnp.arange(5, dtype=jnp.int32))[1]

    out = np.asarray(jax.jit(over_layers)(*operands), np.float64)
    for layer in range(5):
        assert rel_max(out[layer], numpy_mla(*operands, 300, layer, 0.07, None)) < 8e-3, layer


@pytest.mark.gpu
def test_kernel_without_a_visible_key_gives_nan(rng):
    operands = make(rng, **V2, batch=1, dtype=jnp.bfloat16)
    assert np.isnan(kernel(operands, -3, 0, 0.1)).all()
    assert np.isnan(kernel(operands, 3, 7, 0.1)).all()  # layer past the stack
    assert np.isnan(kernel(operands, -3, 0, 0.1, cluster=8, splits=4)).all()  # through MlaCombineKernel


@pytest.mark.gpu
def test_kernel_refuses_a_bad_cluster_size_or_split_count(rng):
    operands = make(rng, **V2, batch=1, dtype=jnp.bfloat16)
    with pytest.raises(Exception, match="cluster must be 0"):
        kernel(operands, 3, 0, 0.1, cluster=4)
    with pytest.raises(Exception, match="partial must be \\[1 to 8,"):
        kernel(operands, 3, 0, 0.1, splits=9)


@pytest.mark.gpu
def test_model_decodes_the_same_through_the_kernel(monkeypatch):
    """The DeepSeek-shaped model's decode steps at one sequence through the fused kernel against the
    unfused path, both with XLA's attention."""
    runs = {path: decode_logits(monkeypatch, 1, {md: path, da: "xla"}) for path in ("unfused", "te_async")}
    assert not np.isnan(runs["te_async"]).any()
    assert rel_max(runs["te_async"], runs["unfused"]) < 3e-2
