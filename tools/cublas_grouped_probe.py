"""Probe: one cublasGemmGroupedBatchedEx call against one cublasGemmEx per expert.

The host-sized modes launch one cuBLAS GEMM per active expert, and from 8 decode tokens that
launch loop, not the GPU, sets the step's time. This measures, on the GPU machine (torch for the
buffers, cuBLAS through ctypes), what the grouped call costs the host and the GPU at MoE shapes,
how many kernels it runs, and whether its results match. Usage: python tools/cublas_grouped_probe.py
"""
import ctypes
import os
import time

import numpy as np
import torch

OP_N, R_16BF, R_32F, COMPUTE_32F, GEMM_DEFAULT = 0, 14, 0, 68, -1


def load_cublas():
    """The libcublas torch loaded (from its nvidia wheels), found through the process's maps."""
    torch.zeros(1, device="cuda") @ torch.zeros(1, 1, device="cuda")  # makes torch load cuBLAS
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libcublas.so"):
                return ctypes.CDLL(path)
    raise RuntimeError("libcublas not found")


lib = load_cublas()
handle = ctypes.c_void_p()
assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
version = ctypes.c_int()
lib.cublasGetVersion_v2(handle, ctypes.byref(version))
stream = torch.cuda.current_stream().cuda_stream
lib.cublasSetStream_v2(handle, ctypes.c_void_p(stream))
workspace = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace.data_ptr()), ctypes.c_size_t(32 << 20))
I32 = ctypes.c_int


def arr(ctype, values):
    return (ctype * len(values))(*values)


def per_expert(x, w, out, sizes):
    """out[rows of g] = x[rows of g] @ w[g], one cublasGemmEx per non-empty group (our sync path)."""
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    _, k, n = w.shape
    row0 = 0
    for g, m in enumerate(sizes):
        if m:
            st = lib.cublasGemmEx(handle, OP_N, OP_N, n, m, k, ctypes.byref(alpha),
                                  ctypes.c_void_p(w[g].data_ptr()), R_16BF, n,
                                  ctypes.c_void_p(x[row0].data_ptr()), R_16BF, k, ctypes.byref(beta),
                                  ctypes.c_void_p(out[row0].data_ptr()), R_16BF, n, COMPUTE_32F, GEMM_DEFAULT)
            assert st == 0, st
        row0 += m


def grouped_args(x, w, out, sizes, out_type):
    """Host arrays of one group per non-empty expert, and the device pointer arrays."""
    _, k, n = w.shape
    busy, a, b, c, row0 = [], [], [], [], 0
    for g, m in enumerate(sizes):
        if m:
            busy.append(m)
            a.append(w[g].data_ptr())
            b.append(x[row0].data_ptr())
            c.append(out[row0].data_ptr())
        row0 += m
    ptrs = torch.tensor(a + b + c, dtype=torch.int64, device="cuda")
    count = len(busy)
    base = ptrs.data_ptr()
    return dict(
        count=count, ptrs=ptrs, out_type=out_type,
        ta=arr(I32, [OP_N] * count), tb=arr(I32, [OP_N] * count), m=arr(I32, [n] * count),
        n=arr(I32, busy), k=arr(I32, [k] * count), lda=arr(I32, [n] * count),
        ldb=arr(I32, [k] * count), ldc=arr(I32, [n] * count),
        alpha=arr(ctypes.c_float, [1.0] * count), beta=arr(ctypes.c_float, [0.0] * count),
        size=arr(I32, [1] * count), A=ctypes.c_void_p(base), B=ctypes.c_void_p(base + 8 * count),
        C=ctypes.c_void_p(base + 16 * count))


def grouped(args):
    return lib.cublasGemmGroupedBatchedEx(
        handle, args["ta"], args["tb"], args["m"], args["n"], args["k"], args["alpha"],
        args["A"], R_16BF, args["lda"], args["B"], R_16BF, args["ldb"], args["beta"],
        args["C"], args["out_type"], args["ldc"], args["count"], args["size"], COMPUTE_32F)


def timed(fn, calls=200):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    end.record()
    torch.cuda.synchronize()
    return host, start.elapsed_time(end) / calls * 1e3


def kernels(fn):
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    return len(names), sorted(set(names))[:3]


def routed_sizes(tokens, experts, top_k, rng):
    sizes = np.zeros(experts, np.int64)
    for _ in range(tokens):
        sizes[rng.choice(experts, top_k, replace=False)] += 1
    return sizes.tolist()


def case(name, sizes, k, n):
    rows, experts = sum(sizes), len(sizes)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(experts, k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
    ref = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    args = grouped_args(x, w, out, sizes, R_16BF)
    status = grouped(args)
    per_expert(x, w, ref, sizes)
    torch.cuda.synchronize()
    err = (out.float() - ref.float()).abs().max().item()
    loop_host, loop_gpu = timed(lambda: per_expert(x, w, ref, sizes))
    grp_host, grp_gpu = timed(lambda: grouped(args))
    n_loop, _ = kernels(lambda: per_expert(x, w, ref, sizes))
    n_grp, grp_names = kernels(lambda: grouped(args))
    out32 = torch.empty(rows, n, device="cuda", dtype=torch.float32)
    status32 = grouped(grouped_args(x, w, out32, sizes, R_32F))
    torch.cuda.synchronize()
    flop = 2 * rows * k * n
    print(f"{name}: {args['count']} busy groups of {experts}, rows {rows}, K={k} N={n} | status {status}, "
          f"max |grouped - per-expert| {err:.3g}, f32 out status {status32}\n"
          f"  per-expert GemmEx: host {loop_host:.1f} us/call, GPU {loop_gpu:.1f} us/call "
          f"({flop / loop_gpu / 1e6:.1f} TFLOP/s), {n_loop} kernels\n"
          f"  grouped batched:   host {grp_host:.1f} us/call, GPU {grp_gpu:.1f} us/call "
          f"({flop / grp_gpu / 1e6:.1f} TFLOP/s), {n_grp} kernels {grp_names}", flush=True)


rng = np.random.default_rng(0)
print(f"cuBLAS {version.value}, torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
for tokens in (1, 8, 64):
    sizes = routed_sizes(tokens, 64, 6, rng)
    case(f"decode T={tokens} fc1", sizes, 2048, 2816)
    case(f"decode T={tokens} fc2", sizes, 1408, 2048)
qwen = routed_sizes(8, 128, 8, rng)
case("qwen3 T=8 fc1", qwen, 2048, 1536)
case("train even fc1", [384] * 64, 2048, 2816)
skew = (rng.dirichlet(np.full(64, 0.3)) * 24576).astype(int).tolist()
skew[0] += 24576 - sum(skew)
case("train skewed fc2", skew, 1408, 2048)
