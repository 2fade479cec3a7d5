// The CUDA FFI handler symbols, registered by module.cc.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace te_async {

XLA_FFI_DECLARE_HANDLER_SYMBOL(kCopyGroupSizesCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kKeepGroupSizesCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kReuseGroupSizesCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kGroupedGemmCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kGroupedGemmDeviceCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kDenseGemmCuda);   // dense_gemm.cc
XLA_FFI_DECLARE_HANDLER_SYMBOL(kExpertGemmCuda);  // expert_gemm.cc
XLA_FFI_DECLARE_HANDLER_SYMBOL(kRouteCuda);       // moe_routing.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(kDecodeAttentionCuda);  // decode_attention.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(kMlaDecodeCuda);        // mla_decode.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(kMlaTokenCuda);         // mla_token.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(kGqaTokenCuda);         // gqa_token.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(kGqaTokenBlockCuda);    // gqa_token.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(kTokenFfnCuda);         // token_ffn.cu
XLA_FFI_DECLARE_HANDLER_SYMBOL(kTokenMoeCuda);         // token_ffn.cu

}  // namespace te_async
