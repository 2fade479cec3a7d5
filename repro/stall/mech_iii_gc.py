"""Mechanism (iii): a Python garbage-collector pause inside the module.

Why it fits the seed: CPython runs a collection when an allocation of a
GC-tracked object crosses a threshold; a full (generation 2) collection walks
every tracked object in the process.  A training process holds millions of
them, so a gen-2 pass can take tens to hundreds of ms, and it runs wherever the
triggering allocation happens.  TE's forward allocates many Python objects
(64 split tensors, lists, autograd state), so a pass can land there: the
module range grows, no CUDA call is made during the pause, and the GEMMs then
launch at normal speed.  A micro-benchmark has a small heap, so its passes are
short.  Megatron's --manual-gc (gc.disable() plus gc.collect() every
--manual-gc-interval steps, megatron/training/training.py) moves the pauses
to step boundaries, aligned across ranks.

Variants:
* ``auto``      -- default thresholds; a large long-lived heap plus per-step
  objects that live for two steps (as activations' Python wrappers do).
  Every collection is timed with gc.callbacks and tagged in/out of a module;
* ``forced``    -- one gc.collect() inside the module (where a threshold
  crossing would run it), to measure the signature deterministically;
* ``manual_gc`` -- gc.freeze() of the heap, gc.disable(), gc.collect() at step
  boundaries only: no pass inside a module.
"""
import collections
import gc
import time

import torch

import common as C

LAYERS, STEPS, TARGET_MS, MAX_CYCLES = 8, 20, 60.0, 4_000_000
CHURN_PER_LAYER = 15_000  # 2-object cycles created between module calls


def make_cycles(n):
    out = []
    for _ in range(n):
        a = []
        b = [a]
        a.append(b)
        out.append(a)
    return out


class GcLog:
    def __init__(self):
        self.in_module = False
        self.events, self._t = [], None
        gc.callbacks.append(self.cb)

    def cb(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter_ns()
        elif self._t is not None:
            self.events.append({"gen": info["generation"], "in_module": self.in_module,
                                "ms": (time.perf_counter_ns() - self._t) / 1e6})
            self._t = None

    def close(self):
        gc.callbacks.remove(self.cb)


def build_heap():
    """Grow a long-lived heap until one full collection takes ~TARGET_MS."""
    heap, n = [], 250_000
    while True:
        heap.append(make_cycles(n))
        t = time.perf_counter()
        gc.collect()
        ms = (time.perf_counter() - t) * 1e3
        if ms >= TARGET_MS or sum(len(h) for h in heap) >= MAX_CYCLES:
            return heap, ms
        n = sum(len(h) for h in heap) // 2  # grow by half: land near the target


def run_loop(gl, x, m, log, manual_interval=None):
    recs, window = [], collections.deque(maxlen=2)
    boundary_ms = []
    for step in range(STEPS):
        step_objs = []
        for _ in range(LAYERS):
            step_objs.append(make_cycles(CHURN_PER_LAYER))  # framework work between modules
            log.in_module = True
            try:
                recs.append(gl.forward(x, m)[1])
            finally:
                log.in_module = False
        window.append(step_objs)
        torch.cuda.synchronize()
        if manual_interval and step % manual_interval == 0:
            t = time.perf_counter()
            gc.collect()
            boundary_ms.append((time.perf_counter() - t) * 1e3)
    return C.finish(recs), boundary_ms


def gc_summary(events):
    inside = [e["ms"] for e in events if e["in_module"]]
    full = [e["ms"] for e in events if e["gen"] == 2]
    full_in = [e["ms"] for e in events if e["gen"] == 2 and e["in_module"]]
    return {"collections": len(events), "gen2": len(full),
            "gen2_max_ms": round(max(full), 2) if full else 0, "gen2_in_module": len(full_in),
            "in_module": len(inside), "in_module_max_ms": round(max(inside), 2) if inside else 0}


def main():
    gl = C.GroupedLinear("fc2")
    m = C.even_splits()
    x = torch.randn(C.TOKENS, gl.k, device="cuda", dtype=torch.bfloat16)
    C.warmup(gl, x, m)
    results = {}
    heap, full_ms = build_heap()
    results["heap"] = {"cycles": sum(len(h) for h in heap), "full_collect_ms": round(full_ms, 1)}

    def auto():
        log = GcLog()
        try:
            recs, _ = run_loop(gl, x, m, log)
        finally:
            log.close()
        return C.summarize(recs, {"gc": gc_summary(log.events)})

    def forced():
        gc.collect()  # start clean: the pass below then costs about the heap's full_collect_ms
        log, recs = GcLog(), []
        try:
            for i in range(3):
                torch.cuda.synchronize()
                log.in_module = True
                recs.append(gl.forward(x, m, pre_gemm=gc.collect)[1])
                log.in_module = False
        finally:
            log.close()
        torch.cuda.synchronize()
        return C.summarize(C.finish(recs), {"gc": gc_summary(log.events)})

    def manual():
        gc.collect()
        gc.freeze()  # the long-lived heap leaves the collector's working set
        gc.disable()
        log = GcLog()
        try:
            recs, boundary = run_loop(gl, x, m, log, manual_interval=2)
        finally:
            log.close()
            gc.enable()
            gc.unfreeze()
        return C.summarize(recs, {"gc": gc_summary(log.events),
                                  "step_boundary_collect_ms_max": round(max(boundary), 2)})

    for name, fn in (("auto", auto), ("forced", forced), ("manual_gc", manual)):
        C.guarded(results, name, fn)
    rows = []
    for name in ("auto", "forced", "manual_gc"):
        r = results.get(name, {})
        g = r.get("gc", {})
        extra = r.get("error") or "gen2 %s (max %s ms, %s in a module); in-module passes %s (max %s ms)" % (
            g.get("gen2"), g.get("gen2_max_ms"), g.get("gen2_in_module"), g.get("in_module"),
            g.get("in_module_max_ms"))
        if "step_boundary_collect_ms_max" in r:
            extra += ", step-boundary collect max %s ms" % r["step_boundary_collect_ms_max"]
        rows.append(C.row(name, r, extra))
    C.write_result("iii_gc", {"mechanism": "(iii) Python GC pause", "results": results, "rows": rows})


if __name__ == "__main__":
    main()
