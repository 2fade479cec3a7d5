"""The decode benchmark end to end through the CLI, on the tiny preset (CPU, float32)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from te_async.bench import __main__ as cli
from te_async.bench import decode, presets

from helpers import fake_gpu_trace


def run_cli(tmp_path, *extra):
    cli.main(["decode", "--preset", "tiny", "--reps", "3", "--out", str(tmp_path), *extra])
    return json.loads((tmp_path / "decode.json").read_text())


def test_decode_sweep_schema_and_agreement(tmp_path):
    result = run_cli(tmp_path, "--batches", "1", "4", "--no-plots", "--no-profile")
    tol = 1e-4 if jax.default_backend() == "cpu" else 5e-2  # float32 on the CPU, bf16 on a GPU
    assert result["benchmark"] == "decode" and result["hbm_bytes_per_s"] > 0
    assert isinstance(result["cmdbuf_during_profiling"], bool)
    rows = result["results"]
    modes = decode.default_modes(jax.default_backend() == "gpu")
    assert {(r["mode"], r["batch"]) for r in rows} == {(m, b) for m in modes for b in (1, 4)}
    for r in rows:
        assert tuple(r) == decode.RESULT_KEYS
        assert r["error"] is None, r
        assert r["median_ms"] > 0 and r["floor_ms"] > 0 and r["ratio_to_floor"] > 0 and r["loop_ms"] > 0
        assert 1 <= r["active_experts"] <= 8
        per_layer = r["active_experts_per_layer"]
        assert len(per_layer) == presets.resolve("tiny")[1].layers and all(1 <= n <= 8 for n in per_layer), r
        if r["batch"] == 4:  # --detail-batch 8 falls on the nearest batch run
            assert r["rel_error_vs_sync"] < tol, r
        else:
            assert r["rel_error_vs_sync"] is None
        assert r["busy_us"] is None  # not profiled
        assert (r["nohost_reads_bytes"] is not None) == (r["mode"] == "nohost")
        # --unroll auto: written out where te_async.models writes a decode step out (device mode up to T=64)
        assert r["written_out"] == (r["mode"] in ("device", "device_unfused", decode.TORCH)), r
    assert (tmp_path / "decode.md").read_text().startswith("| T | floor ms |")
    assert not (tmp_path / "decode_latency.png").exists()


def test_decode_plots_and_profile_plumbing(tmp_path, monkeypatch):
    """CPU traces have no GPU events, so a fake GPU trace stands in to check the bubble fields
    and the timeline reach the JSON and the plots."""
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(decode.trace, "load_events", fake_gpu_trace("decode_step", 3))
    result = run_cli(tmp_path, "--batches", "2", "--plots", "--profile", "--modes", "sync", "nohost",
                     "--unroll", "always")
    assert result["config"]["unroll"] == "always"
    for r in result["results"]:
        assert r["written_out"] is True, r
        assert (r["busy_us"], r["idle_us"], r["n_kernels"]) == (50, 20, 2), r
        assert r["idle_fraction"] == pytest.approx(20 / 70)
    assert (tmp_path / "decode_latency.png").stat().st_size > 0
    assert (tmp_path / "decode_timeline_T2.png").stat().st_size > 0
    assert set(json.loads((tmp_path / "decode_timeline_T2.json").read_text())) == {"sync", "nohost"}
    assert "29% idle, written out" in (tmp_path / "decode.md").read_text()


@pytest.mark.parametrize("mode", ["sync", "device", "nohost"])
def test_written_out_step_matches_the_scan(mode):
    """The same layers give the same step, scanned or written out (4 tokens, the tiny preset)."""
    _, model = presets.resolve("tiny")
    dtype = jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    params = decode.init_params(model, dtype, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, model.hidden), dtype)
    scanned, written = (np.asarray(decode.make_step(decode.MODES[mode], model, written_out=w)(params, x), np.float32)
                        for w in (False, True))
    assert np.all(np.isfinite(scanned)) and np.abs(scanned).max() > 0
    np.testing.assert_allclose(written, scanned, rtol=1e-5 if dtype == jnp.float32 else 2e-2, atol=1e-5)
