"""te_async.sequence_attention.causal_attention, forward and gradients, against a float64 NumPy
reference written from the definition: XLA's path on every backend (float32), cuDNN's on the GPU
(bf16) with the models' head shapes (grouped-query 128-dim heads, MLA's 192-dim keys with 128-dim
values), sliding windows and sequence lengths that are not multiples of 8."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_bad_setting_refused, gpu_available
from te_async import sequence_attention
from te_async.sequence_attention import causal_attention

GQA = (8, 2, 128, 128)   # heads, kv heads, key dims, value dims
MLA = (4, 4, 192, 128)   # DeepSeek-V2's full-sequence shape: keys [nope | rope], narrower values
SMALL = (4, 1, 16, 8)


def reference(q, k, v, dout, scale, window):
    """(out, dq, dk, dv) in float64: softmax(q k^T scale, causal [, window]) v and the gradients of
    sum(out * dout)."""
    q, k, v, dout = (np.asarray(x, np.float64) for x in (q, k, v, dout))
    groups = q.shape[2] // k.shape[2]
    kh, vh = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    i, j = np.arange(q.shape[1])[:, None], np.arange(q.shape[1])[None, :]
    seen = (j <= i) & ((j > i - window) if window else True)
    s = np.where(seen, np.einsum("bihd,bjhd->bhij", q, kh) * scale, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = np.einsum("bhij,bjhd->bihd", p, vh)
    dp = np.einsum("bihd,bjhd->bhij", dout, vh)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * scale
    dq = np.einsum("bhij,bjhd->bihd", ds, kh)
    fold = lambda x: x.reshape(*x.shape[:2], k.shape[2], groups, x.shape[-1]).sum(3)  # query heads -> kv heads
    dk = fold(np.einsum("bhij,bihd->bjhd", ds, q))
    dv = fold(np.einsum("bhij,bihd->bjhd", p, dout))
    return out, dq, dk, dv


def check(shape, seq, window, dtype, kernel, tol, seed=0):
    heads, kv_heads, dk, dv = shape
    rng = np.random.default_rng(seed)
    x = lambda *s: jnp.asarray(rng.standard_normal(s), dtype)
    q, k, v, dout = x(2, seq, heads, dk), x(2, seq, kv_heads, dk), x(2, seq, kv_heads, dv), x(2, seq, heads, dv)
    scale = dk ** -0.5
    f = functools.partial(causal_attention, scale=scale, window=window, kernel=kernel)
    out, vjp = jax.vjp(jax.jit(f), q, k, v)
    got = (out,) + vjp(dout)
    assert [g.shape for g in got] == [dout.shape, q.shape, k.shape, v.shape]
    for name, g, want in zip(("out", "dq", "dk", "dv"), got, reference(q, k, v, dout, scale, window)):
        g = np.asarray(g, np.float64)
        assert np.isfinite(g).all(), name
        # Relative to the inputs' unit scale where the reference is smaller: at S=1 dq is exactly 0.
        err = np.abs(g - want).max() / max(np.abs(want).max(), 1.0)
        assert err < tol, f"{name}: relative error {err:.2e} (tolerance {tol})"


@pytest.mark.parametrize("shape", [SMALL, GQA, MLA])
@pytest.mark.parametrize("seq, window", [(37, None), (64, None), (45, 9)])
def test_xla_path_against_float64(shape, seq, window):
    with jax.default_matmul_precision("highest"):  # a GPU's default float32 dot is TF32
        check(shape, seq, window, jnp.float32, "xla", 1e-4)


@pytest.mark.skipif(not gpu_available(), reason="cuDNN attention needs a GPU")
@pytest.mark.parametrize("shape", [GQA, MLA])
@pytest.mark.parametrize("seq, window", [(37, None), (256, None), (200, 33), (45, 9), (1, None)])
def test_cudnn_against_float64(shape, seq, window):
    check(shape, seq, window, jnp.bfloat16, "cudnn", 2e-2, seed=seq)


@pytest.mark.skipif(not gpu_available(), reason="cuDNN attention needs a GPU")
def test_auto_runs_cudnn_on_the_gpu():
    """auto lowers to cuDNN's fused attention (a custom call) for bf16, not to XLA's softmax."""
    q = jnp.zeros((1, 64, 8, 128), jnp.bfloat16)
    hlo = jax.jit(lambda q: causal_attention(q, q[:, :, :2], q[:, :, :2], 0.1, kernel="auto")).lower(q).as_text()
    assert "cudnn" in hlo.lower()
    q32 = q.astype(jnp.float32)  # float32 stays on XLA's path
    assert "cudnn" not in jax.jit(lambda q: causal_attention(q, q, q, 0.1)).lower(q32).as_text().lower()


@pytest.mark.parametrize("flags, wanted", [("", False), ("--xla_gpu_deterministic_ops", True),
                                           ("--a=1 --xla_gpu_deterministic_ops=true --b", True),
                                           ("--xla_gpu_deterministic_ops=1", True),
                                           ("--xla_gpu_deterministic_ops=false", False),
                                           ("--xla_gpu_deterministic_ops_extra=true", False)])
def test_deterministic_flag_is_read(monkeypatch, flags, wanted):
    monkeypatch.setenv("XLA_FLAGS", flags)
    sequence_attention.deterministic_ops_requested.cache_clear()
    try:
        assert sequence_attention.deterministic_ops_requested() is wanted
    finally:
        sequence_attention.deterministic_ops_requested.cache_clear()


@pytest.mark.skipif(not gpu_available(), reason="cuDNN attention needs a GPU")
def test_auto_is_xla_under_deterministic_ops(monkeypatch):
    """With --xla_gpu_deterministic_ops XLA failed to compile cuDNN's attention: auto keeps off it."""
    monkeypatch.setattr(sequence_attention, "deterministic_ops_requested", lambda: True)
    q = jnp.zeros((1, 64, 8, 128), jnp.bfloat16)
    hlo = jax.jit(lambda q: causal_attention(q, q[:, :, :2], q[:, :, :2], 0.1, kernel="auto")).lower(q).as_text()
    assert "cudnn" not in hlo.lower()


def test_auto_is_xla_where_cudnn_cannot_run():
    rng = np.random.default_rng(1)
    q, k = (jnp.asarray(rng.standard_normal((1, 20, 4, 16)), jnp.float32) for _ in range(2))
    auto = causal_attention(q, k, k, 0.25, 5, kernel="auto")
    np.testing.assert_array_equal(auto, causal_attention(q, k, k, 0.25, 5, kernel="xla"))


def test_bad_kernel_names_the_choices():
    q = jnp.zeros((1, 4, 2, 8), jnp.float32)
    with pytest.raises(ValueError, match="one of"):
        causal_attention(q, q, q, 1.0, kernel="flash")
    with pytest.raises(ValueError, match="kernel='cudnn' needs"):  # float32 on any backend
        causal_attention(q, q, q, 1.0, kernel="cudnn")


@pytest.mark.parametrize("k_shape, v_shape", [((1, 5, 2, 8), (1, 4, 2, 8)),   # values of another length
                                              ((1, 4, 3, 8), (1, 4, 3, 8)),   # 4 heads on 3 kv heads
                                              ((1, 4, 2, 8), (1, 4, 2, 16)),  # values wider than keys
                                              ((1, 4, 2, 4), (1, 4, 2, 4)),   # keys narrower than queries
                                              ((4, 2, 8), (4, 2, 8))])        # no batch axis
def test_wrong_shapes_are_refused(k_shape, v_shape):
    q = jnp.zeros((1, 4, 4, 8), jnp.float32)
    with pytest.raises(ValueError, match="expected q"):
        causal_attention(q, jnp.zeros(k_shape), jnp.zeros(v_shape), 1.0)


@pytest.mark.parametrize("window", [0, -3, 2.5])
def test_bad_window_is_refused(window):
    q = jnp.zeros((1, 4, 2, 8), jnp.float32)
    with pytest.raises(ValueError, match="window must be None or a positive"):
        causal_attention(q, q, q, 1.0, window)


def test_setting_is_checked(monkeypatch):
    assert_bad_setting_refused(sequence_attention, monkeypatch)
