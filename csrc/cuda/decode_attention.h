// The decode attention kernel's limits and instantiations (decode_attention.cu), which
// te_async/attention.py reads from the module to decide where the kernel applies.
#pragma once

namespace te_async {

inline constexpr int kDecodeAttentionMaxRows = 16;     // query heads per kv head x new tokens
inline constexpr int kDecodeAttentionMaxSplits = 256;  // key chunks of one (sequence, kv head)

struct DecodeAttentionShape {
  int key_dims;    // per head: the keys' dims (MLA: the latent)
  int rope_dims;   // MLA's decoupled rope key (0: none); the scores run over key_dims + rope_dims
  int value_dims;
  bool values_are_keys;  // MLA: the values are the latent, the keys' first value_dims dims
};

// MLA with DeepSeek-V2's latent (512) and rope key (64); grouped-query attention with heads of 128.
inline constexpr DecodeAttentionShape kDecodeAttentionShapes[] = {{512, 64, 512, true}, {128, 0, 128, false}};

// Blocks of the split kernel for these dims that one SM of the current device holds at once (0
// where no kernel takes them): te_async/decode_attention.py keeps the key splits within one wave
// of them. A CUDA failure throws std::runtime_error naming the call.
int DecodeAttentionBlocksPerSm(int key_dims, int rope_dims, int value_dims, bool values_are_keys);

}  // namespace te_async
