"""Mechanism (iv): launch-queue back-pressure.

Why it might fit the seed: a CUDA stream accepts on the order of a thousand
pending launches; past that, the launching call itself blocks until the GPU
retires work.  If the host runs far ahead of a slow GPU phase, the first
launch that finds the queue full stalls the host thread.

Which range grows depends on where that launch is.  In TE 1.13 the bf16
forward launches nothing on the current stream before the GEMM range (the
GEMMs go to 4 side streams whose queues are short), so back-pressure would
show up *inside* nvte_multi_stream_cublas_gemm (its event record / wait on
the current stream) -- not the seed's signature.  With FP8, TE launches cast
kernels on the current stream before the GEMM call, and the stall moves
*before* the GEMM range -- the seed's signature.  Both are measured:

* ``probe``              -- a long sleep, then tiny launches timed one by one:
  the index of the first slow launch estimates the queue depth;
* ``baseline``           -- empty queue;
* ``full_bf16``          -- queue filled to just under its depth, no pre-GEMM kernels;
* ``full_fp8_like``      -- same, with one small kernel per expert before the GEMMs.
"""
import torch

import common as C

SLEEP_MS, PROBE_LAUNCHES = 200.0, 5000


def probe(sleep):
    buf = torch.zeros(1, device="cuda")
    for _ in range(10):  # first use of the kernel may load its module: not queue back-pressure
        buf.add_(1)
    torch.cuda.synchronize()
    sleep.sleep(SLEEP_MS)
    times = []
    for _ in range(PROBE_LAUNCHES):
        t = C.now_ms()
        buf.add_(1)
        times.append(C.now_ms() - t)
    torch.cuda.synchronize()
    slow = [i for i, t in enumerate(times) if t > 2.0 and i >= 50]
    return {"first_blocking_launch": slow[0] if slow else None,
            "max_launch_ms": round(max(times), 2),
            "median_launch_us": round(1e3 * sorted(times)[len(times) // 2], 2),
            "launches_over_2ms": len(slow)}


def main():
    sleep = C.SleepCalib()
    gl = C.GroupedLinear("fc2")
    m = C.even_splits()
    x = torch.randn(C.TOKENS, gl.k, device="cuda", dtype=torch.bfloat16)
    C.warmup(gl, x, m)
    gl.forward(x, m, pre_kernels=True)
    torch.cuda.synchronize()
    results = {}
    p = C.guarded(results, "probe", lambda: probe(sleep))
    depth = p.get("first_blocking_launch")
    buf = torch.zeros(1, device="cuda")

    def variant(fill, pre_kernels):
        recs = []
        for _ in range(3):
            torch.cuda.synchronize()
            if fill:
                sleep.sleep(SLEEP_MS)
                for _ in range(max(depth - 4, 0)):  # leave a few slots free
                    buf.add_(1)
            recs.append(gl.forward(x, m, pre_kernels=pre_kernels)[1])
            torch.cuda.synchronize()
        return C.summarize(C.finish(recs), {"filled_to": max(depth - 4, 0) if fill else 0})

    C.guarded(results, "baseline", lambda: variant(False, False))
    if depth:
        C.guarded(results, "full_bf16", lambda: variant(True, False))
        C.guarded(results, "full_fp8_like", lambda: variant(True, True))
    else:
        results["full_bf16"] = results["full_fp8_like"] = {"error": "no blocking launch found in probe"}
    rows = [{"variant": "probe", "extra": "first blocking launch #%s, max launch %s ms, median %s us" % (
        p.get("first_blocking_launch"), p.get("max_launch_ms"), p.get("median_launch_us"))}]
    for name in ("baseline", "full_bf16", "full_fp8_like"):
        r = results.get(name, {})
        rows.append(C.row(name, r, r.get("error", "queue filled to %s" % r.get("filled_to"))))
    C.write_result("iv_launchq", {"mechanism": "(iv) launch-queue back-pressure",
                                  "results": results, "rows": rows})


if __name__ == "__main__":
    main()
