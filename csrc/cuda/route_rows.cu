// A decode MoE block's routing and what surrounds it, in one kernel: x [T, H] -> the RMS norm of x
// gathered into the T*k rows of the expert order (the grouped GEMMs' input), the router logits (from
// x or from norm(x)) and route_block.cuh's routing: each token's top-k weights and experts, the
// group sizes, the row order and its inverse (te_async/route_rows.py). At T = 8 of DeepSeek-V2-Lite
// these were five kernels per MoE layer (two XLA fusions of the norm, XLA's router GEMM, the routing
// kernel, the row gather: 11.5 us of a 223 us layer on an H100), each a few us of fixed latency.
//
// One thread-block cluster of kSlices blocks of kRouteThreads threads (compute capability 9.0 and
// up); block `rank` owns H's columns [rank * per, (rank + 1) * per), per = H / kSlices:
//   1. starts copying its rows of the router [H, E] into shared memory (cp.async, the first chunk
//      of kChunkBytes), and meanwhile: every token's sum of squares over all of H (each block the
//      same sums in the same order: a warp a token, a fixed butterfly, so no exchange between
//      blocks), its columns of x and of the norm scale, and their norm with token_ffn.cu's
//      arithmetic (te_async.mlp.normalize's, or with round_first transformers' RMSNorm), each value
//      rounded to x's dtype;
//   2. its rows of the router times its columns of x (or of norm(x)): thread (token, 16-byte vector
//      of experts, group of rows) sums its rows, the groups are added in a fixed order, and the
//      partial logits [T, E] in f32 go into rank 0's shared memory;
//   3. cluster barrier; rank 0 adds the partials in rank order and routes them (RouteBlock),
//      writing the routing to global memory, while the other blocks wait;
//   4. cluster barrier (its release and acquire order rank 0's writes before the other blocks'
//      reads); every block writes its columns of the rows: row r = norm(x)[token of row r].
// Deterministic: every sum in a fixed order, no float atomics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "cuda/attention_tile.cuh"
#include "cuda/cuda_check.h"
#include "cuda/device_gemm.h"
#include "cuda/float_convert.cuh"
#include "cuda/handlers.h"
#include "cuda/programmatic_launch.cuh"
#include "cuda/route_block.cuh"
#include "cuda/vector_loads.cuh"
#include "debug_flags.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

constexpr int kSlices = 8;                           // the cluster (the portable size)
constexpr int kVec = 8;                              // 16-bit elements of x per 16-byte vector
constexpr int kMaxHidden = 4096;                     // x's columns of a block, in f32 twice
constexpr int kMaxPer = kMaxHidden / kSlices;
constexpr int kChunkBytes = 32 * 1024;               // router rows staged in shared memory at once
static_assert(kRouteRowsMaxTokens <= kRouteWarps && kRouteRowsMaxLogits / 4 <= kRouteThreads && kRouteMaxChoices <= kRouteThreads * kVec,
              "a warp a token's norm; a thread at least each 16-byte vector of logits; the rows' tokens in the sums' memory");

struct RouteRowsArgs {
  const void* x;             // [T, H]
  const void* scale;         // [H], x's dtype or f32
  bool scale_f32, round_first, router_reads_normed;
  float eps;
  const void* router;        // [H, E], x's dtype or f32
  int hidden, per;           // per: a block's columns of H
  void* rows;                // [T*k, H], x's dtype
  RouteArgs route;           // its logits: rank 0's shared memory
};

// Shared memory of a block, in floats: x's and norm(x)'s columns [T, per] as f32, the scale's
// columns [per], the norms' factors [kRouteWarps], the partial logits [kSlices, T*E] (rank 0's receive
// every block's), the row groups' sums [groups, T*E] (kRouteThreads 16-byte vectors of logits at most;
// then the rows' tokens) and the router chunk.
struct Layout {
  int xs, xn, scale, factors, partials, sums, chunk, floats;
  __host__ __device__ Layout(int tokens, int per, int logits)
      : xs(0), xn(tokens * per), scale(2 * tokens * per), factors(scale + per), partials(factors + kRouteWarps),
        sums(partials + kSlices * logits), chunk(sums + kRouteThreads * kVec), floats(chunk + kChunkBytes / 4) {}
};

template <typename T, typename W, typename Form>
__global__ void __launch_bounds__(kRouteThreads, 1) RouteRowsKernel(RouteRowsArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  __cluster_barrier_arrive_relaxed();  // with the wait before the first write to rank 0: every block has started
  extern __shared__ __align__(16) float smem[];
  constexpr int V = Elem<W>::kVec;  // router columns (experts) per 16-byte vector
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int rank = static_cast<int>(__clusterRelativeBlockRank());
  const int tokens = a.route.tokens, experts = a.route.top.experts, top_k = a.route.top.top_k;
  const int per = a.per, c0 = rank * per, hidden = a.hidden, logits = tokens * experts, vecs = per / kVec;
  const Layout at(tokens, per, logits);
  float *xs = smem + at.xs, *xn = smem + at.xn, *scale = smem + at.scale, *factors = smem + at.factors;
  float *partials = smem + at.partials, *sums = smem + at.sums;
  const W* chunk = reinterpret_cast<const W*>(smem + at.chunk);

  // 1. The router's first chunk on its way; the norm meanwhile.
  const int chunk_rows = kChunkBytes / (experts * static_cast<int>(sizeof(W))) / kVec * kVec;
  const auto stage = [&](int r0) {  // rows [r0, r0 + chunk_rows) of the block's, cp.async
    const int n = min(chunk_rows, per - r0);
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const W*>(a.router) + static_cast<long long>(c0 + r0) * experts);
    uint4* dst = reinterpret_cast<uint4*>(smem + at.chunk);
    for (int i = tid; i < n * experts * static_cast<int>(sizeof(W)) / 16; i += kRouteThreads) {
      attention_tile::CopyAsync16(dst + i, src + i, true);
    }
    attention_tile::CommitCopies();
  };
  stage(0);
  const T* x = static_cast<const T*>(a.x);
  if (warp < tokens) {
    const T* row = x + static_cast<long long>(warp) * hidden;
    float s = 0.f;
    for (int v = lane; v < hidden / kVec; v += 32) {
      float f[kVec];
      Unpack<T>(*reinterpret_cast<const uint4*>(row + v * kVec), f);
#pragma unroll
      for (int j = 0; j < kVec; ++j) s = fmaf(f[j], f[j], s);
    }
    s = WarpSum(s);
    if (lane == 0) factors[warp] = rsqrtf(s / static_cast<float>(hidden) + a.eps);
  }
  for (int i = tid; i < tokens * vecs; i += kRouteThreads) {
    const int t = i / vecs, c = (i % vecs) * kVec;
    float f[kVec];
    Unpack<T>(*reinterpret_cast<const uint4*>(x + static_cast<long long>(t) * hidden + c0 + c), f);
#pragma unroll
    for (int j = 0; j < kVec; ++j) xs[t * per + c + j] = f[j];
  }
  for (int c = tid; c < per; c += kRouteThreads) {
    scale[c] = a.scale_f32 ? static_cast<const float*>(a.scale)[c0 + c] : ToFloat<T>(static_cast<const T*>(a.scale)[c0 + c]);
  }
  __syncthreads();
  for (int i = tid; i < tokens * per; i += kRouteThreads) {
    float y = xs[i] * factors[i / per], sc = scale[i % per];
    if (a.round_first) y = Rounded<T>(y), sc = Rounded<T>(sc);
    xn[i] = Rounded<T>(y * sc);
  }

  // 2. Partial logits: thread (t, v, g) sums its group's rows of each chunk for logits t * E + v * V ..
  const float* in = a.router_reads_normed ? xn : xs;
  const int nvec = experts / V, pairs = tokens * nvec, groups = kRouteThreads / pairs;
  const int p = tid % pairs, g = tid / pairs, t = p / nvec, v = p % nvec;
  float acc[V] = {};
  for (int r0 = 0; r0 < per; r0 += chunk_rows) {
    if (r0 > 0) stage(r0);  // the previous chunk's readers are past the barrier below
    attention_tile::WaitCopies();
    __syncthreads();
    const int n = min(chunk_rows, per - r0), len = (n / 4 + groups - 1) / groups * 4;  // n is a multiple of 8
    const int begin = min(n, g * len), end = g < groups ? min(n, begin + len) : begin;
    const float* xr = in + t * per + r0;
    for (int r = begin; r < end; r += 4) {
      const float4 x4 = *reinterpret_cast<const float4*>(xr + r);
      const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float f[V];
        Unpack<W>(*reinterpret_cast<const uint4*>(chunk + (r + i) * experts + v * V), f);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = fmaf(xv[i], f[j], acc[j]);
      }
    }
    __syncthreads();
  }
  if (g < groups) {
#pragma unroll
    for (int j = 0; j < V; ++j) sums[g * logits + t * experts + v * V + j] = acc[j];
  }
  __syncthreads();
  __cluster_barrier_wait();  // every block of the cluster has started: rank 0's memory may be written
  float* mine = static_cast<float*>(__cluster_map_shared_rank(partials, 0)) + rank * logits;
  for (int o = tid; o < logits; o += kRouteThreads) {
    float s = sums[o];
    for (int gg = 1; gg < groups; ++gg) s += sums[gg * logits + o];
    mine[o] = s;
  }
  __cluster_barrier_arrive();  // releases the partial logits to rank 0
  __cluster_barrier_wait();

  // 3. Rank 0 routes.
  if (rank == 0) {
    for (int o = tid; o < logits; o += kRouteThreads) {
      float l = partials[o];
      for (int q = 1; q < kSlices; ++q) l += partials[q * logits + o];
      partials[o] = l;
    }
    __syncthreads();
    RouteArgs route = a.route;
    route.logits = partials;
    RouteBlock<Form>(route);
  }
  __cluster_barrier_arrive();  // releases rank 0's routing (global memory) to the cluster
  __cluster_barrier_wait();

  // 4. This block's columns of the rows, gathered from its columns of norm(x).
  int* token_of_row = reinterpret_cast<int*>(sums);
  for (int r = tid; r < tokens * top_k; r += kRouteThreads) token_of_row[r] = __ldcg(a.route.choice_of_row + r) / top_k;
  __syncthreads();
  T* rows = static_cast<T*>(a.rows);
  for (int i = tid; i < tokens * top_k * vecs; i += kRouteThreads) {
    const int r = i / vecs, c = (i % vecs) * kVec, tr = token_of_row[r];
    alignas(16) T out[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) out[j] = FromFloat<T>(xn[tr * per + c + j]);
    *reinterpret_cast<uint4*>(rows + static_cast<long long>(r) * hidden + c0 + c) = *reinterpret_cast<const uint4*>(out);
  }
#endif
}

template <typename T>
ffi::Error Launch(const RouteRowsArgs& a, bool router_f32, size_t smem, cudaStream_t stream) {
  cudaError_t status = cudaSuccess;
  const auto launch = [&](auto kernel) {
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (status == cudaSuccess) {
      status = LaunchDependentClusters(kernel, dim3(kSlices), dim3(kRouteThreads), smem, stream, false, kSlices, a);
    }
  };
  WithForm<false>(a.route.top, [&](auto form) {  // softmax forms: route_rows.py takes the other scoring elsewhere
    using Form = decltype(form);
    router_f32 ? launch(RouteRowsKernel<T, float, Form>) : launch(RouteRowsKernel<T, T, Form>);
  });
  return CudaStatus(status, "launch of RouteRowsKernel");
}

ffi::Error RouteRows(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer scale, ffi::AnyBuffer router,
                     ffi::Result<ffi::AnyBuffer> rows, ffi::Result<ffi::Buffer<ffi::F32>> weights,
                     ffi::Result<ffi::Buffer<ffi::S32>> experts, ffi::Result<ffi::Buffer<ffi::S32>> group_sizes,
                     ffi::Result<ffi::Buffer<ffi::S32>> choice_of_row, ffi::Result<ffi::Buffer<ffi::S32>> row_of_choice,
                     int64_t top_k, int64_t n_group, int64_t topk_group, bool renormalize, float scaling, float eps,
                     bool round_first, bool router_reads_normed) {
  auto bad = [&](const std::string& why) {
    return ffi::Error::InvalidArgument("te_async route_rows: " + why + " (x " + Dims(x) + ", norm scale " + Dims(scale) +
                                       ", router " + Dims(router) + ")");
  };
  const auto type = x.element_type();
  if (type != ffi::DataType::BF16 && type != ffi::DataType::F16) return bad("x must be bfloat16 or float16");
  const auto xd = x.dimensions(), rd = router.dimensions(), sd = scale.dimensions();
  if (xd.size() != 2 || rd.size() != 2 || sd.size() != 1) return bad("need x [T, H], norm scale [H] and router [H, E]");
  const int64_t t = xd[0], h = xd[1], e = rd[1];
  if (t < 1 || t > kRouteRowsMaxTokens) return bad("T must be in [1, " + std::to_string(kRouteRowsMaxTokens) + "]");
  if (h % (kVec * kSlices) != 0 || h > kMaxHidden) {
    return bad("H must be a multiple of " + std::to_string(kVec * kSlices) + " up to " + std::to_string(kMaxHidden));
  }
  if (rd[0] != h || sd[0] != h) return bad("the router must be [H, E] and the norm scale [H]");
  if (e % 8 != 0 || t * e > kRouteRowsMaxLogits) {
    return bad("E must be a multiple of 8 with T * E <= " + std::to_string(kRouteRowsMaxLogits));
  }
  for (auto other : {router.element_type(), scale.element_type()}) {
    if (other != type && other != ffi::DataType::F32) return bad("the router and the norm scale must be float32 or x's dtype");
  }
  if (rows->element_type() != type || rows->dimensions().size() != 2 || rows->dimensions()[0] != t * top_k ||
      rows->dimensions()[1] != h) {
    return bad("rows must be [T * top_k, H] in x's dtype");
  }
  for (const void* p : {x.untyped_data(), router.untyped_data(), rows->untyped_data()}) {
    if (!Aligned16(p)) return bad("x, the router and rows must be 16-byte aligned");
  }
  int device = 0;
  TE_ASYNC_CUDA(cudaGetDevice(&device));
  const auto info = QueryDevice(device);
  if (info.has_error()) return info.error();
  if (info->compute_capability < 90) return bad("needs thread-block clusters (compute capability 9.0 and up)");
  auto route = RoutingOutputs("te_async route_rows", stream, t, e, nullptr, weights, experts, group_sizes, choice_of_row,
                              row_of_choice, top_k, n_group, topk_group, renormalize, scaling, false);
  if (route.has_error()) return route.error();
  if (PoisonOutputs()) TE_ASYNC_CUDA(cudaMemsetAsync(rows->untyped_data(), 0xff, rows->size_bytes(), stream));
  const RouteRowsArgs a{x.untyped_data(), scale.untyped_data(), scale.element_type() == ffi::DataType::F32, round_first,
                        router_reads_normed, eps, router.untyped_data(), static_cast<int>(h),
                        static_cast<int>(h / kSlices), rows->untyped_data(), *route};
  const size_t smem = sizeof(float) * Layout(static_cast<int>(t), a.per, static_cast<int>(t * e)).floats;
  const bool router_f32 = router.element_type() == ffi::DataType::F32;
  return type == ffi::DataType::BF16 ? Launch<__nv_bfloat16>(a, router_f32, smem, stream)
                                     : Launch<__half>(a, router_f32, smem, stream);
}

static_assert(sizeof(float) * (2 * kRouteRowsMaxTokens * kMaxPer + kMaxPer + kRouteWarps +
                               kSlices * kRouteRowsMaxLogits + kRouteThreads * kVec) + kChunkBytes + 20 * 1024 <=
                  227 * 1024,
              "shared memory, RouteBlock's static arrays (about 18 KB) included, within an sm_90 block's");

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kRouteRowsCuda, RouteRows,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::S32>>()
                                  .Attr<int64_t>("top_k")
                                  .Attr<int64_t>("n_group")
                                  .Attr<int64_t>("topk_group")
                                  .Attr<bool>("renormalize")
                                  .Attr<float>("scaling")
                                  .Attr<float>("eps")
                                  .Attr<bool>("round_first")
                                  .Attr<bool>("router_reads_normed"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
