// The routed experts' GEMMs of a decode MoE block with the permutation fused in (te_async/decode_moe.py):
// small_groups in device mode, whose rows are read from and written to where the routing kernel's
// choice_of_row says (SmallGroupsFusion, device_gemm.h). fc1 gathers the token rows; fc2 applies
// swiglu to fc1's output as it loads it and writes each row, times its routing weight, to its
// (token, choice) slot of an f32 [T*k, N] output, which the caller sums over k. Deterministic: every
// output element is written once, by one thread. The caller's plan chose small_groups for both
// shapes (te_async/plan.py); this handler only checks that the operands fit together.
#include <string>

#include "cuda/device_counters.h"
#include "cuda/device_gemm.h"
#include "cuda/cuda_check.h"
#include "cuda/handlers.h"
#include "cuda/poison.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

ffi::Error ExpertGemm(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                      ffi::AnyBuffer group_sizes, ffi::Buffer<ffi::S32> choice_of_row, ffi::Buffer<ffi::F32> choice_weights,
                      ffi::Result<ffi::AnyBuffer> out, int64_t gather_div, bool scatter, bool swiglu) {
  auto bad = [&](const std::string& what) {
    return ffi::Error::InvalidArgument("te_async expert_gemm: " + what + " (lhs " + Dims(lhs) + ", rhs " + Dims(rhs) +
                                       ", group_sizes " + Dims(group_sizes) + ", out " + Dims(*out) + ")");
  };
  if (group_sizes.element_type() != ffi::DataType::S32 || group_sizes.dimensions().size() != 1) {
    return bad("group_sizes must be int32 [G]");
  }
  GroupedGemmShape s;
  s.groups = group_sizes.dimensions()[0];
  TE_ASYNC_RETURN_IF_ERROR(CheckGroupCount(s.groups));
  s.in_type = lhs.element_type();
  s.out_type = out->element_type();
  const auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out->dimensions();
  if (ld.size() != 2 || rd.size() != 3 || od.size() != 2 || rd[0] != s.groups) {
    return bad("need lhs [rows, K], rhs [G, K, N], out [M, N]");
  }
  s.rows = od[0];
  s.k = rd[1];
  s.n = rd[2];
  if (rhs.element_type() != s.in_type) return bad("lhs and rhs must share a dtype");
  if (od[1] != s.n) return bad("out must have rhs's N columns");
  if (ld[1] != (swiglu ? 2 * s.k : s.k)) return bad(swiglu ? "swiglu: lhs must have 2K columns" : "lhs must have K columns");
  if (gather_div < 0 || (gather_div > 0 ? ld[0] * gather_div != s.rows : ld[0] != s.rows)) {
    return bad("lhs must have M / gather_div rows (M rows without a gather)");
  }
  if (choice_of_row.element_count() != s.rows || choice_weights.element_count() != s.rows) {
    return bad("choice_of_row and choice_weights must have M entries");
  }
  auto info = QueryDevice(device);
  if (info.has_error()) return info.error();
  auto counters = CountersOnDevice(device);
  if (counters.has_error()) return counters.error();
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *out));
  if (out->element_count() == 0) return ffi::Error::Success();

  const DeviceGemm g = DeviceGemmOf(s, lhs, rhs, static_cast<const int32_t*>(group_sizes.untyped_data()),
                                    out->untyped_data(), *info, &(*counters)->clamped_calls);
  SmallGroupsFusion fusion;
  fusion.choice_of_row = choice_of_row.typed_data();
  fusion.choice_weights = choice_weights.typed_data();
  fusion.gather_div = static_cast<int>(gather_div);
  fusion.scatter = scatter;
  fusion.swiglu = swiglu;
  return LaunchSmallGroups(g, stream, fusion);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kExpertGemmCuda, ExpertGemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("gather_div")
                                  .Attr<bool>("scatter")
                                  .Attr<bool>("swiglu"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
