"""Mechanism (i): a device->host read of the token counts inside the module.

Why it fits the seed: ``counts.tolist()`` (or ``.item()``/``.cpu()``) on a CUDA
tensor is a copy on the current stream plus a wait for that stream.  If an
all-to-all is queued ahead of it (NCCL makes the compute stream wait on the
communication stream), the host waits for the slowest peer rank.  The module
range grows by that wait, the GEMM launches start late and run at normal
speed, and a single-GPU micro-benchmark (no all-to-all, host-side m_splits)
never waits.

Here the all-to-all is a GPU sleep on a "comm" stream that the main stream
waits on.  Variants:
* ``baseline``     -- m_splits already on the host, nothing queued;
* ``host_list``    -- m_splits on the host, all-to-all queued: launches do not wait;
* ``stall_tolist`` -- counts.tolist() inside the module, all-to-all queued;
* ``fix_async``    -- counts copied to pinned memory right after routing, before
  the all-to-all, with an event; the module waits on that event only (this is
  te_async's ``async`` mode; its ``device`` mode needs no host copy at all).
One stall iteration is also exported as a chrome trace (torch.profiler).
"""
import os

import torch

import common as C

ITERS = 5
A2A_MS = 50.0


def main():
    sleep = C.SleepCalib()
    gl = C.GroupedLinear("fc2")
    x = torch.randn(C.TOKENS, gl.k, device="cuda", dtype=torch.bfloat16)
    routing = torch.randint(0, C.EXPERTS, (C.TOKENS,), device="cuda")
    host_splits = torch.bincount(routing, minlength=C.EXPERTS).tolist()
    C.warmup(gl, x, host_splits)
    comm = torch.cuda.Stream()
    pinned = torch.empty(C.EXPERTS, dtype=torch.int64, pin_memory=True)
    main_stream = torch.cuda.current_stream()

    def all_to_all():
        comm.wait_stream(main_stream)
        with torch.cuda.stream(comm):
            sleep.sleep(A2A_MS)
        main_stream.wait_stream(comm)

    def one(variant):
        counts = torch.bincount(routing, minlength=C.EXPERTS)  # router output, on device
        if variant == "fix_async":
            pinned.copy_(counts, non_blocking=True)  # issued before the all-to-all
            ready = torch.cuda.Event()
            ready.record()
        if variant != "baseline":
            all_to_all()
        if variant in ("baseline", "host_list"):
            splits = host_splits
        elif variant == "stall_tolist":
            splits = lambda: counts.tolist()  # waits for everything queued, incl. the all-to-all
        else:
            splits = lambda: (ready.synchronize(), pinned.tolist())[1]
        return gl.forward(x, splits)[1]

    results = {}
    for variant in ("baseline", "host_list", "stall_tolist", "fix_async"):
        def run(v=variant):
            recs = []
            for _ in range(ITERS):
                torch.cuda.synchronize()
                recs.append(one(v))
                torch.cuda.synchronize()
            return C.summarize(C.finish(recs), {"queued_all_to_all_ms": 0 if v == "baseline" else A2A_MS})
        C.guarded(results, variant, run)

    def trace():
        path = os.path.join(C.OUT, "trace_mech_i_d2h.json")
        os.makedirs(C.OUT, exist_ok=True)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        torch.cuda.synchronize()
        C.set_profiling(True)
        try:
            with torch.profiler.profile(activities=acts) as prof:
                one("stall_tolist")
                torch.cuda.synchronize()
        finally:
            C.set_profiling(False)
        prof.export_chrome_trace(path)
        return {"path": path, "bytes": os.path.getsize(path)}
    C.guarded(results, "trace", trace)

    rows = []
    for v in ("baseline", "host_list", "stall_tolist", "fix_async"):
        r = results.get(v, {})
        rows.append(C.row(v, r, r.get("error", "all-to-all queued %s ms" % r.get("queued_all_to_all_ms"))))
    C.write_result("i_d2h", {"mechanism": "(i) D2H read of token counts behind an all-to-all",
                             "results": results, "rows": rows})


if __name__ == "__main__":
    main()
