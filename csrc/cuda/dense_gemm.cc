// A dense x @ w of a few rows (te_async/dense.py): the decode step's projections, routers and
// shared experts. small_groups with one group of all rows and no group sizes to load, K split over a
// thread-block cluster where the columns alone would leave SMs idle (small_group_gemm.cu), so the
// call is one kernel with no workspace; with tensor_cores (te_async/dense.py decides), the
// tensor-core kernel of dense_mma.cu, which takes 1 to 16 rows at the cost of one. With swiglu, x
// is [M, 2K] and the GEMM reads silu(x[:, :K]) * x[:, K:] (a SwiGLU MLP's second GEMM, its
// activation fused in).
#include <string>

#include "cuda/cuda_check.h"
#include "cuda/device_gemm.h"
#include "cuda/handlers.h"
#include "cuda/poison.h"
#include "grouped_gemm_args.h"

namespace te_async {
namespace {

ffi::Error DenseGemm(cudaStream_t stream, int32_t device, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                     ffi::Result<ffi::AnyBuffer> out, bool swiglu, bool tensor_cores) {
  auto bad = [&](const std::string& what) {
    return ffi::Error::InvalidArgument("te_async dense_gemm: " + what + " (lhs " + Dims(lhs) + ", rhs " + Dims(rhs) +
                                       ", out " + Dims(*out) + ")");
  };
  const auto ld = lhs.dimensions(), rd = rhs.dimensions(), od = out->dimensions();
  if (ld.size() != 2 || rd.size() != 2 || od.size() != 2) return bad("need lhs [M, K], rhs [K, N], out [M, N]");
  GroupedGemmShape s;
  s.groups = 1;
  s.rows = od[0];
  s.k = rd[0];
  s.n = rd[1];
  s.in_type = lhs.element_type();
  s.out_type = out->element_type();
  if (rhs.element_type() != s.in_type) return bad("lhs and rhs must share a dtype");
  if (ld[0] != s.rows || od[1] != s.n) return bad("out must be [lhs rows, rhs columns]");
  if (ld[1] != (swiglu ? 2 * s.k : s.k)) return bad(swiglu ? "swiglu: lhs must have 2K columns" : "lhs must have K columns");
  if (tensor_cores && !DenseMmaFits(s)) {
    return bad("tensor_cores takes bf16 or f16 inputs, output that dtype or f32, 1 to " +
               std::to_string(kDenseMmaMaxRows) + " rows, K a multiple of 16 and N of 8");
  }
  auto info = QueryDevice(device);
  if (info.has_error()) return info.error();
  TE_ASYNC_RETURN_IF_ERROR(PoisonOutputBuffers(stream, *out));
  if (out->element_count() == 0) return ffi::Error::Success();

  const DeviceGemm g = DeviceGemmOf(s, lhs, rhs, nullptr, out->untyped_data(), *info, nullptr);
  if (tensor_cores) return LaunchDenseMma(g, swiglu, stream);
  SmallGroupsFusion fusion;
  fusion.swiglu = swiglu;
  return LaunchSmallGroups(g, stream, fusion);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(kDenseGemmCuda, DenseGemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("swiglu")
                                  .Attr<bool>("tensor_cores"),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace te_async
