// The hidden sizes the MLA token call (mla_token.cu) takes, which te_async/mla_token.py reads from
// the module: its input projections and o_proj keep a block's rows of the weights in registers, at
// most 16 per thread over 128 row groups.
#pragma once

namespace te_async {

inline constexpr int kMlaTokenHiddenStep = 128;
inline constexpr int kMlaTokenMaxHidden = 2048;
// The merge's blocks per head, each a part of the latent columns: the heads' outputs come to o_proj
// as that many partial sums (the call's workspace output `attention`).
inline constexpr int kMlaTokenLatentParts = 4;

}  // namespace te_async
