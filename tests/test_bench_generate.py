"""The generate benchmark end to end through the CLI at a tiny size (float32): every mode's greedy
tokens and logits agree with the reference mode's, the floor is decode_bytes over the measured
bandwidth, the table has every mode and batch, the cache holds the prompt then random entries of
its scale, and the profiled fields reach the JSON and the plots (from a fake GPU trace on a CPU)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import te_async.models as models
from te_async.bench import __main__ as cli
from te_async.bench import generate, presets

from helpers import fake_gpu_trace

# PROMPT 12: after 16 prompt tokens the tiny model's random weights (drawn since wkv_b is kept [out, in]) emit one
# token over and over in row 0, which would leave the check that all modes emit the same tokens nothing to compare.
BATCHES, CONTEXT, PROMPT, STEPS, CHECK = (1, 3), 40, 12, 3, 3
CPU = jax.default_backend() == "cpu"


def run_cli(out, *extra):
    argv = ["generate", "--preset", "tiny", "--dtype", "float32", "--context", str(CONTEXT), "--prompt", str(PROMPT),
            "--steps", str(STEPS), "--check-tokens", str(CHECK), "--out", str(out), *extra]
    with jax.default_matmul_precision("highest"):  # no TF32 on a GPU
        cli.main(argv)
    return json.loads((out / "generate.json").read_text())


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("generate")
    return run_cli(out, "--batches", *map(str, BATCHES), "--no-plots", "--no-profile"), out


def test_every_mode_decodes_the_reference_tokens(result):
    rows = result[0]["results"]
    assert {(r["mode"], r["batch"]) for r in rows} == {(m, b) for m in generate.MODES for b in BATCHES}
    for r in rows:
        assert tuple(r) == generate.RESULT_KEYS and r["error"] is None, r
        assert r["reference_mode"] == "sync"
        assert r["tokens_agree"] == 1.0, r
        assert r["logits_rel_error"] < (1e-5 if CPU else 1e-3) and r["disagree_margin"] is None, r
        assert len(r["greedy_tokens"]) == CHECK
    for b in BATCHES:  # the same greedy tokens in every mode, and not one token repeated
        tokens = {tuple(r["greedy_tokens"]) for r in rows if r["batch"] == b}
        assert len(tokens) == 1 and len(set(tokens.pop())) > 1


def test_timing_fields(result):
    for r in result[0]["results"]:
        assert r["steps"] == STEPS and 0 < r["min_ms"] <= r["p50_ms"] <= r["p99_ms"]
        assert r["tokens_per_s"] == pytest.approx(1e3 * r["batch"] / r["p50_ms"])
        assert r["generate_loop_ms"] > 0  # models.generate's loop, back to back
        assert r["generate_loop_tokens_per_s"] == pytest.approx(1e3 * r["batch"] / r["generate_loop_ms"])
        assert r["ratio_to_floor"] == pytest.approx(r["p50_ms"] / r["floor_ms"])
        assert r["busy_us"] is None and r["idle_fraction"] is None  # not profiled
    config = result[0]["config"]
    assert config["first_decode_position"] == CONTEXT - CHECK - STEPS - generate.PROFILED_STEPS
    assert result[0]["environment"]["backend"] == jax.default_backend()


def test_floor_is_decode_bytes_over_the_bandwidth(result):
    """The floor counts each MoE layer's distinct experts in the timed steps' routing."""
    data = result[0]
    config = presets.config("tiny")
    assert data["config"]["model"]["num_experts"] == config.num_experts
    assert data["config"]["active_experts_source"].startswith("counted from the routing")
    e, k = config.num_experts, config.num_experts_per_tok
    moe_layers = sum(map(config.is_moe_layer, range(config.num_hidden_layers)))
    at = lambda b, a: 1e3 * models.decode_bytes(config, b, CONTEXT, a, dtype=jnp.float32) / data["hbm_bytes_per_s"]
    for r in data["results"]:
        b, per_layer = r["batch"], r["active_experts_per_layer"]
        assert len(per_layer) == moe_layers and r["active_experts"] == pytest.approx(np.mean(per_layer))
        assert all(k <= a <= min(e, b * k) for a in per_layer), r
        lo, hi = [math.floor(a) for a in per_layer], [math.ceil(a) for a in per_layer]
        if b == 1:  # one token picks k distinct experts: exactly k, no interpolation
            assert per_layer == [k] * moe_layers and r["floor_ms"] == pytest.approx(at(b, k), rel=1e-12)
        else:
            assert at(b, lo) <= r["floor_ms"] <= at(b, hi)
            frac = sum(a - f for a, f in zip(per_layer, lo))
            one_more = at(b, [lo[0] + 1] + lo[1:]) - at(b, lo)  # one more expert in one layer
            assert r["floor_ms"] == pytest.approx(at(b, lo) + frac * one_more, rel=1e-12)


def test_active_experts_are_counted_from_the_routing():
    routing = [np.array([[[0, 1], [1, 2]], [[3, 3], [3, 3]]]), np.array([[[0, 1], [0, 1]], [[4, 5], [6, 7]]])]
    assert generate.count_active_experts(routing) == [2.5, 2.5]
    assert generate.count_active_experts([]) == []


def test_table_has_every_mode_and_batch(result):
    table = (result[1] / "generate.md").read_text().splitlines()
    assert table[0] == "| B | floor ms | " + " | ".join(generate.MODES) + " |"
    rows = [line for line in table[2:] if line.startswith("| ")]
    assert [int(line.split("|")[1]) for line in rows] == list(BATCHES)
    for line in rows:
        cells = [c.strip() for c in line.split("|")[3:-1]]
        assert len(cells) == len(generate.MODES) and all("tok/s" in c and "generate's loop" in c for c in cells), line


def test_cache_holds_the_prompt_then_random_entries_of_its_scale(result):
    """(After `result`, whose shapes these are: prefill and the fill are compiled.)"""
    batch, context = BATCHES[-1], CONTEXT
    with jax.default_matmul_precision("highest"):  # as run_cli: the same compiled functions
        params, config = generate.load_model("tiny", dtype=jnp.float32)
        cache, logits = generate.filled_cache(params, config, batch, context, PROMPT, seed=5)
        again, _ = generate.filled_cache(params, config, batch, context, PROMPT, seed=5)
        prompt = np.random.default_rng(5).integers(0, config.vocab_size, (batch, PROMPT), dtype=np.int32)
        empty = models.init_cache(config, batch, context, jnp.float32)
        plain_logits, plain = models.prefill(params, config, empty, prompt)
    np.testing.assert_array_equal(logits, plain_logits)
    per_layer = lambda c: models.per_layer(jax.device_get(c))
    for layer, layer_again, layer_plain in zip(per_layer(cache), per_layer(again), per_layer(plain)):
        for name, a in layer.items():
            a = np.asarray(a)
            np.testing.assert_array_equal(a, layer_again[name])  # the same seed, the same cache
            np.testing.assert_array_equal(a[:, :PROMPT], layer_plain[name][:, :PROMPT])
            assert not np.asarray(layer_plain[name][:, PROMPT:]).any()  # a plain prefill leaves zeros there
            real, drawn = a[:, :PROMPT], a[:, PROMPT:]
            assert np.all(drawn.std(axis=(0, 1)) > 0)
            ratio = np.sqrt(np.mean(drawn**2) / np.mean(real**2))
            assert 0.8 < ratio < 1.25, (name, ratio)


def test_profile_plumbing_and_plots(tmp_path, monkeypatch, result):
    """CPU traces have no GPU events, so a fake GPU trace stands in to check that the idle fields
    and the timeline reach the JSON, the table and the plots. (After `result`: its steps are compiled.)"""
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(generate.trace, "load_events", fake_gpu_trace(generate.ANNOTATION, generate.PROFILED_STEPS))
    data = run_cli(tmp_path, "--batches", "1", "--modes", "sync", "ragged_dot", "--profile", "--plots")
    for r in data["results"]:
        assert (r["busy_us"], r["idle_us"], r["n_kernels"]) == (50, 20, 2), r
        assert r["idle_fraction"] == pytest.approx(20 / 70)
    assert (tmp_path / "generate_latency.png").stat().st_size > 0
    assert (tmp_path / "generate_timeline_B1.png").stat().st_size > 0
    assert set(json.loads((tmp_path / "generate_timeline_B1.json").read_text())) == {"sync", "ragged_dot"}
    assert "29% idle" in (tmp_path / "generate.md").read_text()


def test_context_too_short_for_the_steps_is_refused(tmp_path):
    with pytest.raises(ValueError, match="must hold the prompt"):
        run_cli(tmp_path, "--batches", "1", "--context", "20", "--no-plots", "--no-profile")


def test_bench_presets_come_from_the_model_presets():
    for name in models.PUBLISHED:
        config = models.preset(name)
        model = presets.PRESETS[name]
        assert (model.experts, model.hidden, model.ffn, model.top_k) == (
            config.num_experts, config.hidden_size, config.moe_intermediate_size, config.num_experts_per_tok)
        assert model.layers == sum(map(config.is_moe_layer, range(config.num_hidden_layers)))
    assert presets.PRESETS["deepseek-v2-lite"] == presets.Model(64, 2048, 1408, 6, 26)
    assert presets.PRESETS["tiny"] == presets.Model.of(presets.config("tiny")) == presets.Model(8, 64, 96, 2, 2)
