"""Baseline: is a per-expert GEMM loop host-bound on Hopper?

The seed's H800 micro-benchmark gives fc1 and fc2 almost the same time
(1.12 / 1.06 ms) although fc1 has twice the FLOPs; 64 GEMMs in ~1.1 ms is
~17 us per GEMM, which is also the seed's normal ``nvte_multi_stream_cublas_gemm``
range (1.0-1.1 ms).  That points to the host issue rate, not the tensor cores.
This script measures the same loop two ways on this GPU:

* ``idle_start`` -- GPU idle when the module starts (the seed's benchmark): the
  GEMM events then include any gap where the GPU waits for the next launch;
* ``queued``     -- a GPU sleep is queued first, so every launch is in the queue
  before the GPU reaches it: the events measure GEMM execution alone.

If idle_start is much slower than queued, the loop is host-bound.  For scale
it also times one dense GEMM with the same FLOPs and, where this PyTorch has
it, ``torch._grouped_mm`` (one CUTLASS grouped kernel for all experts).
"""
import statistics

import torch

import common as C

REPS = 20


def flops(n, k, rows=C.TOKENS):
    return 2.0 * rows * n * k


def time_events(fn, reps=REPS, pre=None):
    ms = []
    for _ in range(reps):
        torch.cuda.synchronize()
        if pre:
            pre()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


def measure(which, sleep):
    gl = C.GroupedLinear(which)
    m = C.even_splits()
    x = torch.randn(C.TOKENS, gl.k, device="cuda", dtype=torch.bfloat16)
    C.warmup(gl, x, m)
    tf = lambda ms: round(flops(gl.n, gl.k) / (ms * 1e-3) / 1e12, 1)
    res = {}

    recs = []
    for _ in range(REPS):  # idle start, like the seed's benchmark
        torch.cuda.synchronize()
        recs.append(gl.forward(x, m)[1])
        torch.cuda.synchronize()
    s = C.summarize(C.finish(recs))
    res["idle_start"] = dict(s, tflops=tf(s["gemm_gpu_ms_median"]),
                             host_us_per_gemm=round(1e3 * s["gemm_launch_ms_median"] / len(m), 2))

    recs = []
    for _ in range(REPS):  # launches queued behind a sleep: GPU time only
        torch.cuda.synchronize()
        sleep.sleep(5)
        recs.append(gl.forward(x, m)[1])
        torch.cuda.synchronize()
    s = C.summarize(C.finish(recs))
    res["queued"] = dict(s, tflops=tf(s["gemm_gpu_ms_median"]))

    a = torch.randn(C.TOKENS, gl.k, device="cuda", dtype=torch.bfloat16)
    wt = gl.w[0].t().contiguous()
    ms = time_events(lambda: torch.mm(a, wt))
    res["dense_same_flops"] = {"ms": round(ms, 3), "tflops": tf(ms)}

    def grouped_mm():
        offs = torch.cumsum(torch.tensor(m, device="cuda"), 0).to(torch.int32)
        b = gl.w.transpose(1, 2)  # [E, K, N], K-major per expert
        return lambda: torch._grouped_mm(x, b, offs=offs)
    try:
        fn = grouped_mm()
        fn()
        ms = time_events(fn)
        res["torch_grouped_mm"] = {"ms": round(ms, 3), "tflops": tf(ms)}
    except Exception as e:
        res["torch_grouped_mm"] = {"error": repr(e)[:300]}
    return res


def main():
    sleep = C.SleepCalib()
    results = {}
    for which in ("fc1", "fc2"):
        C.guarded(results, which, lambda w=which: measure(w, sleep))
    rows = []
    for which, r in results.items():
        if "error" in r:
            rows.append({"variant": which, "extra": "error: " + r["error"][:120]})
            continue
        for v in ("idle_start", "queued"):
            extra = "%s TFLOP/s" % r[v]["tflops"]
            if v == "idle_start":
                extra += ", host %s us/GEMM" % r[v]["host_us_per_gemm"]
            rows.append(C.row("%s %s" % (which, v), r[v], extra))
        g = r.get("torch_grouped_mm", {})
        rows.append({"variant": which + " dense / _grouped_mm",
                     "extra": "dense %s TFLOP/s; _grouped_mm %s" % (
                         r["dense_same_flops"]["tflops"], g.get("tflops", g.get("error", "n/a")))})
    C.write_result("baseline", {"mechanism": "baseline: host-bound per-expert loop",
                                "results": results, "rows": rows})


if __name__ == "__main__":
    main()
