// CUTLASS 3.x sm90a ptr-array grouped GEMM for the device-sized path ("large groups").
//
// Two parts:
//  * Always visible (plain C++, safe to include from .cc files): the config names, the forms, the
//    workspace layout, and the per-instance entry points that the instantiation TUs define.
//  * With TE_ASYNC_CUTLASS_KERNELS defined before the include (the instantiation TUs only, compiled
//    by nvcc for sm_90a): the CUTLASS kernel type builder, the device-side setup kernel and the
//    launch template. Keeping them out of the dispatch TU keeps its compile fast.
//
// How one call runs (two launches on the caller's stream, nothing else):
//  1. SetupKernel<<<blocks, 256>>>: every block computes the clamped group offsets from
//     group_sizes (LoadGroupOffsets); block 0 writes the per-group problem shapes, A/B/D pointer
//     arrays and strides into the workspace; all blocks together zero what no GEMM tile writes
//     (ragged m: rows past the last group; ragged k: out[g] of every group with no rows). When
//     nothing is unwritten the blocks exit right after the offsets.
//  2. The CUTLASS grouped kernel, given only the device problem-shape array (no host copy): its
//     persistent group tile scheduler (PersistentTileSchedulerSm90Group) reads the shapes on the
//     GPU. A group with M = 0 has 0 tiles and is never scheduled (see the .cu for the proof).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cuda/device_gemm.h"
#include "grouped_gemm_args.h"
#include "xla/ffi/api/ffi.h"

namespace te_async {

// Shapes the instantiations run (CutlassShapeEligible and a form that exists).
bool CutlassSm90Supports(const GroupedGemmShape& s);

// The config a supported shape runs: `override_name` (TE_ASYNC_CUTLASS_CONFIG, which te_async/plan.py
// reads and validates) when the shape's form runs it, else the heuristic of the .cu. An error when
// the name is no config at all.
xla::ffi::ErrorOr<std::string> CutlassSm90Config(const GroupedGemmShape& s, std::string_view override_name);

// Workspace of a supported shape on a device with `sm_count` SMs, the same for every config of its
// form (the largest), so that choosing a config never changes the buffer XLA allocates.
size_t CutlassSm90WorkspaceBytes(const GroupedGemmShape& s, int sm_count);

namespace cutlass_sm90 {

// The three GEMM forms of a grouped GEMM (device_gemm.h / grouped_gemm_args.h):
//   kRaggedM:   out[rows_g] = lhs[rows_g] @ rhs[g],   rhs [G,K,N]  (A K-major, B N-major)
//   kRaggedMT:  out[rows_g] = lhs[rows_g] @ rhs[g]^T, rhs [G,N,K]  (A K-major, B K-major)
//   kRaggedK:   out[g] = lhs[rows_g]^T @ rhs[rows_g], out [G,K,N]  (A M-major, B N-major)
enum class Form : int { kRaggedM = 0, kRaggedMT = 1, kRaggedK = 2 };

// Kernel configs: schedule, CTA tile (M x N x K-step) and cluster (M x N).
enum class Tile : int {
  kCoop128x256C1x2 = 0,  // cooperative, 2 consumer warp groups on one 128x256 tile, A multicast
  kCoop128x256C1x1 = 1,  // same tile, no cluster: the forward and dgrad GEMMs (ragged m)
  kPing64x128C1x1 = 2,   // ping-pong, one warp group per 64x128 tile: groups of a few dozen rows
  kPing128x128C1x2 = 3,  // ping-pong 128x128: epilogue of one warp group hidden behind the other's
  kPing128x128C2x1 = 4,  //   mainloop; for short reductions (few K-steps a tile)
  kCoop128x256C2x1 = 5,  // cooperative 128x256, B multicast (torch._grouped_mm's sm90 config)
};
inline constexpr int kNumTiles = 6;

// Which forms run each config. CMakeLists.txt reads the lines of kTileForms (one per config) and
// compiles one TU per (dtype, form, config) listed here, so a config costs build time only where
// it is used: 4 per ragged-m form, 4 for ragged k, times 2 dtypes.
enum FormBit : unsigned { kFormM = 1u << 0, kFormMT = 1u << 1, kFormK = 1u << 2 };
struct TileForms {
  Tile tile;
  unsigned forms;
};
inline constexpr TileForms kTileForms[kNumTiles] = {
    {Tile::kCoop128x256C1x2, kFormM | kFormMT | kFormK},
    {Tile::kCoop128x256C1x1, kFormM | kFormMT},
    {Tile::kPing64x128C1x1, kFormM | kFormMT},
    {Tile::kPing128x128C1x2, kFormM | kFormMT | kFormK},
    {Tile::kPing128x128C2x1, kFormK},
    {Tile::kCoop128x256C2x1, kFormK},
};

constexpr bool FormHasTile(Form f, Tile t) {
  for (const TileForms& e : kTileForms) {
    if (e.tile == t) return (e.forms & (1u << static_cast<int>(f))) != 0;
  }
  return false;
}

inline const char* TileName(Tile t) {
  switch (t) {
    case Tile::kCoop128x256C1x2:
      return "cutlass_sm90_coop_128x256x64_c1x2";
    case Tile::kCoop128x256C1x1:
      return "cutlass_sm90_coop_128x256x64_c1x1";
    case Tile::kPing64x128C1x1:
      return "cutlass_sm90_pingpong_64x128x64_c1x1";
    case Tile::kPing128x128C1x2:
      return "cutlass_sm90_pingpong_128x128x64_c1x2";
    case Tile::kPing128x128C2x1:
      return "cutlass_sm90_pingpong_128x128x64_c2x1";
    case Tile::kCoop128x256C2x1:
      return "cutlass_sm90_coop_128x256x64_c2x1";
  }
  return "unknown";
}

inline std::optional<Tile> TileFromName(std::string_view name) {
  for (int i = 0; i < kNumTiles; ++i) {
    if (name == TileName(static_cast<Tile>(i))) return static_cast<Tile>(i);
  }
  return std::nullopt;
}

// Workspace layout (offsets from DeviceGemm::workspace, each sub-buffer 256-byte aligned):
//   shapes    G x cute::Shape<int,int,int>    per-group (M, N, K) of the GEMM
//   ptr_a     G x pointer                     A of group g
//   ptr_b     G x pointer                     B of group g
//   ptr_d     G x pointer                     D of group g
//   stride_a  G x 8 bytes                     CUTLASS InternalStrideA (one int64 leading dim)
//   stride_b  G x 8 bytes                     InternalStrideB
//   stride_d  G x 8 bytes                     InternalStrideD
//   cutlass   Gemm::get_workspace_size(args)  per-SM TMA descriptor copies of the kernel
inline constexpr size_t kProblemShapeBytes = 3 * sizeof(int);
inline constexpr size_t kStrideBytes = sizeof(int64_t);

constexpr size_t Align256(size_t x) { return (x + 255) & ~size_t{255}; }

struct WorkspaceLayout {
  size_t shapes = 0, ptr_a = 0, ptr_b = 0, ptr_d = 0, stride_a = 0, stride_b = 0, stride_d = 0;
  size_t cutlass = 0, total = 0;
};

inline WorkspaceLayout MakeWorkspaceLayout(int64_t groups, size_t cutlass_bytes) {
  const size_t g = groups > 0 ? static_cast<size_t>(groups) : 0;
  WorkspaceLayout l;
  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += Align256(bytes);
    return at;
  };
  l.shapes = take(g * kProblemShapeBytes);
  l.ptr_a = take(g * sizeof(void*));
  l.ptr_b = take(g * sizeof(void*));
  l.ptr_d = take(g * sizeof(void*));
  l.stride_a = take(g * kStrideBytes);
  l.stride_b = take(g * kStrideBytes);
  l.stride_d = take(g * kStrideBytes);
  l.cutlass = take(cutlass_bytes);
  l.total = off;
  return l;
}

// Per-instance entry points, defined by explicit instantiation in the TUs that CMakeLists.txt
// generates, one per (dtype, form, config) of kTileForms; call them only where FormHasTile.
//   CutlassBytes: Gemm::get_workspace_size for `groups` groups on `sm_count` SMs (host only).
//   Run: the setup kernel and the grouped GEMM, on `stream`. The caller has checked the shape
//        (Supports, non-degenerate extents), the alignment and the workspace size.
template <xla::ffi::DataType D, Form F, Tile T>
size_t CutlassBytes(int64_t groups, int sm_count);

template <xla::ffi::DataType D, Form F, Tile T>
xla::ffi::Error Run(const DeviceGemm& g, cudaStream_t stream);

}  // namespace cutlass_sm90
}  // namespace te_async

// ------------------------------------------------------------------------------------------------
// Kernel side: only in the instantiation TUs.
// ------------------------------------------------------------------------------------------------
#if defined(TE_ASYNC_CUTLASS_KERNELS)

#include <cstdio>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/numeric_types.h"
#include "cuda/cuda_check.h"
#include "cuda/group_layout.cuh"
#include "debug_flags.h"

namespace te_async {
namespace cutlass_sm90 {

template <xla::ffi::DataType D>
struct ElementOf;
template <>
struct ElementOf<xla::ffi::DataType::BF16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct ElementOf<xla::ffi::DataType::F16> {
  using type = cutlass::half_t;
};

// Layout tags of A (M x K) and B (N x K, CUTLASS's convention) per form; D is always row-major.
template <Form F>
struct FormTraits {
  using LayoutA = std::conditional_t<F == Form::kRaggedK, cutlass::layout::ColumnMajor,
                                     cutlass::layout::RowMajor>;
  using LayoutB = std::conditional_t<F == Form::kRaggedMT, cutlass::layout::ColumnMajor,
                                     cutlass::layout::RowMajor>;
  using LayoutD = cutlass::layout::RowMajor;
};

// CTA tile (M x N x 64), cluster (M x N) and schedule of a config.
template <int kTileM, int kTileN, int kClusterM, int kClusterN, bool kCooperative>
struct TileSpec {
  using TileShape = cute::Shape<cute::Int<kTileM>, cute::Int<kTileN>, cute::_64>;
  using ClusterShape = cute::Shape<cute::Int<kClusterM>, cute::Int<kClusterN>, cute::_1>;
  using KernelSchedule = std::conditional_t<kCooperative, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative,
                                            cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = std::conditional_t<kCooperative, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
                                              cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong>;
};

template <Tile T>
struct TileTraits;
template <>
struct TileTraits<Tile::kCoop128x256C1x2> : TileSpec<128, 256, 1, 2, true> {};
template <>
struct TileTraits<Tile::kCoop128x256C1x1> : TileSpec<128, 256, 1, 1, true> {};
template <>
struct TileTraits<Tile::kPing64x128C1x1> : TileSpec<64, 128, 1, 1, false> {};
template <>
struct TileTraits<Tile::kPing128x128C1x2> : TileSpec<128, 128, 1, 2, false> {};
template <>
struct TileTraits<Tile::kPing128x128C2x1> : TileSpec<128, 128, 2, 1, false> {};
template <>
struct TileTraits<Tile::kCoop128x256C2x1> : TileSpec<128, 256, 2, 1, true> {};

// The CUTLASS kernel of one (dtype, form, tile): f32 accumulation, D = acc in the input dtype,
// no C operand (ElementC = void: no source load, no C smem; beta stays 0).
template <xla::ffi::DataType D, Form F, Tile T>
struct GemmConfig {
  using Element = typename ElementOf<D>::type;
  using Accumulator = float;
  using LayoutA = typename FormTraits<F>::LayoutA;
  using LayoutB = typename FormTraits<F>::LayoutB;
  using LayoutD = typename FormTraits<F>::LayoutD;
  static constexpr int kAlignment = 16 / sizeof(Element);  // 8 elements: TMA's 16 bytes
  using TileShape = typename TileTraits<T>::TileShape;
  using ClusterShape = typename TileTraits<T>::ClusterShape;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, Accumulator, Accumulator,
      void, LayoutD*, kAlignment,      // C: none
      Element, LayoutD*, kAlignment,   // D
      typename TileTraits<T>::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<Element, Accumulator, void, Accumulator>>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment, Element,
      LayoutB*, kAlignment, Accumulator, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename TileTraits<T>::KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  using UnderlyingShape = typename ProblemShape::UnderlyingProblemShape;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;

  static_assert(sizeof(UnderlyingShape) == kProblemShapeBytes, "problem shape layout");
  static_assert(sizeof(StrideA) == kStrideBytes && sizeof(StrideB) == kStrideBytes &&
                    sizeof(StrideD) == kStrideBytes,
                "each stride holds exactly one int64 leading dimension");
  static_assert(cute::is_pointer_v<typename Kernel::StrideA>, "grouped (pointer-to-stride) kernel");
};

// A CUTLASS stride with one dynamic (int64) mode and static unit/zero modes, with that mode set.
// Built by value from the tuple's element types: assigning through cute::get<I>(s) compiled to
// stores of zero in this TU's SetupKernel (SASS `STG.E.64 [...], RZ`), which made every group's
// TMA leading dimension 0 and every output wrong (H200, 2026-11-30).
template <class Stride>
__device__ __forceinline__ Stride MakeLeadingStride(int64_t ld) {
  using M0 = cute::tuple_element_t<0, Stride>;
  using M1 = cute::tuple_element_t<1, Stride>;
  using M2 = cute::tuple_element_t<2, Stride>;
  if constexpr (std::is_same_v<M0, int64_t>) {
    return Stride{ld, M1{}, M2{}};
  } else {
    static_assert(std::is_same_v<M1, int64_t>, "the one int64 leading dimension is mode 0 or 1");
    return Stride{M0{}, ld, M2{}};
  }
}

inline constexpr int kSetupThreads = 256;

template <class Element, class Shape, class StrideA, class StrideB, class StrideD>
struct SetupParams {
  const int32_t* sizes;
  unsigned long long* clamped_calls;  // DeviceCounters::clamped_calls
  int groups;
  int rows;  // M, the ragged dimension
  int64_t k;
  int64_t n;
  const Element* lhs;
  const Element* rhs;
  Element* out;
  Shape* shapes;
  const Element** ptr_a;
  const Element** ptr_b;
  Element** ptr_d;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
};

// Every block computes the clamped offsets (group_layout.cuh); block 0 writes the per-group GEMM
// arguments; all blocks zero what no tile writes. Extents: ragged m group g is the GEMM
// (m_g x N x K); ragged k group g is (K x N x m_g). A group with no rows gets M = 0, i.e. no tiles.
template <Form F, class Element, class Shape, class StrideA, class StrideB, class StrideD>
__global__ void __launch_bounds__(kSetupThreads)
    SetupKernel(SetupParams<Element, Shape, StrideA, StrideB, StrideD> p) {
  __shared__ int offsets[kMaxGroups + 1];
  LoadGroupOffsets<kSetupThreads>(p.sizes, p.groups, p.rows, offsets, p.clamped_calls);

  const int64_t k = p.k, n = p.n;
  if (blockIdx.x == 0) {
    for (int g = threadIdx.x; g < p.groups; g += kSetupThreads) {
      const int64_t row0 = offsets[g];
      const int m = offsets[g + 1] - offsets[g];
      if constexpr (F == Form::kRaggedK) {
        p.shapes[g] = m > 0 ? Shape(static_cast<int>(k), static_cast<int>(n), m) : Shape(0, static_cast<int>(n), 0);
        p.ptr_a[g] = p.lhs + row0 * k;          // (K x m_g) M-major view of lhs rows, ld K
        p.ptr_b[g] = p.rhs + row0 * n;          // (N x m_g) N-major view of rhs rows, ld N
        p.ptr_d[g] = p.out + g * k * n;         // out[g], K x N row-major
      } else {
        p.shapes[g] = Shape(m, static_cast<int>(n), static_cast<int>(k));
        p.ptr_a[g] = p.lhs + row0 * k;          // lhs rows, m_g x K row-major
        p.ptr_b[g] = p.rhs + g * k * n;         // rhs[g]: K x N (N-major) or N x K (K-major)
        p.ptr_d[g] = p.out + row0 * n;          // out rows, m_g x N row-major
      }
      p.stride_a[g] = MakeLeadingStride<StrideA>(k);
      p.stride_b[g] = MakeLeadingStride<StrideB>(F == Form::kRaggedMT ? k : n);
      p.stride_d[g] = MakeLeadingStride<StrideD>(n);
    }
  }

  // Zero-fill, 16 bytes a store: every region starts and ends on a multiple of N elements, and
  // N * sizeof(Element) is a multiple of 16 (N % 8 == 0); `out` is 16-byte aligned (checked).
  constexpr int64_t kVec = 16 / sizeof(Element);
  uint4* out = reinterpret_cast<uint4*>(p.out);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kSetupThreads;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kSetupThreads + threadIdx.x;
  if constexpr (F == Form::kRaggedK) {
    const int64_t group_vecs = k * n / kVec;
    for (int g = 0; g < p.groups; ++g) {
      if (offsets[g + 1] != offsets[g]) continue;  // same for all threads: shared memory
      uint4* dst = out + g * group_vecs;
      for (int64_t i = first; i < group_vecs; i += stride) dst[i] = zero;
    }
  } else {
    const int64_t total = offsets[p.groups];
    const int64_t vecs = (static_cast<int64_t>(p.rows) - total) * n / kVec;
    uint4* dst = out + total * n / kVec;
    for (int64_t i = first; i < vecs; i += stride) dst[i] = zero;
  }
}

// What the setup kernel wrote for the first groups, to stderr (TE_ASYNC_DEBUG_CUTLASS=1).
template <class Params>
xla::ffi::Error PrintSetup(const Params& p, cudaStream_t stream) {
  TE_ASYNC_CUDA(cudaStreamSynchronize(stream));
  const int shown = p.groups < 3 ? p.groups : 3;
  int shapes[9] = {};
  const void* ptrs[3][3] = {};
  int64_t strides[3][3] = {};
  TE_ASYNC_CUDA(cudaMemcpy(shapes, p.shapes, shown * kProblemShapeBytes, cudaMemcpyDeviceToHost));
  TE_ASYNC_CUDA(cudaMemcpy(ptrs[0], p.ptr_a, shown * sizeof(void*), cudaMemcpyDeviceToHost));
  TE_ASYNC_CUDA(cudaMemcpy(ptrs[1], p.ptr_b, shown * sizeof(void*), cudaMemcpyDeviceToHost));
  TE_ASYNC_CUDA(cudaMemcpy(ptrs[2], p.ptr_d, shown * sizeof(void*), cudaMemcpyDeviceToHost));
  TE_ASYNC_CUDA(cudaMemcpy(strides[0], p.stride_a, shown * kStrideBytes, cudaMemcpyDeviceToHost));
  TE_ASYNC_CUDA(cudaMemcpy(strides[1], p.stride_b, shown * kStrideBytes, cudaMemcpyDeviceToHost));
  TE_ASYNC_CUDA(cudaMemcpy(strides[2], p.stride_d, shown * kStrideBytes, cudaMemcpyDeviceToHost));
  std::fprintf(stderr, "te_async cutlass debug: lhs %p rhs %p out %p groups %d rows %d k %lld n %lld\n",
               static_cast<const void*>(p.lhs), static_cast<const void*>(p.rhs), static_cast<void*>(p.out),
               p.groups, p.rows, static_cast<long long>(p.k), static_cast<long long>(p.n));
  for (int g = 0; g < shown; ++g) {
    std::fprintf(stderr, "  group %d shape (%d,%d,%d) a %p b %p d %p lda %lld ldb %lld ldd %lld\n", g, shapes[3 * g],
                 shapes[3 * g + 1], shapes[3 * g + 2], ptrs[0][g], ptrs[1][g], ptrs[2][g],
                 static_cast<long long>(strides[0][g]), static_cast<long long>(strides[1][g]),
                 static_cast<long long>(strides[2][g]));
  }
  return xla::ffi::Error::Success();
}

template <class Config>
typename Config::Gemm::Arguments MakeArguments(int64_t groups, int sm_count, int device,
                                               const WorkspaceLayout* layout, char* workspace) {
  using Gemm = typename Config::Gemm;
  using Element = typename Config::Element;
  typename Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  args.problem_shape.num_groups = static_cast<int32_t>(groups);
  args.problem_shape.problem_shapes = nullptr;
  args.problem_shape.host_problem_shapes = nullptr;  // shapes live on the device only
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.thread.beta = 0.0f;
  args.epilogue.ptr_C = nullptr;
  args.epilogue.dC = nullptr;
  if (layout != nullptr) {
    args.problem_shape.problem_shapes =
        reinterpret_cast<typename Config::UnderlyingShape*>(workspace + layout->shapes);
    args.mainloop.ptr_A = reinterpret_cast<const Element**>(workspace + layout->ptr_a);
    args.mainloop.dA = reinterpret_cast<typename Config::StrideA*>(workspace + layout->stride_a);
    args.mainloop.ptr_B = reinterpret_cast<const Element**>(workspace + layout->ptr_b);
    args.mainloop.dB = reinterpret_cast<typename Config::StrideB*>(workspace + layout->stride_b);
    args.epilogue.ptr_D = reinterpret_cast<Element**>(workspace + layout->ptr_d);
    args.epilogue.dD = reinterpret_cast<typename Config::StrideD*>(workspace + layout->stride_d);
  }
  return args;
}

template <xla::ffi::DataType D, Form F, Tile T>
size_t CutlassBytes(int64_t groups, int sm_count) {
  using Config = GemmConfig<D, F, T>;
  // get_workspace_size reads only sm_count (> 0 here, so no device query) and the mode.
  const auto args = MakeArguments<Config>(groups, sm_count > 0 ? sm_count : 1, 0, nullptr, nullptr);
  return Config::Gemm::get_workspace_size(args);
}

inline std::string CutlassCallError(const char* call, cutlass::Status status, Tile tile) {
  return std::string("te_async: CUTLASS ") + call + " failed for " + TileName(tile) + ": " +
         cutlassGetStatusString(status);
}

template <xla::ffi::DataType D, Form F, Tile T>
xla::ffi::Error Run(const DeviceGemm& g, cudaStream_t stream) {
  using Config = GemmConfig<D, F, T>;
  using Gemm = typename Config::Gemm;
  using Element = typename Config::Element;
  const GroupedGemmShape& s = g.s;

  // The handler checked the workspace against CutlassSm90WorkspaceBytes, the largest of the form.
  const WorkspaceLayout layout = MakeWorkspaceLayout(s.groups, CutlassBytes<D, F, T>(s.groups, g.sm_count));
  char* ws = static_cast<char*>(g.workspace);

  // 1. Per-group arguments and zero-fill, from the device-side group sizes.
  using Params = SetupParams<Element, typename Config::UnderlyingShape, typename Config::StrideA,
                             typename Config::StrideB, typename Config::StrideD>;
  Params p;
  p.sizes = g.group_sizes;
  p.clamped_calls = g.clamped_calls;
  p.groups = static_cast<int>(s.groups);
  p.rows = static_cast<int>(s.rows);
  p.k = s.k;
  p.n = s.n;
  p.lhs = static_cast<const Element*>(g.lhs);
  p.rhs = static_cast<const Element*>(g.rhs);
  p.out = static_cast<Element*>(g.out);
  p.shapes = reinterpret_cast<typename Config::UnderlyingShape*>(ws + layout.shapes);
  p.ptr_a = reinterpret_cast<const Element**>(ws + layout.ptr_a);
  p.ptr_b = reinterpret_cast<const Element**>(ws + layout.ptr_b);
  p.ptr_d = reinterpret_cast<Element**>(ws + layout.ptr_d);
  p.stride_a = reinterpret_cast<typename Config::StrideA*>(ws + layout.stride_a);
  p.stride_b = reinterpret_cast<typename Config::StrideB*>(ws + layout.stride_b);
  p.stride_d = reinterpret_cast<typename Config::StrideD*>(ws + layout.stride_d);
  // Enough blocks to zero the largest possible unwritten region at full speed, at most one per SM.
  const int64_t max_zero_vecs = (F == Form::kRaggedK ? s.groups * s.k : s.rows) * s.n / 8;
  const int64_t per_block = int64_t{kSetupThreads} * 16;
  const int64_t want = (max_zero_vecs + per_block - 1) / per_block;
  const int blocks = static_cast<int>(want < 1 ? 1 : (want > g.sm_count ? g.sm_count : want));
  SetupKernel<F><<<blocks, kSetupThreads, 0, stream>>>(p);
  TE_ASYNC_CUDA(cudaGetLastError());
  if (DebugCutlass()) TE_ASYNC_RETURN_IF_ERROR(PrintSetup(p, stream));

  // 2. The grouped GEMM. initialize() launches nothing: the kernel's initialize_workspace only
  // forwards to the collectives' (no-op for this mainloop, a void-C epilogue and the group
  // scheduler); it builds the TMA descriptor templates on the host and sets the smem attribute.
  int device = 0;
  TE_ASYNC_CUDA(cudaGetDevice(&device));
  const auto args = MakeArguments<Config>(s.groups, g.sm_count, device, &layout, ws);
  Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess) {
    return xla::ffi::Error::InvalidArgument(CutlassCallError("can_implement", st, T));
  }
  st = gemm.initialize(args, ws + layout.cutlass, stream);
  if (st != cutlass::Status::kSuccess) {
    (void)cudaGetLastError();
    return xla::ffi::Error::Internal(CutlassCallError("initialize", st, T));
  }
  st = gemm.run(stream);
  if (st != cutlass::Status::kSuccess) {
    const cudaError_t e = cudaGetLastError();
    return xla::ffi::Error::Internal(CutlassCallError("run", st, T) + " (" + cudaGetErrorName(e) + ")");
  }
  TE_ASYNC_CUDA(cudaGetLastError());
  if (DebugCutlass()) {
    const cudaError_t done = cudaStreamSynchronize(stream);
    std::fprintf(stderr, "te_async cutlass debug: %s ran, stream sync: %s\n", TileName(T), cudaGetErrorName(done));
    TE_ASYNC_CUDA(done);
  }
  return xla::ffi::Error::Success();
}

}  // namespace cutlass_sm90
}  // namespace te_async

// Explicit instantiation of one (dtype, form, tile) in a TU generated by CMakeLists.txt.
#define TE_ASYNC_CUTLASS_INSTANTIATE(dtype, form, tile)                                            \
  namespace te_async::cutlass_sm90 {                                                               \
  template size_t CutlassBytes<xla::ffi::DataType::dtype, Form::form, Tile::tile>(int64_t, int);   \
  template xla::ffi::Error Run<xla::ffi::DataType::dtype, Form::form, Tile::tile>(const DeviceGemm&, \
                                                                                  cudaStream_t);   \
  }

#endif  // TE_ASYNC_CUTLASS_KERNELS
