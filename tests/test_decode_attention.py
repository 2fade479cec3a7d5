"""te_async.decode_attention: the plain-JAX path against a float64 NumPy reference (every backend),
and the CUDA kernel against the same reference on the GPU, with the real head shapes (DeepSeek-V2's
MLA, 128-dim grouped-query heads), a traced layer index into a stacked cache, positions at both
ends of the cache, sliding windows, a batch of 64; then a bf16 DeepSeek-shaped model decoding
through the kernel against the same model through XLA's attention."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_bad_setting_refused
import te_async.models as models
from te_async import _ffi
from te_async import decode_attention as da
from te_async import mla_decode as md
from te_async import plan
from te_async.decode_attention import decode_attention

MLA = dict(heads=16, kv_heads=1, dk=512, dr=64, dv=None)  # DeepSeek-V2(-Lite): latent 512, rope key 64
GQA = dict(heads=32, kv_heads=4, dk=128, dr=0, dv=128)    # Qwen3-30B-A3B
MIXTRAL = dict(heads=32, kv_heads=8, dk=128, dr=0, dv=128)


def numpy_attention(q, keys, values, position, layer, q_rope, key_rope, scale, window):
    """float64, one head at a time, straight from the definition."""
    f64 = lambda x: None if x is None else np.asarray(x, np.float64)
    q, keys, values, q_rope, key_rope = map(f64, (q, keys, values, q_rope, key_rope))
    k = keys[layer]
    v = k if values is None else values[layer]
    b, t, h, _ = q.shape
    n, hkv = k.shape[1], k.shape[2]
    out = np.zeros((b, t, h, v.shape[-1]))
    j = np.arange(n)
    for head in range(h):
        kv = head // (h // hkv)
        s = np.einsum("btd,bnd->btn", q[:, :, head], k[:, :, kv])
        if q_rope is not None:
            s += np.einsum("btd,bnd->btn", q_rope[:, :, head], key_rope[layer][:, :, kv])
        for i in range(t):
            seen = (j <= position + i) & ((j > position + i - window) if window else True)
            si = np.where(seen, s[:, i] * scale, -np.inf)
            with np.errstate(invalid="ignore"):
                p = np.exp(si - si.max(-1, keepdims=True))
                out[:, i, head] = np.einsum("bn,bnd->bd", p / p.sum(-1, keepdims=True), v[:, :, kv])
    return out


def make(rng, heads, kv_heads, dk, dr, dv, batch=2, tokens=1, max_len=70, layers=3, dtype=jnp.float32):
    """Random operands of one call: (q, keys, values, q_rope, key_rope)."""
    x = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)
    q, keys = x(batch, tokens, heads, dk), x(layers, batch, max_len, kv_heads, dk)
    values = None if dv is None else x(layers, batch, max_len, kv_heads, dv)
    if dr:
        return q, keys, values, x(batch, tokens, heads, dr), x(layers, batch, max_len, kv_heads, dr)
    return q, keys, values, None, None


def call(operands, position, layer, scale, window=None, kernel="xla", jit=True):
    q, keys, values, q_rope, key_rope = operands
    f = lambda q, k, v, qr, kr, p, l: decode_attention(q, k, v, p, scale=scale, layer=l, q_rope=qr, key_rope=kr,
                                                       window=window, kernel=kernel)
    return np.asarray((jax.jit(f) if jit else f)(q, keys, values, q_rope, key_rope, position, layer), np.float64)


def rel_max(out, ref) -> float:
    return float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("shape", [MLA, GQA, dict(heads=6, kv_heads=3, dk=20, dr=4, dv=12)], ids=["mla", "gqa", "odd"])
@pytest.mark.parametrize("tokens,position,window", [(1, 0, None), (1, 69, None), (2, 40, None), (3, 30, 7)])
def test_reference_matches_numpy(rng, shape, tokens, position, window):
    operands = make(rng, **shape, tokens=tokens)
    layer = int(rng.integers(3))
    ref = numpy_attention(*operands[:3], position, layer, *operands[3:], 0.07, window)
    with jax.default_matmul_precision("float32"):  # a GPU's default f32 dot is TF32
        out = call(operands, position, layer, 0.07, window)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_no_visible_key_gives_nan(rng):
    out = call(make(rng, **MIXTRAL), -1, 0, 0.1)
    assert np.isnan(out).all()


@pytest.mark.parametrize("bad,match", [
    (lambda o: (o[0][0], *o[1:]), "q must be"),
    (lambda o: (o[0], o[1][:, :1], *o[2:]), "do not fit"),
    (lambda o: (o[0], o[1], o[2][:, :, :5], *o[3:]), "values must be"),
    (lambda o: (*o[:3], o[3], None), "come together"),
    (lambda o: (*o[:3], o[3][..., :1, :], o[4]), "q_rope must be"),
])
def test_bad_operands(rng, bad, match):
    operands = bad(make(rng, heads=4, kv_heads=2, dk=8, dr=8, dv=8))
    with pytest.raises(ValueError, match=match):
        call(operands, 3, 0, 0.1, jit=False)


def test_bad_layer_or_window(rng):
    operands = make(rng, **GQA)
    with pytest.raises(ValueError, match="layer 3 is outside the stack of 3 layers"):
        call(operands, 3, 3, 0.1, jit=False)
    with pytest.raises(ValueError, match="window must be None or a positive"):
        call(operands, 3, 0, 0.1, window=0, jit=False)


def test_bad_kernel_names(rng, monkeypatch):
    with pytest.raises(ValueError, match="kernel must be one of"):
        call(make(rng, **GQA), 3, 0, 0.1, kernel="flash", jit=False)
    assert_bad_setting_refused(da, monkeypatch)


def test_kernel_refuses_what_it_cannot_run(rng):
    """f32 operands, or a head shape without a kernel: an error naming what the kernel takes."""
    with pytest.raises(ValueError, match="kernel='te_async' needs"):
        call(make(rng, **GQA), 3, 0, 0.1, kernel="te_async", jit=False)
    with pytest.raises(ValueError, match="kernel='te_async' needs"):
        call(make(rng, heads=4, kv_heads=2, dk=64, dr=0, dv=64, dtype=jnp.bfloat16), 3, 0, 0.1, kernel="te_async",
             jit=False)


@pytest.mark.parametrize("pairs,resident,max_len,splits", [
    (1, 2, 4096, 64),    # DeepSeek-V2-Lite's MLA at B=1: 64 keys a split (MIN_CHUNK)
    (8, 2, 4096, 32),    # B=8: 256 blocks of 128 keys
    (64, 2, 4096, 4),    # B=64: 256 blocks, one wave of 2 per SM; 5 splits (1.2 waves) before
    (64, 5, 4096, 5),    # a shape of which an SM holds 5 keeps about two blocks per SM
    (256, 5, 4096, 2),   # Qwen3-30B-A3B's 4 kv heads at B=64: 512 blocks, within one wave of 5
    (1000, 2, 4096, 1),  # more pairs than a wave: one split each
    (3, 2, 100, 2),      # short caches: whole tiles, no split without keys
    (1, 2, 70, 2),
])
def test_split_count(pairs, resident, max_len, splits):
    """The key splits on an H200 (132 SMs): about two blocks per SM, never past one wave of resident
    blocks, at least MIN_CHUNK keys a split, whole tiles."""
    got = da.split_count(pairs, max_len, 132, resident, 256)
    assert got == splits
    chunk = -(-(-(-max_len // got)) // da.KEY_TILE) * da.KEY_TILE  # the kernel's keys per split
    assert (got - 1) * chunk < max_len and pairs * got <= max(resident * 132, pairs)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,resident", [(MLA, 2), (GQA, 5)], ids=["mla", "gqa"])
def test_blocks_per_sm(shape, resident):
    """The occupancy query the splits are sized by, for the two head shapes (on an H200: MLA's 97 KB
    of shared memory per block give 2, the 128-dim heads' shared memory 5)."""
    if {cc for cc, _ in plan.local_gpu_kinds()} != {90}:
        pytest.skip("the figures are those of compute capability 9.0 (228 KB of shared memory per SM)")
    dims = (shape["dk"], shape["dr"], shape["dv"] or shape["dk"], shape["dv"] is None)
    assert da._blocks_per_sm(dims) == resident
    assert _ffi.cuda_module().decode_attention_blocks_per_sm(64, 0, 64, False) == 0  # no kernel for this shape
    assert _ffi.cuda_module().decode_attention_blocks_per_sm(448, 128, 448, True) == 0  # 576 score dims split otherwise


# ---- the CUDA kernel ----

CASES = [  # (shape, batch, tokens, max_len, position, window)
    (MLA, 1, 1, 4096, 4095, None),
    (MLA, 3, 1, 100, 0, None),
    (MLA, 2, 1, 257, 130, None),
    (MLA, 64, 1, 1024, 1000, None),
    (GQA, 2, 1, 300, 299, None),
    (GQA, 1, 2, 4096, 2047, None),   # 16 rows: 8 heads per kv head x 2 tokens
    (MIXTRAL, 5, 3, 200, 150, 33),   # Mixtral's sliding window, 12 rows
    (MIXTRAL, 8, 1, 64, 63, 4096),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{'mla' if c[0]['dv'] is None else 'gqa'}-B{c[1]}-T{c[2]}-N{c[3]}-p{c[4]}-w{c[5]}")
def test_kernel_matches_numpy(rng, case):
    shape, batch, tokens, max_len, position, window = case
    operands = make(rng, **shape, batch=batch, tokens=tokens, max_len=max_len, dtype=jnp.bfloat16)
    scale = 0.1
    layer = int(rng.integers(3))
    ref = numpy_attention(*operands[:3], position, layer, *operands[3:], scale, window)
    out = call(operands, position, layer, scale, window, kernel="te_async")
    xla = call(operands, position, layer, scale, window, kernel="xla")
    assert not np.isnan(out).any()
    # bf16 output (2^-9 relative) and bf16 probabilities, as XLA's path rounds them too
    assert rel_max(out, ref) < max(2 * rel_max(xla, ref), 8e-3), (rel_max(out, ref), rel_max(xla, ref))
    again = call(operands, position, layer, scale, window, kernel="te_async")
    np.testing.assert_array_equal(out, again)  # deterministic: fixed split order, no atomics


@pytest.mark.gpu
def test_kernel_reads_a_traced_layer_in_a_scan(rng):
    """The decoder's use: inside lax.scan, the stacked cache as a carry and the layer a loop index."""
    q, keys, _, q_rope, key_rope = make(rng, **MLA, batch=4, max_len=512, layers=5, dtype=jnp.bfloat16)

    def over_layers(q, keys, q_rope, key_rope, kernel):
        def body(carry, layer):
            out = decode_attention(q, keys, None, 300, scale=0.05, layer=layer, q_rope=q_rope, key_rope=key_rope,
                                   kernel=kernel)
            return carry, out
        return jax.lax.scan(body, 0, jnp.arange(5, dtype=jnp.int32))[1]

    out = np.asarray(jax.jit(over_layers, static_argnums=4)(q, keys, q_rope, key_rope, "te_async"), np.float64)
    for layer in range(5):
        ref = numpy_attention(q, keys, None, 300, layer, q_rope, key_rope, 0.05, None)
        assert rel_max(out[layer], ref) < 8e-3, layer


@pytest.mark.gpu
def test_kernel_without_a_visible_key_gives_nan(rng):
    operands = make(rng, **GQA, dtype=jnp.bfloat16)
    assert np.isnan(call(operands, -3, 0, 0.1, kernel="te_async")).all()
    assert np.isnan(call(operands, 3, 7, 0.1, kernel="te_async")).all()  # layer past the stack


DEEPSEEK_SHAPED = dict(  # DeepSeek-V2-Lite's attention shapes, everything else small
    model_type="deepseek_v2", vocab_size=300, hidden_size=256, intermediate_size=320, moe_intermediate_size=64,
    num_hidden_layers=3, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512, q_lora_rank=None,
    qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=8, n_shared_experts=1,
    num_experts_per_tok=2, first_k_dense_replace=1, norm_topk_prob=False, routed_scaling_factor=1.0,
    topk_method="greedy", n_group=1, topk_group=1, moe_layer_freq=1, rms_norm_eps=1e-6, rope_theta=10000.0,
    max_position_embeddings=4096, tie_word_embeddings=False)


def decode_logits(monkeypatch, batch: int, settings: dict, hf: dict = DEEPSEEK_SHAPED) -> np.ndarray:
    """Logits [steps, B, 1, V] of a bf16 model's decode steps (DeepSeek-shaped unless `hf` says
    otherwise; scanned layers, the stacked cache), teacher forced after a 12-token prefill, with
    the kernel settings `settings` ({module: value} of decode_attention / mla_decode's KERNEL_ENV)
    in force."""
    config = models.from_hf_dict(hf)
    params = models.init_params(config, jax.random.key(3), jnp.bfloat16)
    tokens = np.random.default_rng(5).integers(0, config.vocab_size, (batch, 20)).astype(np.int32)

    def reset():
        for module in settings:
            module.default_kernel.cache_clear()
        jax.clear_caches()

    try:
        for module, value in settings.items():
            monkeypatch.setenv(module.KERNEL_ENV, value)
        reset()
        cache = models.init_cache(config, batch, 64, jnp.bfloat16)
        _, cache = models.prefill(params, config, cache, tokens[:, :12], group_sizes_mode="device")
        steps = []
        for i in range(12, 20):
            logits, cache = models.decode_step(params, config, cache, jnp.asarray(tokens[:, i:i + 1]), i,
                                               group_sizes_mode="device")
            steps.append(np.asarray(logits, np.float64))
    finally:
        for module in settings:
            monkeypatch.delenv(module.KERNEL_ENV)
        reset()
    return np.stack(steps)


@pytest.mark.gpu
def test_model_decodes_the_same_through_the_kernel(monkeypatch):
    """The DeepSeek-shaped model's decode steps at B=2 with the kernel forced, against the same steps
    through XLA's attention (both through mla_decode's unfused path, which calls decode_attention)."""
    runs = {kernel: decode_logits(monkeypatch, 2, {md: "unfused", da: kernel}) for kernel in ("xla", "te_async")}
    assert not np.isnan(runs["te_async"]).any()
    assert rel_max(runs["te_async"], runs["xla"]) < 3e-2
