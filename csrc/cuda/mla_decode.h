// The fused MLA decode kernel's head shape and most key splits (mla_decode.cu), which
// te_async/mla_decode.py reads from the module to decide where the kernel applies and to size its
// partial buffer.
#pragma once

namespace te_async {

// DeepSeek-V2's and V3's multi-head latent attention: per head a no-rope query of 128 and a rope
// query of 64, one latent of 512 shared by every head (the keys and the values), values of 128.
struct MlaDecodeDims {
  int nope, rope, latent, value;
};
inline constexpr MlaDecodeDims kMlaDecodeDims = {128, 64, 512, 128};

// Clusters that may share one (sequence, token, head group)'s keys: the partial buffer's first dim.
inline constexpr int kMlaDecodeMaxSplits = 8;

}  // namespace te_async
