// CUTLASS sm90a grouped GEMM instantiations: f16, ragged k (wgrad), out [G,K,N].
// One translation unit per (dtype, form) so that the build compiles them in parallel.
#define TE_ASYNC_CUTLASS_KERNELS
#include "cuda/cutlass_grouped_gemm.h"

TE_ASYNC_CUTLASS_INSTANTIATE(F16, kRaggedK, kCoop128x256C1x2)
TE_ASYNC_CUTLASS_INSTANTIATE(F16, kRaggedK, kPing128x128C1x2)
TE_ASYNC_CUTLASS_INSTANTIATE(F16, kRaggedK, kPing128x128C2x1)
