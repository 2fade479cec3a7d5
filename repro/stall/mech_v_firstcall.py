"""Mechanism (v): first-call work.

Why it is a candidate: the first forward on a set of streams pays one-time
costs -- cuBLAS handle and per-stream workspace creation, TE's 4 x 32 MiB
multi-stream workspace (get_multi_stream_cublas_workspace, allocated before
the GEMM call), and with CUDA_MODULE_LOADING=LAZY (opt-in since CUDA 11.7,
the default since 12.2; PyTorch also sets it when unset) loading each GEMM
kernel's module the first time it is used.
These costs land in the first call (or first call of a new shape/kernel), so
they cannot explain a 206 ms stall at t=3.67 s between normal calls at 1.41 s
and 2.58 s -- unless a new kernel is first needed there (e.g. a new cuBLAS
algorithm for an unusual m_split).  The script measures how large the costs
are and in which range they fall:

* ``new_streams`` -- in a warm process, a forward on 4 never-used streams;
* ``LAZY`` / ``EAGER`` -- fresh processes with CUDA_MODULE_LOADING set:
  CUDA init time, then first / second / third forward.
"""
import sys
import time

import torch

import common as C


def fresh_process():
    """Child: time CUDA init and the first forwards in this fresh process."""
    t = time.perf_counter()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    init_ms = (time.perf_counter() - t) * 1e3
    gl = C.GroupedLinear("fc1")
    m = C.even_splits()
    x = torch.randn(C.TOKENS, gl.k, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    calls = []
    for i in range(3):
        rec = gl.forward(x, m, te_workspace=True)[1]
        torch.cuda.synchronize()
        calls.append(C.finish([rec])[0])
    return {"module_loading": C.env_info()["CUDA_MODULE_LOADING"], "cuda_init_ms": round(init_ms, 1),
            "calls": [{k: round(v, 3) for k, v in c.items()} for c in calls]}


def new_streams():
    gl = C.GroupedLinear("fc2")
    m = C.even_splits()
    x = torch.randn(C.TOKENS, gl.k, device="cuda", dtype=torch.bfloat16)
    C.warmup(gl, x, m)
    recs = []
    for _ in range(3):  # each time: 4 streams never used before
        gl2 = gl.with_streams([torch.cuda.Stream(priority=-1) for _ in range(C.NUM_STREAMS)])
        torch.cuda.synchronize()
        recs.append(gl2.forward(x, m)[1])
        torch.cuda.synchronize()
    steady = []
    for _ in range(3):
        steady.append(gl.forward(x, m)[1])
        torch.cuda.synchronize()
    return {"first_on_new_streams": C.summarize(C.finish(recs)), "steady": C.summarize(C.finish(steady))}


def main():
    results = {}
    C.guarded(results, "new_streams", new_streams)
    for mode, timeout in (("LAZY", 35), ("EAGER", 60)):  # EAGER loads every kernel at init
        results[mode] = {"error": "not run (parent stopped first)"}
        write(results)  # keep partial results if run_all's timeout ends this script
        results[mode] = C.run_child("mech_v_firstcall.py", ["--child"],
                                    {"CUDA_MODULE_LOADING": mode}, timeout=timeout)
    write(results)


def write(results):
    rows = []
    ns = results["new_streams"]
    if "error" in ns:
        rows.append({"variant": "new_streams", "extra": "error: " + ns["error"]})
    else:
        rows.append(C.row("first call on 4 new streams", ns["first_on_new_streams"], "warm process"))
        rows.append(C.row("steady state", ns["steady"], ""))
    for mode in ("LAZY", "EAGER"):
        r = results.get(mode, {"error": "not run"})
        if "error" in r:
            rows.append({"variant": mode, "extra": "error: " + r["error"]})
            continue
        for i, c in enumerate(r["calls"]):
            s = {k + ("_median" if k == "gemm_gpu_ms" else "_max"): v for k, v in c.items()}
            rows.append(C.row("%s call %d" % (mode, i + 1), s,
                              "CUDA init %s ms" % r["cuda_init_ms"] if i == 0 else ""))
    C.write_result("v_firstcall", {"mechanism": "(v) first-call work", "results": results, "rows": rows})


if __name__ == "__main__":
    if "--child" in sys.argv:
        res = {}
        C.guarded(res, "r", fresh_process)
        C.child_print(res["r"])
    else:
        main()
