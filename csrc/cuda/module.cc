// The CUDA extension: a registrations() dict of FFI handler capsules, the device-mode planner,
// the host-size and device counters, and release() for interpreter exit.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "ffi_capsule.h"
#include "cuda/cutlass_grouped_gemm.h"
#include "cuda/decode_attention.h"
#include "cuda/device_counters.h"
#include "cuda/device_gemm.h"
#include "cuda/gqa_token.h"
#include "cuda/handlers.h"
#include "cuda/host_size_slots.h"
#include "cuda/mla_decode.h"
#include "cuda/mla_token.h"
#include "cuda/moe_routing.h"
#include "cuda/stream_pool.h"

namespace nb = nanobind;

NB_MODULE(_te_async_cuda, m) {
  m.def("registrations", []() {
    nb::dict d;
    d["te_async_copy_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kCopyGroupSizesCuda);
    d["te_async_keep_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kKeepGroupSizesCuda);
    d["te_async_reuse_group_sizes"] = te_async::EncapsulateFfiHandler(te_async::kReuseGroupSizesCuda);
    d["te_async_grouped_gemm"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmCuda);
    d["te_async_grouped_gemm_device"] = te_async::EncapsulateFfiHandler(te_async::kGroupedGemmDeviceCuda);
    d["te_async_dense_gemm"] = te_async::EncapsulateFfiHandler(te_async::kDenseGemmCuda);
    d["te_async_expert_gemm"] = te_async::EncapsulateFfiHandler(te_async::kExpertGemmCuda);
    d["te_async_route"] = te_async::EncapsulateFfiHandler(te_async::kRouteCuda);
    d["te_async_decode_attention"] = te_async::EncapsulateFfiHandler(te_async::kDecodeAttentionCuda);
    d["te_async_mla_decode"] = te_async::EncapsulateFfiHandler(te_async::kMlaDecodeCuda);
    d["te_async_mla_token"] = te_async::EncapsulateFfiHandler(te_async::kMlaTokenCuda);
    d["te_async_gqa_token"] = te_async::EncapsulateFfiHandler(te_async::kGqaTokenCuda);
    d["te_async_gqa_token_block"] = te_async::EncapsulateFfiHandler(te_async::kGqaTokenBlockCuda);
    d["te_async_token_ffn"] = te_async::EncapsulateFfiHandler(te_async::kTokenFfnCuda);
    d["te_async_token_moe"] = te_async::EncapsulateFfiHandler(te_async::kTokenMoeCuda);
    return d;
  });
  m.def("host_size_stats", [](int device) {
    const te_async::HostSizeStats s = te_async::HostSizeSlots::Stats(device);
    nb::dict d;
    d["copies"] = s.copies;
    d["event_waits"] = s.event_waits;
    d["sync_reads"] = s.sync_reads;
    d["fallback_reads"] = s.fallback_reads;
    d["reused"] = s.reused;
    d["reused_by_order"] = s.reused_by_order;
    d["reuse_misses"] = s.reuse_misses;
    const te_async::CublasLaunchStats launches = te_async::StreamPool::Stats(device);
    d["per_group_gemms"] = launches.per_group_gemms;
    d["grouped_calls"] = launches.grouped_calls;
    return d;
  });
  m.def("device_counters", [](int device) {
    auto counters = te_async::ReadCounters(device);
    if (counters.has_error()) throw std::runtime_error(counters.error().message());
    nb::dict d;
    d["clamped_calls"] = counters->clamped_calls;
    d["repaired_reads"] = counters->repaired_reads;
    return d;
  });
  // (compute capability, SM count) of `device`; it also resolves the device's counters, so that a
  // call captured into a CUDA graph never has to.
  m.def("device_info", [](int device) {
    auto info = te_async::QueryDevice(device);
    if (info.has_error()) throw std::runtime_error(info.error().message());
    if (auto counters = te_async::CountersOnDevice(device); counters.has_error()) {
      throw std::runtime_error(counters.error().message());
    }
    return std::make_tuple(info->compute_capability, info->sm_count);
  });
  // The device-mode plan of a static shape on a device of this kind: (kernel, CUTLASS config or
  // "", workspace bytes). The settings are the environment's, read and validated by te_async/plan.py.
  m.def(
      "plan_device_gemm",
      [](int64_t groups, int64_t rows, int64_t k, int64_t n, bool ragged_k, bool transpose_rhs,
         const std::string& in_dtype, const std::string& out_dtype, int compute_capability, int sm_count,
         int64_t small_groups_max_rows, const std::string& cutlass_config) {
        const te_async::GroupedGemmShape s =
            te_async::ShapeFromStatic(groups, rows, k, n, ragged_k, transpose_rhs, in_dtype, out_dtype);
        te_async::PlanSettings settings;
        settings.small_groups_max_rows = small_groups_max_rows;
        settings.cutlass_config = cutlass_config;
        auto plan = te_async::PlanDeviceGemm(s, te_async::DeviceInfo{compute_capability, sm_count}, settings);
        if (plan.has_error()) throw std::invalid_argument(plan.error().message());
        return std::make_tuple(std::string(te_async::DeviceKernelName(plan->kernel)), plan->cutlass_config,
                               plan->workspace_bytes);
      },
      nb::arg("groups"), nb::arg("rows"), nb::arg("k"), nb::arg("n"), nb::arg("ragged_k"), nb::arg("transpose_rhs"),
      nb::arg("in_dtype"), nb::arg("out_dtype"), nb::arg("compute_capability"), nb::arg("sm_count"),
      nb::arg("small_groups_max_rows"), nb::arg("cutlass_config"));
  // The most K slices (one thread-block cluster per item) small_groups plans for a shape, 1 for no split; the
  // launch takes fewer where the clusters of so many would not all be resident at once.
  m.def(
      "small_groups_slices",
      [](int64_t groups, int64_t rows, int64_t k, int64_t n, bool transpose_rhs, const std::string& dtype,
         int compute_capability, int sm_count) {
        const te_async::GroupedGemmShape s =
            te_async::ShapeFromStatic(groups, rows, k, n, false, transpose_rhs, dtype, dtype);
        return te_async::PlanSmallGroupsSplitK(s, compute_capability, sm_count).slices;
      },
      nb::arg("groups"), nb::arg("rows"), nb::arg("k"), nb::arg("n"), nb::arg("transpose_rhs"), nb::arg("dtype"),
      nb::arg("compute_capability"), nb::arg("sm_count"));
  m.attr("CUTLASS_BUILT") = te_async::CutlassBuilt();
  m.attr("ROUTE_MAX_EXPERTS") = te_async::kRouteMaxExperts;
  m.attr("ROUTE_MAX_CHOICES") = te_async::kRouteMaxChoices;
  m.attr("DECODE_ATTENTION_MAX_ROWS") = te_async::kDecodeAttentionMaxRows;
  m.attr("DECODE_ATTENTION_MAX_SPLITS") = te_async::kDecodeAttentionMaxSplits;
  nb::list attention_shapes;  // (key dims, rope dims, value dims, values are keys) with a kernel
  for (const auto& s : te_async::kDecodeAttentionShapes) {
    attention_shapes.append(nb::make_tuple(s.key_dims, s.rope_dims, s.value_dims, s.values_are_keys));
  }
  m.attr("DECODE_ATTENTION_SHAPES") = attention_shapes;
  m.def("decode_attention_blocks_per_sm", &te_async::DecodeAttentionBlocksPerSm, nb::arg("key_dims"),
        nb::arg("rope_dims"), nb::arg("value_dims"), nb::arg("values_are_keys"));
  constexpr auto mla = te_async::kMlaDecodeDims;  // (nope, rope, latent, value) of the fused MLA kernel
  m.attr("MLA_DECODE_DIMS") = nb::make_tuple(mla.nope, mla.rope, mla.latent, mla.value);
  m.attr("MLA_DECODE_MAX_SPLITS") = te_async::kMlaDecodeMaxSplits;
  m.attr("MLA_TOKEN_HIDDEN") = nb::make_tuple(te_async::kMlaTokenHiddenStep, te_async::kMlaTokenMaxHidden);
  m.attr("MLA_TOKEN_LATENT_PARTS") = te_async::kMlaTokenLatentParts;
  m.attr("GQA_TOKEN_BLOCK_ROWS") = nb::make_tuple(te_async::kGqaTokenBlockRowStep, te_async::kGqaTokenBlockMaxHidden,
                                                  te_async::kGqaTokenBlockMaxRows);
  m.attr("FUSED_MAX_ROWS") = te_async::kSmallGroupsFusedMaxRows;
  // The configs each form can run, by form ("m", "mt", "k"), for TE_ASYNC_CUTLASS_CONFIG; empty
  // when CUTLASS is not built.
  nb::dict configs;
  if (te_async::CutlassBuilt()) {
    using te_async::cutlass_sm90::Form;
    for (auto [key, form] : {std::pair{"m", Form::kRaggedM}, {"mt", Form::kRaggedMT}, {"k", Form::kRaggedK}}) {
      nb::list names;
      for (int i = 0; i < te_async::cutlass_sm90::kNumTiles; ++i) {
        const auto tile = static_cast<te_async::cutlass_sm90::Tile>(i);
        if (te_async::cutlass_sm90::FormHasTile(form, tile)) names.append(te_async::cutlass_sm90::TileName(tile));
      }
      configs[key] = names;
    }
  }
  m.attr("CUTLASS_CONFIGS") = configs;
  m.def("release", []() {
    te_async::StreamPool::ReleaseAll();
    te_async::HostSizeSlots::ReleaseAll();
  });
}
