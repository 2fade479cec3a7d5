// One token's top-k routing by one warp, shared by the routing kernel (moe_routing.cu) and the
// one-token MoE kernel (token_ffn.cu): softmax of the E router logits in f32 (expf); with
// n_group > 1, DeepSeek's group-limited top-k keeps the topk_group groups whose best expert scores
// highest and zeroes the others; then k rounds of a warp argmax pick the experts, larger
// probability first and the lower index on ties (jax.lax.top_k's order). The k weights are
// renormalised to sum to one when asked, then multiplied by `scaling`. te_async/routing.py holds
// the JAX reference.
#pragma once

#include <climits>
#include <cmath>

namespace te_async {

inline constexpr int kTopKPerLane = 8;  // a warp holds a token's E <= 256 scores, 8 per lane

struct TopKOptions {
  int experts, top_k, n_group, topk_group;
  bool renormalize;
  float scaling;
};

// Warp argmax over (value, index): the larger value, the lower index on ties. Every lane gets it.
__device__ __forceinline__ void WarpArgMax(float& v, int& i) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, d);
    const int oi = __shfl_xor_sync(0xffffffffu, i, d);
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
  }
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  return v;
}

// The whole warp calls it with the token's logits `row` [E]; lane j < top_k gets the j-th weight
// and expert.
__device__ inline void WarpTopK(const float* row, const TopKOptions& o, int lane, float& weight, int& expert) {
  float p[kTopKPerLane];
#pragma unroll
  for (int i = 0; i < kTopKPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < o.experts ? row[e] : -INFINITY;
  }
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kTopKPerLane; ++i) m = fmaxf(m, p[i]);
  m = WarpMax(m);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kTopKPerLane; ++i) {
    p[i] = lane + 32 * i < o.experts ? expf(p[i] - m) : 0.f;
    s += p[i];
  }
  s = WarpSum(s);
#pragma unroll
  for (int i = 0; i < kTopKPerLane; ++i) p[i] /= s;

  if (o.n_group > 1) {  // keep the topk_group groups with the best single expert
    const int per_group = o.experts / o.n_group;
    float best = -INFINITY;  // lane g < n_group: the best probability of group g
    for (int g = 0; g < o.n_group; ++g) {
      float v = -INFINITY;
#pragma unroll
      for (int i = 0; i < kTopKPerLane; ++i) {
        const int e = lane + 32 * i;
        if (e < o.experts && e / per_group == g) v = fmaxf(v, p[i]);
      }
      v = WarpMax(v);
      if (lane == g) best = v;
    }
    unsigned kept = 0;
    for (int j = 0; j < o.topk_group; ++j) {
      float v = best;
      int g = lane < o.n_group ? lane : INT_MAX;
      WarpArgMax(v, g);
      kept |= 1u << g;
      if (lane == g) best = -INFINITY;
    }
#pragma unroll
    for (int i = 0; i < kTopKPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < o.experts && !((kept >> (e / per_group)) & 1u)) p[i] = 0.f;
    }
  }

  unsigned taken = 0;  // bit i: this lane's expert lane + 32 i is chosen
  float w_mine = 0.f;
  int e_mine = 0;
  float total = 0.f;
  for (int j = 0; j < o.top_k; ++j) {
    float v = -INFINITY;
    int e = INT_MAX;
#pragma unroll
    for (int i = 0; i < kTopKPerLane; ++i) {
      const int ei = lane + 32 * i;
      if (ei < o.experts && !((taken >> i) & 1u) && (p[i] > v || e == INT_MAX)) v = p[i], e = ei;
    }
    WarpArgMax(v, e);
    if (e % 32 == lane) taken |= 1u << (e / 32);
    if (lane == j) w_mine = v, e_mine = e;
    total += v;
  }
  weight = (o.renormalize ? w_mine / total : w_mine) * o.scaling;
  expert = e_mine;
}

}  // namespace te_async
