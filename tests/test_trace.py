"""Bubble meter on synthetic traces with known answers, plus one real CPU jax trace."""
import gzip
import importlib.util
import json
import os
import pathlib

import pytest

try:
    from te_async.bench import trace
except Exception:  # te_async/__init__.py missing or its compiled extension absent: load the file itself
    _path = pathlib.Path(__file__).resolve().parents[1] / "te_async" / "bench" / "trace.py"
    _spec = importlib.util.spec_from_file_location("te_async_bench_trace", _path)
    trace = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(trace)

GPU0, GPU1, HOST = 1, 2, 701


def meta(pid, name, tid=None):
    e = {"ph": "M", "pid": pid, "name": "process_name" if tid is None else "thread_name", "args": {"name": name}}
    return e if tid is None else dict(e, tid=tid)


def x(pid, tid, ts, dur, name, **args):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name, "args": args}


def base_events(cupti=True):
    """Two steps on GPU 0; expected figures are worked out in the tests."""
    ev = [meta(GPU0, "/device:GPU:0 (NVIDIA H200)"), meta(GPU1, "/device:GPU:1"), meta(HOST, "/host:CPU"),
          meta(GPU0, "Stream #7(Compute)", 7), meta(GPU0, "Stream #8(Compute)", 8),
          meta(GPU0, "Stream #13(MemcpyD2H)", 13), meta(GPU0, "XLA Ops", 90), meta(GPU0, "XLA Modules", 91),
          meta(GPU1, "Stream #7(Compute)", 7), meta(HOST, "python", 1), meta(HOST, "pjrt", 2),
          # host step annotations (StepTraceAnnotation writes name + step_num)
          x(HOST, 1, 0, 400, "step", step_num="0"), x(HOST, 1, 500, 400, "step", step_num="1"),
          x(HOST, 1, 10, 5, "cumsum_python_fn"),
          # step 0: streams 7 and 8 overlap -> [100, 150); gap 20; D2H [170, 175); gap 5; [180, 200)
          x(GPU0, 7, 100, 30, "gemm_a"), x(GPU0, 8, 120, 30, "gemm_b"),
          x(GPU0, 13, 170, 5, "MemcpyD2H", memcpy_details="kind_src:device kind_dst:pinned size:4"),
          x(GPU0, 7, 180, 20, "fusion_c"),
          # derived lines that would widen the window and double count
          x(GPU0, 90, 90, 120, "fusion_c"), x(GPU0, 91, 80, 700, "jit_step"),
          x(GPU1, 7, 300, 5, "other_device_kernel"),
          # step 1: [600, 640) with a nested kernel on stream 8; gap 60; one graph launch [700, 730); D2H [730, 732)
          x(GPU0, 7, 600, 40, "gemm_d"), x(GPU0, 8, 600, 10, "small_e"),
          x(GPU0, 7, 700, 20, "graph_k1", cuda_graph_id="5", correlation_id="9"),
          x(GPU0, 7, 720, 10, "graph_k2", cuda_graph_id="5", correlation_id="9"),
          x(GPU0, 13, 730, 2, "Memcpy DtoH (Device -> Pinned)")]
    if cupti:
        ev += [x(HOST, 2, 50, 3, "cuLaunchKernel"), x(HOST, 2, 210, 30, "cuStreamSynchronize"),
               x(HOST, 2, 690, 3, "cuGraphLaunch"), x(HOST, 2, 760, 10, "cuStreamSynchronize"),
               x(HOST, 2, 775, 10, "cudaEventSynchronize")]
    return ev


def write_trace(log_dir, events, run="2026_11_30_00_00_00", name="host.trace.json.gz", bare=False):
    d = pathlib.Path(log_dir) / "plugins" / "profile" / run
    d.mkdir(parents=True, exist_ok=True)
    with gzip.open(d / name, "wt") as f:
        json.dump(events if bare else {"displayTimeUnit": "ns", "traceEvents": events}, f)
    return str(d / name)


@pytest.fixture
def log_dir(tmp_path):
    write_trace(tmp_path, base_events())
    return str(tmp_path)


def test_union_merges_overlaps():
    assert trace.union([(5, 7), (0, 3), (2, 4), (4, 4.5), (10, 11)]) == [(0, 4.5), (5, 7), (10, 11)]


def test_steps_exact_figures(log_dir):
    r = trace.analyze_trace(log_dir, annotation="step")
    s0, s1 = r["steps"]
    assert (s0["start_us"], s0["end_us"]) == (100, 200)  # XLA Ops / XLA Modules lines ignored
    assert s0["busy_us"] == pytest.approx(75) and s0["idle_us"] == pytest.approx(25)
    assert s0["idle_fraction"] == pytest.approx(0.25)
    assert s0["gaps"] == [(150, 20), (175, 5)]
    assert (s0["n_kernels"], s0["n_memcpy_d2h"], s0["n_host_syncs"], s0["n_graph_launches"]) == (3, 1, 1, 0)
    assert (s1["start_us"], s1["end_us"]) == (600, 732)
    assert s1["busy_us"] == pytest.approx(72) and s1["idle_us"] == pytest.approx(60)
    assert s1["gaps"] == [(640, 60)]
    assert (s1["n_kernels"], s1["n_memcpy_d2h"], s1["n_host_syncs"], s1["n_graph_launches"]) == (4, 1, 2, 1)
    # median of two windows (100, 132) is the lower one: step 0
    summary = r["summary"]
    assert summary["step"] == 0 and not summary["no_gpu_events"]
    assert summary["busy_us"] == pytest.approx(75) and summary["idle_fraction"] == pytest.approx(0.25)
    assert summary["n_host_syncs"] == 1


def test_gap_threshold_and_whole_window(log_dir):
    r = trace.analyze_trace(log_dir, gap_threshold_us=10)  # no annotation: one window over the trace
    (s,) = r["steps"]
    assert (s["start_us"], s["end_us"]) == (100, 732)
    assert s["busy_us"] == pytest.approx(147) and s["idle_us"] == pytest.approx(485)
    assert s["gaps"] == [(150, 20), (200, 400), (640, 60)]
    assert (s["n_kernels"], s["counts"]["memcpy_d2h"], s["n_host_syncs"], s["n_graph_launches"]) == (7, 2, 3, 1)
    assert trace.analyze_trace(log_dir, annotation="no_such_step")["steps"][0]["end_us"] == 732


def test_device_selection(log_dir):
    s = trace.analyze_trace(log_dir, device=1)["summary"]
    assert (s["busy_us"], s["idle_us"], s["n_kernels"]) == (5, 0, 1)
    assert trace.analyze_trace(log_dir, device=2)["summary"]["no_gpu_events"]


def test_no_cupti_api_events(tmp_path):
    path = write_trace(tmp_path, base_events(cupti=False), bare=True)  # bare-list format too
    s = trace.analyze_trace(path, annotation="step")["steps"][0]
    assert s["n_host_syncs"] is None and s["n_graph_launches"] is None
    assert s["busy_us"] == pytest.approx(75)


def test_find_newest_trace(tmp_path):
    old = write_trace(tmp_path, [], run="2026_11_29_00_00_00")
    new = write_trace(tmp_path, base_events(), run="2026_11_30_00_00_00", name="perfetto_trace.json.gz")
    os.utime(old, (1, 1))
    assert trace.find_trace(str(tmp_path)) == new
    with pytest.raises(FileNotFoundError):
        trace.find_trace(str(tmp_path / "empty"))


def test_timeline_and_plot(log_dir, tmp_path):
    iv = trace.timeline_intervals(log_dir, window=(120, 200))
    assert iv == [("Stream #7(Compute)", 120, 10, "gemm_a"), ("Stream #8(Compute)", 120, 30, "gemm_b"),
                  ("Stream #13(MemcpyD2H)", 170, 5, "MemcpyD2H"), ("Stream #7(Compute)", 180, 20, "fusion_c")]
    assert len(trace.timeline_intervals(log_dir)) == 9
    out = trace.plot_timeline({"sync": iv, "async": trace.timeline_intervals(log_dir), "empty": []},
                              str(tmp_path / "t.png"))
    assert pathlib.Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kernel_table_and_files(tmp_path):
    """Names shortened and summed across layers; idle time charged to the kernel after each gap;
    the markdown and the files write_timeline leaves."""
    te = "void te_async::(anonymous namespace)::TokenFfnKernel<__nv_bfloat16>(te_async::(anonymous namespace)::Args)"
    iv = [("s", 0.0, 2.0, "input_reduce_fusion_3"), ("s", 2.0, 10.0, te), ("s", 15.0, 1.0, "loop_add_fusion"),
          ("s", 16.0, 2.0, "input_reduce_fusion_7"), ("s", 18.0, 9.0, te), ("s", 30.0, 1.0, "loop_add_fusion.1"),
          ("t", 16.5, 1.0, "memcpy32_post")]  # overlaps input_reduce_fusion_7 on another stream: no idle
    table = trace.kernel_table(iv)
    assert table == [("TokenFfnKernel", 2, 19.0, 0.0), ("loop_add_fusion", 2, 2.0, 6.0),
                     ("input_reduce_fusion", 2, 4.0, 0.0), ("memcpy32_post", 1, 1.0, 0.0)]
    md = trace.kernel_markdown({"device": iv}, top=2)
    assert "7 launches, 26.0 us of kernels, 6.0 us idle between them; no gap over 5 us" in md
    assert "| TokenFfnKernel | 2 | 19.0 | 73% | 0.0 |" in md
    assert "memcpy32_post" not in md
    trace.write_timeline({"device": iv}, tmp_path / "t", plots=False)
    assert json.loads((tmp_path / "t.json").read_text())["device"][1][3] == te
    assert (tmp_path / "t_kernels.md").read_text() == trace.kernel_markdown({"device": iv})
    assert not (tmp_path / "t.png").exists()


def test_long_gaps_line():
    """Gaps over LONG_GAP_US counted, summed and the longest named by the kernel after them."""
    iv = [("s", 0.0, 2.0, "a_1"), ("s", 10.0, 1.0, "b_1"), ("s", 11.5, 1.0, "c"), ("s", 40.0, 2.0, "a_2"),
          ("s", 42.0, 1.0, "b_2")]
    assert trace.long_gaps_line(iv) == "2 gaps over 5 us, 35.5 us in all; the longest: 27.5 before a, 8.0 before b"
    assert trace.long_gaps_line(iv, most=1).endswith("the longest: 27.5 before a")
    assert trace.long_gaps_line(iv[:1]) == "no gap over 5 us"
    assert trace.long_gaps_line(iv[:2]) == "1 gap over 5 us, 8.0 us in all; the longest: 8.0 before b"


def test_trip_table():
    """A step of a prologue, five trips of three launches (the second a programmatic dependent that
    starts before the first ends, one trip slower) and a tail: the trips found with their phase
    after the boundary's idle, medians from each trip's start; nothing repeated gives (0, [])."""
    split = ("void te_async::decode_attention_kernels::(anonymous namespace)::DecodeAttentionKernel<512, 64>"
             "(te_async::decode_attention_kernels::Args)")
    iv = [("s", 0.0, 3.0, "wrapped_iota"), ("s", 3.0, 1.0, "MemcpyD2D")]
    for t, slow in enumerate([0.0, 0.0, 4.0, 0.0, 0.0]):
        t0 = 10.0 + 30.0 * t  # 6 us idle before each trip's first launch
        iv += [("s", t0, 8.0 + slow, f"input_reduce_fusion_{t}"), ("s", t0 + 2.0, 12.0 + slow, split),
               ("s", t0 + 15.0 + slow, 5.0, "loop_add_fusion")]
    iv.append(("s", 200.0, 2.0, "copy_tail"))
    assert trace.kernel_name(split) == "DecodeAttentionKernel"
    trips, unit = trace.trip_table(iv)
    assert trips == 5
    assert unit == [("input_reduce_fusion", 0.0, 8.0), ("DecodeAttentionKernel", 2.0, 14.0),
                    ("loop_add_fusion", 15.0, 20.0)]
    assert trace.trip_table(iv, min_trips=6) == (0, [])
    assert trace.trip_table(iv[:2]) == (0, [])
    md = trace.kernel_markdown({"device": iv})
    assert "One trip (5 in a row, 3 launches each)" in md and "| DecodeAttentionKernel | 2.0 | 14.0 |" in md


def test_real_cpu_trace(tmp_path):
    jax = pytest.importorskip("jax")
    f = jax.jit(lambda a: a @ a)
    a = jax.device_put(jax.numpy.ones((32, 32)), jax.devices("cpu")[0])  # no GPU work, even on a GPU machine
    f(a).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        with jax.profiler.StepTraceAnnotation("step", step_num=0):
            f(a).block_until_ready()
    assert trace.find_trace(str(tmp_path)).endswith(".json.gz")
    r = trace.analyze_trace(str(tmp_path), annotation="step")
    assert r["summary"]["no_gpu_events"] and "no GPU events" in r["summary"]["note"]
    assert r["summary"]["busy_us"] == 0 and r["summary"]["n_kernels"] == 0
