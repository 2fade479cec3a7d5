// CUTLASS sm90a grouped GEMM, "large groups" path of the device-sized grouped GEMM: shape checks,
// workspace sizing, config choice and dispatch to the instantiations
// (cutlass_grouped_gemm_<dtype>_<form>.cu). The kernels themselves are in cutlass_grouped_gemm.h.
//
// Facts about CUTLASS 4.2 this file and the header rely on (checked in the sources):
//  * Empty groups. PersistentTileSchedulerSm90Group (cutlass/gemm/kernel/sm90_tile_scheduler_group.hpp)
//    counts a group's tiles as round_up(ceil(M / tile_m), cluster_m * swizzle) * round_up(ceil(N /
//    tile_n), ...); with M = 0 that is 0. get_work_idx_m_and_n picks, among 32 groups at a time,
//    the first whose [start, start + tiles) range holds the linear tile index; a 0-tile range holds
//    nothing, so a group with M = 0 is never returned, its pointers/strides are never read, its
//    TMA descriptors never updated. The constructor's first-group count (group 0 with M = 0 gives
//    0 tiles) goes through the same search. If every group is empty, every CTA gets an invalid
//    first tile and returns at "if (not work_tile_info.is_valid()) return;" before any pipeline
//    wait (sm90_gemm_array_tma_warpspecialized_{cooperative,pingpong}.hpp).
//  * K = 0 is NOT safe to run: the mainloop (sm90_mma_array_tma_gmma_ss_warpspecialized.hpp,
//    mma()) issues no GMMA for k_tile_count = 0, so the accumulators are never zeroed and the
//    epilogue would store garbage. Hence ragged-k groups with no rows get M = 0 (no tiles) and
//    the setup kernel zeroes their out[g]; ragged m with K = 0 is a plain memset here.
//  * Out-of-bounds: per group, the kernel rewrites the A/B/D TMA descriptors' dims and strides from
//    the device problem shape (tensormaps_replace_global_tensor_properties), so loads past a
//    group's rows / K extent are zero-filled by TMA and stores past its rows are clipped: no tile
//    reads or writes a neighbouring group's rows.
//  * No host problem shapes: can_implement skips the per-group alignment loops
//    (is_host_problem_shape_available() false), get_tiled_cta_shape_mnl uses sm_count CTAs and the
//    grid is sized from hw_info.sm_count only (PersistentTileSchedulerSm90GroupParams::get_grid_shape).
//  * Stream capture: GemmUniversalAdapter::initialize calls GemmKernel::initialize_workspace
//    (collectives: no-op; group scheduler: no-op), to_underlying_arguments (host TMA descriptor
//    encoding through cudaGetDriverEntryPointByVersion, no stream work) and cudaFuncSetAttribute
//    (max dynamic smem); run() launches with cudaLaunchKernelExC (cluster) or kernel_launch (1x1)
//    on the given stream and checks cudaGetLastError. Nothing synchronises or allocates.
//  * Workspace: get_workspace_size is the epilogue's (sm_count x 2 D descriptors, no C) plus the
//    mainloop's (sm_count x 2 A/B descriptors) TMA descriptor copies, each rounded to 64 bytes;
//    it only reads hw_info.sm_count (queries the device only when sm_count <= 0, never here).
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/cutlass_grouped_gemm.h"
#include "device_kernel_choice.h"
#include "cuda/device_gemm.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

namespace ffi = xla::ffi;
using cutlass_sm90::Form;
using cutlass_sm90::Tile;

constexpr Tile kAllTiles[] = {Tile::kCoop128x256C1x2, Tile::kCoop128x256C2x1, Tile::kPing64x128C1x1,
                              Tile::kPing128x128C1x2, Tile::kPing128x128C2x1};

Form FormOf(const GroupedGemmShape& s) {
  if (s.ragged_k) return Form::kRaggedK;
  return s.transpose_rhs ? Form::kRaggedMT : Form::kRaggedM;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Share of a 2-CTA cluster's tile slots that are padding, for `tiles` tiles along its axis.
double ClusterPad(int64_t tiles) { return tiles % 2 == 0 ? 0.0 : 1.0 / static_cast<double>(tiles); }

// Tile config by heuristic on the static shape only (the same answer at trace time and at run
// time; group sizes are never seen). r = M / G is the average rows per group.
//
// Both forms: a tile whose reduction is short (fewer than 16 K-steps of 64) spends a large share
// of its time in the epilogue (storing 32-64 KB per tile). Ping-pong runs one warp group's
// epilogue under the other warp group's mainloop, so short reductions use ping-pong 128x128x64;
// long ones use cooperative 128x256x64 (the fastest bf16 tile on H100/H200 for long K: 2 consumer
// warp groups of 64x256, 4 smem stages, the best flop per byte of L2 traffic).
// Clusters of 2 CTAs multicast one operand to both, but pad the group's tile grid to an even
// count along the cluster axis, and a padded tile runs the whole mainloop on zero-filled data.
// So the axis is chosen by padding: along N, ceil(N/tile_n) is exact; along M (ragged m), the
// tile count per group is estimated from the average r and, as real MoE group sizes vary, pads
// half a tile per group on average anyway; so M (2x1) only when it pads strictly less.
//
// Ragged m (forward, dgrad): group g is an (m_g x N) output with the full K reduction.
//  * r <= 64: ping-pong 64x128x64, no cluster. Groups of a few dozen rows fill a 128-row tile
//    half or less, and a cluster along M would pair a real tile with an empty one.
//  * K < 1024: ping-pong 128x128x64, cluster 1x2.
//  * else cooperative 128x256x64, cluster 1x2 (A multicast) unless 2x1 (B multicast) pads less:
//    pad(1x2) = [ceil(N/256) odd] / ceil(N/256), pad(2x1) = [ceil(r/128) odd] / ceil(r/128).
//    DeepSeek-V2-Lite, 64 groups x 384 rows: fc1 N=2816 -> 11 N-tiles (pad 1/11) vs 3 M-tiles
//    (pad 1/3) -> 1x2; fc2 N=2048 -> 8 N-tiles, no padding -> 1x2. (A 2x1 cluster, as
//    torch._grouped_mm uses, runs 4 M-tiles per 3-tile group: a third of its tiles are padding.)
// Ragged k (wgrad): group g is a (K x N) output with an m_g-long reduction; the output tile grid
// is exact (static K and N), only the reduction length, about r, varies.
//  * r >= 1024: cooperative 128x256x64, cluster 1x2.
//  * shorter: ping-pong 128x128x64, cluster 1x2 when ceil(N/128) is even, 2x1 when only
//    ceil(K/128) is, else the smaller padding.
// TE_ASYNC_CUTLASS_CONFIG=<config name> overrides the choice when the form instantiates that
// config (for benchmarks; the workspace covers every config of the form).
Tile HeuristicTile(const GroupedGemmShape& s) {
  constexpr int64_t kLongReduction = 1024;
  const int64_t groups = s.groups > 0 ? s.groups : 1;
  const int64_t r = s.rows / groups;
  if (!s.ragged_k) {
    if (r <= 64) return Tile::kPing64x128C1x1;
    if (s.k < kLongReduction) return Tile::kPing128x128C1x2;
    const double pad_n = ClusterPad(CeilDiv(s.n, 256));
    const double pad_m = ClusterPad(CeilDiv(r, 128));
    return pad_m < pad_n ? Tile::kCoop128x256C2x1 : Tile::kCoop128x256C1x2;
  }
  if (r >= kLongReduction) return Tile::kCoop128x256C1x2;
  const double pad_n = ClusterPad(CeilDiv(s.n, 128));
  const double pad_m = ClusterPad(CeilDiv(s.k, 128));
  return pad_m < pad_n ? Tile::kPing128x128C2x1 : Tile::kPing128x128C1x2;
}

const char* OverrideName() {
  static const char* name = [] {
    const char* v = std::getenv("TE_ASYNC_CUTLASS_CONFIG");
    return v != nullptr && *v != '\0' ? v : static_cast<const char*>(nullptr);
  }();
  return name;
}

Tile ChooseTile(const GroupedGemmShape& s) {
  const Form f = FormOf(s);
  if (const char* name = OverrideName()) {
    for (Tile t : kAllTiles) {
      if (cutlass_sm90::FormHasTile(f, t) && std::strcmp(name, cutlass_sm90::TileName(t)) == 0) return t;
    }
  }
  return HeuristicTile(s);
}

template <ffi::DataType D, Form F>
size_t FormCutlassBytes(Tile t, int64_t groups, int sm_count) {
  switch (t) {
    case Tile::kCoop128x256C1x2:
      return cutlass_sm90::CutlassBytes<D, F, Tile::kCoop128x256C1x2>(groups, sm_count);
    case Tile::kCoop128x256C2x1:
      if constexpr (cutlass_sm90::FormHasTile(F, Tile::kCoop128x256C2x1)) {
        return cutlass_sm90::CutlassBytes<D, F, Tile::kCoop128x256C2x1>(groups, sm_count);
      }
      break;
    case Tile::kPing64x128C1x1:
      if constexpr (cutlass_sm90::FormHasTile(F, Tile::kPing64x128C1x1)) {
        return cutlass_sm90::CutlassBytes<D, F, Tile::kPing64x128C1x1>(groups, sm_count);
      }
      break;
    case Tile::kPing128x128C1x2:
      if constexpr (cutlass_sm90::FormHasTile(F, Tile::kPing128x128C1x2)) {
        return cutlass_sm90::CutlassBytes<D, F, Tile::kPing128x128C1x2>(groups, sm_count);
      }
      break;
    case Tile::kPing128x128C2x1:
      if constexpr (cutlass_sm90::FormHasTile(F, Tile::kPing128x128C2x1)) {
        return cutlass_sm90::CutlassBytes<D, F, Tile::kPing128x128C2x1>(groups, sm_count);
      }
      break;
  }
  return 0;
}

template <ffi::DataType D, Form F>
ffi::Error FormRun(Tile t, const DeviceGemm& g, cudaStream_t stream) {
  switch (t) {
    case Tile::kCoop128x256C1x2:
      return cutlass_sm90::Run<D, F, Tile::kCoop128x256C1x2>(g, stream);
    case Tile::kCoop128x256C2x1:
      if constexpr (cutlass_sm90::FormHasTile(F, Tile::kCoop128x256C2x1)) {
        return cutlass_sm90::Run<D, F, Tile::kCoop128x256C2x1>(g, stream);
      }
      break;
    case Tile::kPing64x128C1x1:
      if constexpr (cutlass_sm90::FormHasTile(F, Tile::kPing64x128C1x1)) {
        return cutlass_sm90::Run<D, F, Tile::kPing64x128C1x1>(g, stream);
      }
      break;
    case Tile::kPing128x128C1x2:
      if constexpr (cutlass_sm90::FormHasTile(F, Tile::kPing128x128C1x2)) {
        return cutlass_sm90::Run<D, F, Tile::kPing128x128C1x2>(g, stream);
      }
      break;
    case Tile::kPing128x128C2x1:
      if constexpr (cutlass_sm90::FormHasTile(F, Tile::kPing128x128C2x1)) {
        return cutlass_sm90::Run<D, F, Tile::kPing128x128C2x1>(g, stream);
      }
      break;
  }
  return ffi::Error::Internal(std::string("te_async: no CUTLASS instance for ") + cutlass_sm90::TileName(t));
}

template <ffi::DataType D>
size_t DtypeCutlassBytes(Form f, Tile t, int64_t groups, int sm_count) {
  switch (f) {
    case Form::kRaggedM:
      return FormCutlassBytes<D, Form::kRaggedM>(t, groups, sm_count);
    case Form::kRaggedMT:
      return FormCutlassBytes<D, Form::kRaggedMT>(t, groups, sm_count);
    case Form::kRaggedK:
      return FormCutlassBytes<D, Form::kRaggedK>(t, groups, sm_count);
  }
  return 0;
}

template <ffi::DataType D>
ffi::Error DtypeRun(Form f, Tile t, const DeviceGemm& g, cudaStream_t stream) {
  switch (f) {
    case Form::kRaggedM:
      return FormRun<D, Form::kRaggedM>(t, g, stream);
    case Form::kRaggedMT:
      return FormRun<D, Form::kRaggedMT>(t, g, stream);
    case Form::kRaggedK:
      return FormRun<D, Form::kRaggedK>(t, g, stream);
  }
  return ffi::Error::Internal("te_async: bad CUTLASS form");
}

// CUTLASS's own workspace: the largest over the form's configs, so that the size does not depend
// on the choice (or on TE_ASYNC_CUTLASS_CONFIG); the difference is a few KB of descriptors.
size_t MaxCutlassBytes(const GroupedGemmShape& s, int sm_count) {
  const Form f = FormOf(s);
  size_t most = 0;
  for (Tile t : kAllTiles) {
    if (!cutlass_sm90::FormHasTile(f, t)) continue;
    const size_t b = s.in_type == ffi::DataType::BF16
                         ? DtypeCutlassBytes<ffi::DataType::BF16>(f, t, s.groups, sm_count)
                         : DtypeCutlassBytes<ffi::DataType::F16>(f, t, s.groups, sm_count);
    most = b > most ? b : most;
  }
  return most;
}

bool Aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

std::string ShapeText(const GroupedGemmShape& s) {
  return "G=" + std::to_string(s.groups) + " M=" + std::to_string(s.rows) + " K=" + std::to_string(s.k) +
         " N=" + std::to_string(s.n) + (s.ragged_k ? " ragged_k" : (s.transpose_rhs ? " ragged_m rhs^T" : " ragged_m"));
}

}  // namespace

bool CutlassSm90Supports(const GroupedGemmShape& s) {
  return CutlassShapeEligible(s) && !(s.ragged_k && s.transpose_rhs) && s.groups >= 0 && s.groups <= kMaxGroups &&
         s.rows >= 0 && s.k >= 0 && s.n >= 0;
}

const char* CutlassSm90ConfigName(const GroupedGemmShape& s) {
  if (!CutlassSm90Supports(s)) return "unsupported";
  return cutlass_sm90::TileName(ChooseTile(s));
}

size_t CutlassSm90WorkspaceBytes(const GroupedGemmShape& s, int sm_count) {
  if (!CutlassSm90Supports(s)) return 0;
  // sm_count <= 0 (unknown): size for 256 SMs, more than any sm_90 part has.
  const int sms = sm_count > 0 ? sm_count : 256;
  return cutlass_sm90::MakeWorkspaceLayout(s.groups, MaxCutlassBytes(s, sms)).total;
}

ffi::Error LaunchCutlassSm90(const DeviceGemm& g, cudaStream_t stream) {
  const GroupedGemmShape& s = g.s;
  if (!CutlassSm90Supports(s)) {
    return ffi::Error::InvalidArgument("te_async: CUTLASS sm90 grouped GEMM does not support " + ShapeText(s));
  }
  const size_t elem = 2;  // bf16 / f16
  // Degenerate extents: nothing for a GEMM to do; whatever `out` holds is zero.
  const int64_t out_elems = s.ragged_k ? s.groups * s.k * s.n : s.rows * s.n;
  if (out_elems == 0) return ffi::Error::Success();
  if (s.groups == 0 || s.rows == 0 || (!s.ragged_k && s.k == 0)) {
    TE_ASYNC_CUDA(cudaMemsetAsync(g.out, 0, static_cast<size_t>(out_elems) * elem, stream));
    return ffi::Error::Success();
  }
  if (g.sm_count <= 0) {
    return ffi::Error::InvalidArgument("te_async: CUTLASS grouped GEMM needs sm_count > 0, got " +
                                       std::to_string(g.sm_count));
  }
  // TMA needs 16-byte aligned global addresses; per-group offsets keep that (K, N multiples of 8).
  // The workspace holds TMA descriptors, which need 64-byte alignment.
  if (!Aligned(g.lhs, 16) || !Aligned(g.rhs, 16) || !Aligned(g.out, 16) || !Aligned(g.workspace, 64) ||
      g.group_sizes == nullptr) {
    return ffi::Error::InvalidArgument("te_async: CUTLASS grouped GEMM needs 16-byte aligned lhs/rhs/out, a "
                                       "64-byte aligned workspace and group sizes (" + ShapeText(s) + ")");
  }
  const size_t need = cutlass_sm90::MakeWorkspaceLayout(s.groups, MaxCutlassBytes(s, g.sm_count)).total;
  if (g.workspace == nullptr || g.workspace_bytes < need) {
    return ffi::Error::InvalidArgument("te_async: CUTLASS grouped GEMM needs " + std::to_string(need) +
                                       " workspace bytes, got " + std::to_string(g.workspace_bytes) + " (" +
                                       ShapeText(s) + ", sm_count " + std::to_string(g.sm_count) + ")");
  }
  const Form f = FormOf(s);
  const Tile t = ChooseTile(s);
  return s.in_type == ffi::DataType::BF16 ? DtypeRun<ffi::DataType::BF16>(f, t, g, stream)
                                          : DtypeRun<ffi::DataType::F16>(f, t, g, stream);
}

}  // namespace te_async
