"""bench decode's PyTorch step (torch_reference.moe_decode_step) against a float64 reference, its
CUDA graph against its eager run, and the torch_graph mode end to end. Needs a GPU and torch with
CUDA (the GPU machine has both); skips elsewhere."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from helpers import gpu_available

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not (gpu_available() and torch.cuda.is_available()),
                                reason="needs a GPU and torch with CUDA")

from te_async.bench import __main__ as cli  # noqa: E402
from te_async.bench import decode, torch_reference  # noqa: E402

EXPERTS, HIDDEN, FFN, TOP_K, LAYERS, EPS = 8, 64, 96, 2, 2, 1e-6


def reference(x, layers):
    """The step in float64 numpy, token by token: softmax router, renormalised top-k, rmsnorm,
    swiglu expert MLP, weighted sum, residual."""
    x = np.asarray(x, np.float64)
    for router, w1, w2, scale in layers:
        logits = x @ router
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        y = np.zeros_like(x)
        for t in range(x.shape[0]):
            chosen = np.argsort(-probs[t], kind="stable")[:TOP_K]
            weights = probs[t, chosen] / probs[t, chosen].sum()
            xn = x[t] / np.sqrt(np.mean(x[t] ** 2) + EPS) * scale
            for e, w in zip(chosen, weights):
                gate, linear = np.split(xn @ w1[e], 2)
                y[t] += w * ((gate / (1 + np.exp(-gate)) * linear) @ w2[e])
        x = x + y
    return x


def layer_weights(rng, skewed: bool):
    """(router, w_fc1, w_fc2, norm_scale) per layer as float64, bf16-representable. skewed: expert 3's
    router column raised, so that with positive inputs nearly every token picks it (a group of about
    all the tokens beside small ones)."""
    bf16 = lambda a: np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64)
    layers = []
    for _ in range(LAYERS):
        router = bf16(rng.normal(size=(HIDDEN, EXPERTS)) / 8)
        if skewed:
            router[:, 3] = 0.08
        layers.append((router, bf16(rng.normal(size=(EXPERTS, HIDDEN, 2 * FFN)) / 8),
                       bf16(rng.normal(size=(EXPERTS, FFN, HIDDEN)) / 10), bf16(1 + rng.normal(size=HIDDEN) / 10)))
    return layers


def as_torch(layers):
    """moe_decode_step's layers: the router float32, the rest bf16 (the scale float32, as bench decode's)."""
    t = lambda a, dtype: torch.tensor(a, dtype=dtype, device="cuda")
    return [(t(r, torch.float32), t(w1, torch.bfloat16), t(w2, torch.bfloat16), t(s, torch.float32))
            for r, w1, w2, s in layers]


@pytest.mark.parametrize("tokens", [1, 5, 13, 64])
@pytest.mark.parametrize("skewed", [False, True])
def test_step_matches_float64_reference(tokens, skewed):
    rng = np.random.default_rng(tokens + 100 * skewed)
    layers = layer_weights(rng, skewed)
    x = rng.normal(size=(tokens, HIDDEN))
    if skewed:
        x = np.abs(x)
    x = np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64)
    step = torch_reference.moe_decode_step(as_torch(layers), TOP_K, EPS)
    out = torch_reference.to_numpy(step(torch.tensor(x, dtype=torch.bfloat16, device="cuda")))
    ref = reference(x, layers)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-2
    assert np.abs(out - ref).max() < 0.1 * np.abs(ref).max()


def test_graph_replays_the_eager_step_bit_for_bit():
    rng = np.random.default_rng(7)
    step = torch_reference.moe_decode_step(as_torch(layer_weights(rng, False)), TOP_K, EPS)
    xs = [torch.tensor(rng.normal(size=(13, HIDDEN)), dtype=torch.bfloat16, device="cuda") for _ in range(3)]
    call = torch_reference.graphed(step, xs[0])
    for x in xs[1:] + xs[:1]:  # inputs other than the captured one, then it again
        assert torch.equal(call(x), step(x))


def test_torch_graph_mode_in_bench_decode(tmp_path):
    cli.main(["decode", "--preset", "tiny", "--reps", "3", "--out", str(tmp_path), "--batches", "1", "8",
              "--modes", "sync", decode.TORCH, "--no-plots", "--no-profile"])
    rows = json.loads((tmp_path / "decode.json").read_text())["results"]
    torch_rows = [r for r in rows if r["mode"] == decode.TORCH]
    assert [r["batch"] for r in torch_rows] == [1, 8]
    for r in torch_rows:
        assert r["error"] is None, r
        assert r["median_ms"] > 0 and r["loop_ms"] > 0 and r["ratio_to_floor"] > 0 and r["written_out"] is True
        assert r["busy_us"] is None  # no profiled run for torch
    assert torch_rows[1]["rel_error_vs_sync"] < 5e-2  # --detail-batch 8: bf16 against the JAX sync step
