"""torch._grouped_mm, the reference the training and decode benchmarks measure te_async against in the same run.

PyTorch's grouped GEMM is one CUTLASS kernel for all groups that reads the group offsets on the
GPU, as te_async's device mode does; it is what PyTorch MoE training (torchtitan, transformers'
"grouped_mm" experts) runs. torch is not a dependency of te_async: these contenders exist where
torch with CUDA imports (the GPU machine has it) and report an error elsewhere.

Operands come from the JAX arrays through DLPack (no copy). Weights are laid out as PyTorch
holds them, [G, N, K] (nn.Linear's out x in) and used transposed in the forward, the layout
torch._grouped_mm is built for; the gradients are what torch's autograd computes, eagerly.
Times are wall clock (timing.time_calls with this module's `block`) and GPU time from CUDA
events around back-to-back calls (gpu_seconds), which counts any idle gap between torch's
kernels, as the JAX contenders' profiler "busy" time does not. The decode step (moe_decode_step)
is what a PyTorch server replays: every layer's routing, sort and grouped GEMMs on the GPU,
captured once in a CUDA graph (graphed), so no host work sits between its kernels.
"""

import functools

import numpy as np


@functools.cache
def _torch():
    """The torch module, or an ImportError/RuntimeError saying why it cannot run here."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA device here")
    if not hasattr(torch, "_grouped_mm"):
        raise RuntimeError(f"torch {torch.__version__} has no _grouped_mm")
    return torch


def block(_out) -> None:
    """Waits for the GPU work torch has queued (timing.time_calls's `block`)."""
    _torch().cuda.synchronize()


def gpu_seconds(fn, sets, calls: int = 10) -> float:
    """GPU seconds per call of fn(*sets[i]): CUDA events around `calls` back-to-back calls."""
    torch = _torch()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn(*sets[0])
    torch.cuda.synchronize()
    start.record()
    for i in range(calls):
        fn(*sets[i % len(sets)])
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def tensor(x):
    """A JAX array as a torch tensor on the same GPU memory."""
    return _torch().from_dlpack(x)


def to_numpy(t) -> np.ndarray:
    return t.float().cpu().numpy()


def offsets(group_sizes):
    """torch._grouped_mm's offs from a torch tensor of group sizes: the groups' cumulative row
    ends, int32 on the GPU."""
    torch = _torch()
    return torch.cumsum(group_sizes, 0).to(torch.int32)


def linear_weights(w):
    """A [G, K, N] JAX weight as PyTorch holds it: [G, N, K] contiguous."""
    return tensor(w).transpose(1, 2).contiguous()


def gemm(form: str):
    """fn(lhs, second, offs) of one grouped GEMM form on torch tensors, where `second` is
    linear_weights(the JAX rhs) for ragged m and the output gradient dy [M, N] for ragged k:
    "m" forward x @ w, "mT" input gradient dy @ w^T, "k" weight gradient, which comes out [G, N, K]
    (dy^T x, the layout of PyTorch's weight gradient)."""
    mm = _torch()._grouped_mm
    if form == "m":
        return lambda x, w_t, offs: mm(x, w_t.transpose(1, 2), offs=offs)
    if form == "mT":
        return lambda dy, w_t, offs: mm(dy, w_t, offs=offs)
    return lambda x, dy, offs: mm(dy.t(), x, offs=offs)


def rms_norm(x, scale, eps: float):
    """te_async's RMSNorm: in float32, cast back to x's dtype."""
    xf = x.float()
    return (xf * _torch().rsqrt(xf.square().mean(-1, keepdim=True) + eps) * scale).to(x.dtype)


def swiglu_experts(rows, w1, w2, offs):
    """grouped_mlp's experts on sorted rows (swiglu in float32, cast back; fc1 [gate | linear]), w1
    [G, H, 2F] and w2 [G, F, H] as views of any layout torch._grouped_mm takes (row- or column-major)."""
    torch = _torch()
    gate, linear = torch._grouped_mm(rows, w1, offs=offs).float().chunk(2, dim=-1)
    return torch._grouped_mm((torch.nn.functional.silu(gate) * linear).to(rows.dtype), w2, offs=offs)


def mlp_stack_step(eps: float):
    """step(x, group_sizes, weights, dy) -> (y, (dx, [(dw1_t, dw2_t, dscale) per layer])): the layer
    stack of the train benchmark, x + mlp(x) per (w1_t, w2_t, scale) of `weights` (group_sizes [G]
    for every layer, or [layers, G]), grouped_mlp's math (rms_norm, swiglu_experts) on the weights as
    PyTorch holds them, forward and backward under torch's autograd, eager."""
    torch = _torch()

    def step(x, group_sizes, weights, dy):
        offs = [offsets(g) for g in group_sizes] if group_sizes.dim() == 2 else [offsets(group_sizes)] * len(weights)
        x = x.detach().requires_grad_()
        leaves = [[w.detach().requires_grad_() for w in layer] for layer in weights]
        y = x
        for (w1_t, w2_t, scale), layer_offs in zip(leaves, offs):
            y = y + swiglu_experts(rms_norm(y, scale, eps), w1_t.transpose(1, 2), w2_t.transpose(1, 2), layer_offs)
        grads = torch.autograd.grad(y, [x] + [w for layer in leaves for w in layer], dy)
        return y.detach(), (grads[0], [tuple(grads[1 + 3 * i:4 + 3 * i]) for i in range(len(leaves))])

    return step


def moe_decode_step(layers, top_k: int, eps: float):
    """step(x [T, H]) -> [T, H]: bench decode's MoE layers (te_async.moe_block's math: a float32
    softmax router over x, the top-k weights renormalised, the tokens normalised, their rows sorted by
    expert, swiglu_experts, the combine weighted in float32, the residual) with everything on the GPU: a stable argsort for the
    order, the group sizes by an integer scatter-add (torch.bincount would read its size on the host),
    torch._grouped_mm on the offsets, and an index_copy_ back to token order (no float atomics), so
    the step can be captured in a CUDA graph. `layers`: (router [H, E] float32, w_fc1 [E, H, 2F],
    w_fc2 [E, F, H], norm_scale [H]) per layer, the experts' weights as JAX holds them (row-major,
    which torch._grouped_mm reads as they are: the same bytes as the JAX step, no copy)."""
    torch = _torch()

    def layer(x, router, w1, w2, scale):
        weights, experts = torch.topk(torch.softmax(x.float() @ router, dim=-1), top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        chosen = experts.flatten()
        order = torch.argsort(chosen, stable=True)
        counts = torch.zeros(router.shape[1], dtype=torch.int32, device=x.device)
        counts.scatter_add_(0, chosen, torch.ones_like(chosen, dtype=torch.int32))
        y = swiglu_experts(rms_norm(x, scale, eps)[order // top_k], w1, w2, torch.cumsum(counts, 0, dtype=torch.int32))
        by_token = torch.empty_like(y).index_copy_(0, order, y).view(x.shape[0], top_k, -1)
        return x + (by_token.float() * weights[..., None]).sum(1).to(x.dtype)

    def step(x):
        for weights in layers:
            x = layer(x, *weights)
        return x

    return step


def graphed(fn, example, warmup: int = 3):
    """call(x) -> fn(x) replayed from one CUDA graph captured on a static copy of `example`: x is
    copied into it (one device copy, outside the graph) and the graph's static output returned,
    overwritten by the next call. Warm-up runs on a side stream first, as torch.cuda.graph asks."""
    torch = _torch()
    static = example.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(static)

    def call(x):
        static.copy_(x)
        graph.replay()
        return out

    return call
