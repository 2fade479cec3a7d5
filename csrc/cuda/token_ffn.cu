// One token's SwiGLU feed-forward in one kernel: the routed experts it chose and the shared experts
// (or a dense MLP), fc1, the activation and fc2 together (te_async/token_ffn.py). At one token per
// step a feed-forward's time is the read of its weights, and every launch between its GEMMs costs
// fixed latency; here each output unit u of an expert (gate column u, linear column u and row u of
// fc2) depends on nothing but x, so a block can run fc1, the activation and fc2 of a block of
// units without waiting for any other block. There is no grid barrier, no workspace, no atomics.
//
// Work items: the units of each source (routed choice c of the top-k, then the shared experts)
// cut into blocks of `units` (a multiple of 8, planned in Python: token_ffn.plan_units) -> one
// thread block per item, one wave of kBlocksPerSm blocks per SM where the units allow it. Item i
// of choice c reads expert experts[c] on the GPU, so the kernel sits in a CUDA graph.
// Per item (256 threads):
//   1. x [H] to shared memory as f32.
//   2. fc1: the item's gate and linear columns (2 * units / 8 16-byte vectors per row of
//      w_fc1 [H, 2F]) times x, summed over H: thread (g, v) owns vector v and rows g, g + G, ...
//      (G row groups), 8 independent ld.global.nc loads in flight per thread (64 KB per SM with
//      two blocks),
//      f32 FMAs; the G partial sums of each column are added in group order (deterministic).
//   3. a[u] = silu(h_gate[u]) * h_lin[u], with h and a rounded to x's dtype as the unfused
//      path rounds them (grouped_mlp: fc1 writes x's dtype; te_async.mlp.activate).
//   4. fc2: rows u0 .. u0 + units of w_fc2 [F, H] (contiguous) times a, the same way, and the
//      item's f32 partial output, times the routing weight (or the shared scale), goes to
//      out[i, :]. The caller sums out over items (an XLA reduction).
// An expert id outside [0, E) cannot be raised inside a graph: that item's row of out is NaN, so
// the token's output is NaN.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/float_convert.cuh"
#include "cuda/handlers.h"
#include "cuda/vector_loads.cuh"
#include "debug_flags.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 2;  // measured as fast as one 512-thread block and faster than four (benchmarks.md, TF)
constexpr int kVec = 8;           // 16-bit elements per 16-byte vector
constexpr int kUnroll = 8;        // loads in flight per thread
constexpr int kMaxHidden = 4096;  // x in shared memory as f32, with the sums' scratch under 48 KB
constexpr int kMaxUnits = 256;

struct TokenFfnArgs {
  const void* x;             // [H]
  const void* w1;            // routed [E, H, 2F]
  const void* w2;            // routed [E, F, H]
  const int32_t* experts;    // [k]
  const float* weights;      // [k]
  const void* shared_w1;     // [H, 2Fs]
  const void* shared_w2;     // [Fs, H]
  const float* shared_scale; // [1]
  float* out;                // [items, H]
  int hidden, num_experts, top_k, ffn, shared_ffn, units, blocks_per_choice;
};

constexpr size_t SharedBytes(int hidden, int units) {
  return sizeof(float) * (hidden + 3 * units + kThreads * kVec);
}

template <typename T>
__device__ __forceinline__ float Rounded(float v) {
  return ToFloat<T>(FromFloat<T>(v));
}

// For each 16-byte column vector c < nvec (element offset column(c) in a row): the sum over
// r < rows of coef[r] * w[r * ld + column(c) + j], j < 8, in f32, handed to store(c * 8 + j, sum).
// Threads own one vector and every G-th row; the G partial sums are added in group order.
template <typename T, typename Column, typename Store>
__device__ __forceinline__ void WeightedRowSum(const T* __restrict__ w, long long ld, int rows,
                                               const float* coef, int nvec, Column column, float* scratch,
                                               Store store) {
  const int tid = threadIdx.x;
  for (int base = 0; base < nvec; base += kThreads) {
    const int width = min(kThreads, nvec - base);
    const int groups = kThreads / width;
    const int v = tid % width, g = tid / width;
    if (g < groups) {
      float acc[kVec] = {};
      const T* p = w + column(base + v);
      for (int r0 = g; r0 < rows; r0 += groups * kUnroll) {
        uint4 q[kUnroll];
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          const int r = r0 + i * groups;
          q[i] = r < rows ? LoadStream(p + r * ld) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < kUnroll; ++i) {
          const int r = r0 + i * groups;
          if (r < rows) {
            float f[kVec];
            Unpack<T>(q[i], f);
            const float c = coef[r];
#pragma unroll
            for (int j = 0; j < kVec; ++j) acc[j] = fmaf(c, f[j], acc[j]);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kVec; ++j) scratch[(g * width + v) * kVec + j] = acc[j];
    }
    __syncthreads();
    for (int c = tid; c < width * kVec; c += kThreads) {
      float s = 0.f;
      for (int gg = 0; gg < groups; ++gg) s += scratch[gg * width * kVec + c];
      store(base * kVec + c, s);
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) TokenFfnKernel(TokenFfnArgs a) {
  extern __shared__ float smem[];
  float* xs = smem;                    // [H]
  float* h = xs + a.hidden;            // [2 * units]: gate sums, then linear sums
  float* act = h + 2 * a.units;        // [units]
  float* scratch = act + a.units;      // [kThreads * kVec]
  const int item = blockIdx.x, tid = threadIdx.x;
  const int routed_items = a.top_k * a.blocks_per_choice;
  const bool routed = item < routed_items;
  const int choice = routed ? item / a.blocks_per_choice : 0;
  const int ffn = routed ? a.ffn : a.shared_ffn;
  const int u0 = (routed ? item % a.blocks_per_choice : item - routed_items) * a.units;
  const int units = min(a.units, ffn - u0);
  const int expert = routed ? a.experts[choice] : 0;
  const float scale = routed ? a.weights[choice] : *a.shared_scale;
  float* out = a.out + static_cast<long long>(item) * a.hidden;
  if (routed && (expert < 0 || expert >= a.num_experts)) {
    for (int i = tid; i < a.hidden; i += kThreads) out[i] = NAN;
    return;
  }
  const T* x = static_cast<const T*>(a.x);
  for (int i = tid; i < a.hidden; i += kThreads) xs[i] = ToFloat<T>(x[i]);
  __syncthreads();

  const long long h2f = 2LL * a.hidden * ffn;
  const T* w1 = routed ? static_cast<const T*>(a.w1) + expert * h2f : static_cast<const T*>(a.shared_w1);
  const T* w2 = routed ? static_cast<const T*>(a.w2) + expert * (h2f / 2) : static_cast<const T*>(a.shared_w2);
  const int half = units / kVec;  // vectors of gate (and of linear) columns per row
  WeightedRowSum<T>(
      w1, 2LL * ffn, a.hidden, xs, 2 * half,
      [=](int c) { return static_cast<long long>(u0) + (c < half ? c * kVec : ffn + (c - half) * kVec); }, scratch,
      [=](int col, float s) { h[col] = s; });
  for (int u = tid; u < units; u += kThreads) {
    const float gate = Rounded<T>(h[u]), lin = Rounded<T>(h[units + u]);
    act[u] = Rounded<T>(gate / (1.f + expf(-gate)) * lin);
  }
  __syncthreads();
  WeightedRowSum<T>(
      w2 + static_cast<long long>(u0) * a.hidden, a.hidden, units, act, a.hidden / kVec,
      [](int c) { return static_cast<long long>(c) * kVec; }, scratch,
      [=](int col, float s) { out[col] = scale * s; });
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

ffi::Error TokenFfn(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer w1, ffi::AnyBuffer w2,
                    ffi::Buffer<ffi::S32> experts, ffi::Buffer<ffi::F32> weights, ffi::AnyBuffer shared_w1,
                    ffi::AnyBuffer shared_w2, ffi::Buffer<ffi::F32> shared_scale,
                    ffi::Result<ffi::AnyBuffer> out, int64_t units) {
  auto bad = [&](const std::string& what) {
    return ffi::Error::InvalidArgument("te_async token_ffn: " + what + " (x " + Dims(x) + ", w_fc1 " + Dims(w1) +
                                       ", w_fc2 " + Dims(w2) + ", shared w_gate_up " + Dims(shared_w1) +
                                       ", shared w_down " + Dims(shared_w2) + ", out " + Dims(*out) + ")");
  };
  const auto xd = x.dimensions(), d1 = w1.dimensions(), d2 = w2.dimensions();
  const auto s1 = shared_w1.dimensions(), s2 = shared_w2.dimensions(), od = out->dimensions();
  const auto type = x.element_type();
  if (type != ffi::DataType::BF16 && type != ffi::DataType::F16) return bad("x must be bfloat16 or float16");
  if (xd.size() != 2 || xd[0] != 1) return bad("x must be [1, H]: one token");
  const int64_t hidden = xd[1], k = experts.element_count();
  if (hidden % kVec != 0 || hidden < kVec || hidden > kMaxHidden) {
    return bad("H must be a multiple of 8 in [8, " + std::to_string(kMaxHidden) + "]");
  }
  if (d1.size() != 3 || d2.size() != 3 || d1[1] != hidden || d1[2] != 2 * d2[1] || d2[0] != d1[0] || d2[2] != hidden) {
    return bad("need w_fc1 [E, H, 2F] and w_fc2 [E, F, H]");
  }
  if (s1.size() != 2 || s2.size() != 2 || s1[0] != hidden || s1[1] != 2 * s2[0] || s2[1] != hidden) {
    return bad("need shared w_gate_up [H, 2Fs] and w_down [Fs, H] (Fs = 0: no shared experts)");
  }
  const int64_t num_experts = d1[0], ffn = d2[1], shared_ffn = s2[0];
  if (weights.element_count() != k || (k > 0 && (num_experts < 1 || ffn < 1))) {
    return bad("experts and weights must have k entries, with k = 0 or at least one expert of F >= 1");
  }
  if (shared_scale.element_count() != 1) return bad("shared_scale must have one entry");
  if (ffn % kVec != 0 || shared_ffn % kVec != 0) return bad("F and Fs must be multiples of 8");
  if (w1.element_type() != type || w2.element_type() != type || shared_w1.element_type() != type ||
      shared_w2.element_type() != type) {
    return bad("x and every weight must share a dtype");
  }
  if (units % kVec != 0 || units < kVec || units > kMaxUnits) {
    return bad("units must be a multiple of 8 in [8, " + std::to_string(kMaxUnits) + "], got " + std::to_string(units));
  }
  const int64_t per_choice = k > 0 ? CeilDiv(ffn, units) : 0;
  const int64_t items = k * per_choice + CeilDiv(shared_ffn, units);
  if (items < 1) return bad("nothing to compute: no routed choices and no shared experts");
  if (out->element_type() != ffi::DataType::F32 || od.size() != 2 || od[0] != items || od[1] != hidden) {
    return bad("out must be float32 [items, H] with items = k * ceil(F / units) + ceil(Fs / units) = " + std::to_string(items));
  }
  for (const void* p : {x.untyped_data(), w1.untyped_data(), w2.untyped_data(), shared_w1.untyped_data(),
                        shared_w2.untyped_data()}) {
    if (!Aligned16(p)) return bad("operands must be 16-byte aligned");
  }
  if (PoisonOutputs()) TE_ASYNC_CUDA(cudaMemsetAsync(out->untyped_data(), 0xff, out->size_bytes(), stream));

  const TokenFfnArgs a{x.untyped_data(),        w1.untyped_data(),
                       w2.untyped_data(),       experts.typed_data(),
                       weights.typed_data(),    shared_w1.untyped_data(),
                       shared_w2.untyped_data(), shared_scale.typed_data(),
                       static_cast<float*>(out->untyped_data()), static_cast<int>(hidden),
                       static_cast<int>(num_experts), static_cast<int>(k),
                       static_cast<int>(ffn),   static_cast<int>(shared_ffn),
                       static_cast<int>(units), static_cast<int>(per_choice)};
  const size_t smem = SharedBytes(static_cast<int>(hidden), static_cast<int>(units));
  if (type == ffi::DataType::BF16) {
    TokenFfnKernel<__nv_bfloat16><<<static_cast<unsigned>(items), kThreads, smem, stream>>>(a);
  } else {
    TokenFfnKernel<__half><<<static_cast<unsigned>(items), kThreads, smem, stream>>>(a);
  }
  return CudaStatus(cudaGetLastError(), "launch of TokenFfnKernel");
}

static_assert(SharedBytes(kMaxHidden, kMaxUnits) <= 48 * 1024, "dynamic shared memory past the default limit");

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kTokenFfnCuda, TokenFfn,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("units"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
