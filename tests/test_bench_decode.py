"""The decode benchmark end to end through the CLI, on the tiny preset (CPU, float32)."""

import json

import jax
import pytest

from te_async.bench import __main__ as cli
from te_async.bench import decode

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
    assert {(r["mode"], r["batch"]) for r in rows} == {(m, b) for m in decode.MODES for b in (1, 4)}
    for r in rows:
        assert tuple(r) == decode.RESULT_KEYS
        assert r["error"] is None, r
        assert r["median_ms"] > 0 and r["floor_ms"] > 0 and r["ratio_to_floor"] > 0
        assert 1 <= r["active_experts"] <= 8
        if r["batch"] == 4:  # --detail-batch 8 falls on the nearest batch run
            assert r["rel_error_vs_sync"] < tol, r
        else:
            assert r["rel_error_vs_sync"] is None
        assert r["busy_us"] is None  # not profiled
        assert (r["nohost_reads_bytes"] is not None) == (r["mode"] == "nohost")
    assert (tmp_path / "decode.md").read_text().startswith("| T | floor ms |")
    assert not (tmp_path / "decode_latency.png").exists()


def test_decode_plots_and_profile_plumbing(tmp_path, monkeypatch):
    """CPU traces have no GPU events, so a fake GPU trace stands in to check the bubble fields
    and the timeline reach the JSON and the plots."""
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(decode.trace, "load_events", fake_gpu_trace("decode_step", 3))
    result = run_cli(tmp_path, "--batches", "2", "--plots", "--profile", "--modes", "sync", "nohost")
    for r in result["results"]:
        assert (r["busy_us"], r["idle_us"], r["n_kernels"]) == (50, 20, 2), r
        assert r["idle_fraction"] == pytest.approx(20 / 70)
    assert (tmp_path / "decode_latency.png").stat().st_size > 0
    assert (tmp_path / "decode_timeline_T2.png").stat().st_size > 0
    assert set(json.loads((tmp_path / "decode_timeline_T2.json").read_text())) == {"sync", "nohost"}
    assert "29% idle" in (tmp_path / "decode.md").read_text()
