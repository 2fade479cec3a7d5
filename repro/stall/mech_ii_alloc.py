"""Mechanism (ii): caching-allocator retry under fragmentation.

Why it fits the seed: the module allocates its output with
``torch.empty([sum(m_splits), N])``.  In dropless MoE training sum(m_splits)
changes every step and layer, so cached blocks of last step's sizes are often
too small, and PyTorch asks cudaMalloc for a new segment.  Near the memory
limit that fails; the allocator then frees every unused cached segment
(release_cached_blocks: cudaEventSynchronize on pending events, then cudaFree
per segment) and retries, counting ``num_alloc_retries``
(c10/cuda/CUDACachingAllocator.cpp).  cudaFree waits for the device, so the
host waits for all queued work -- including an all-to-all stuck on a slow
peer.  Only then do the GEMMs launch, at normal speed.  A micro-benchmark
with fixed sizes and free memory never takes this path.

Setup: 8 "layers" per step keep input and output alive until the end of the
step (as activations saved for backward are), sizes vary +-15% per layer and
step, each layer is preceded by a queued 15 ms "all-to-all", and the memory
limit is set just above the ideal peak with set_per_process_memory_fraction
(cheap on a 141 GB GPU).  The default allocator and expandable_segments run
in separate processes, since the allocator reads PYTORCH_CUDA_ALLOC_CONF once.
"""
import random
import sys

import torch

import common as C

LAYERS, STEPS, A2A_MS, HEADROOM = 8, 25, 15.0, 1.15


def child():
    sleep = C.SleepCalib()
    gl = C.GroupedLinear("fc2")
    C.warmup(gl, torch.randn(C.TOKENS, gl.k, device="cuda", dtype=torch.bfloat16), C.even_splits())
    torch.cuda.empty_cache()
    per_row = 2 * (gl.k + gl.n)  # bf16 input + output row
    peak = gl.w.numel() * 2 + LAYERS * int(C.TOKENS * 1.15) * per_row + (256 << 20)
    total = torch.cuda.get_device_properties(0).total_memory
    frac = min(0.9, HEADROOM * peak / total)
    torch.cuda.set_per_process_memory_fraction(frac)
    comm = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    rng = random.Random(0)
    recs, ooms = [], 0
    stat = lambda: torch.cuda.memory_stats().get("num_alloc_retries", 0)
    for step in range(STEPS):
        saved, step_recs = [], []
        try:
            for layer in range(LAYERS):
                rows = int(C.TOKENS * rng.uniform(0.85, 1.15))
                m = C.random_splits(rows, rng)
                x = torch.empty(rows, gl.k, device="cuda", dtype=torch.bfloat16)
                comm.wait_stream(main)
                with torch.cuda.stream(comm):
                    sleep.sleep(A2A_MS)  # the all-to-all, waiting on a peer
                main.wait_stream(comm)
                r0 = stat()
                out, rec = gl.forward(x, m)
                rec.update(retries=stat() - r0, step=step, layer=layer)
                saved.append((x, out))
                step_recs.append(rec)
        except torch.cuda.OutOfMemoryError:
            ooms += 1
        torch.cuda.synchronize()
        recs += C.finish(step_recs)
        del saved  # "backward" done: activations freed
    with_retry = [r for r in recs if r["retries"] > 0]
    without = [r for r in recs if r["retries"] == 0]
    st = torch.cuda.memory_stats()
    keep = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
            "num_device_free", "reserved_bytes.all.peak", "allocated_bytes.all.peak")
    return {"alloc_conf": C.env_info()["PYTORCH_CUDA_ALLOC_CONF"], "memory_fraction": round(frac, 5),
            "limit_gib": round(frac * total / 2**30, 2), "caught_ooms": ooms,
            "modules": len(recs), "modules_with_retry": len(with_retry),
            "with_retry": C.summarize(with_retry), "without_retry": C.summarize(without),
            "allocator_stats": {k: st.get(k) for k in keep}}


def main():
    results = {}
    for name, conf in (("default", None), ("expandable_segments", "expandable_segments:True")):
        results[name] = C.run_child("mech_ii_alloc.py", ["--child"],
                                    {"PYTORCH_CUDA_ALLOC_CONF": conf}, timeout=45)
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append({"variant": name, "extra": "error: " + r["error"]})
            continue
        for part in ("with_retry", "without_retry"):
            s = r[part]
            if s.get("n"):
                rows.append(C.row("%s, %s" % (name, part), s,
                                  "%d/%d modules retried; OOMs %d" % (
                                      r["modules_with_retry"], r["modules"], r["caught_ooms"])))
    C.write_result("ii_alloc", {"mechanism": "(ii) caching-allocator retry (cudaFree + sync)",
                                "results": results, "rows": rows})


if __name__ == "__main__":
    if "--child" in sys.argv:
        res = {}
        C.guarded(res, "r", child)
        C.child_print(res["r"])
    else:
        main()
