// The widths the grouped-query block call (gqa_token.cu's GqaTokenBlock) takes, which
// te_async/gqa_token.py reads from the module: its input projections and o_proj keep a block's rows
// of the weights in registers, over 128 row groups, at most 16 rows a thread for the hidden size
// and 32 for o_proj's H * d rows (Qwen3-30B-A3B's 2048 and 4096).
#pragma once

namespace te_async {

inline constexpr int kGqaTokenBlockRowStep = 128;
inline constexpr int kGqaTokenBlockMaxHidden = 2048;
inline constexpr int kGqaTokenBlockMaxRows = 4096;

}  // namespace te_async
