// CUTLASS sm90a grouped GEMM instantiations: f16, ragged m, rhs [G,K,N].
// One translation unit per (dtype, form) so that the build compiles them in parallel.
#define TE_ASYNC_CUTLASS_KERNELS
#include "cuda/cutlass_grouped_gemm.h"

TE_ASYNC_CUTLASS_INSTANTIATE(F16, kRaggedM, kCoop128x256C1x2)
TE_ASYNC_CUTLASS_INSTANTIATE(F16, kRaggedM, kCoop128x256C2x1)
TE_ASYNC_CUTLASS_INSTANTIATE(F16, kRaggedM, kPing64x128C1x1)
TE_ASYNC_CUTLASS_INSTANTIATE(F16, kRaggedM, kPing128x128C1x2)
