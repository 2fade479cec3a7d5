// One token's top-k routing by one warp, shared by the routing kernel (moe_routing.cu) and the
// one-token MoE kernel (token_ffn.cu, softmax only). Each lane holds the choice values of experts
// lane, lane + 32, ...: softmax scoring, the softmax of the E router logits in f32 (expf), which
// are also the weights; sigmoid scoring (DeepSeek-V3), sigmoid(logit) + bias[e], the bias being
// an optional load-balancing correction that steers the choice but not the weights. With
// n_group > 1, DeepSeek's group-limited top-k keeps the topk_group groups that score highest
// (softmax: their best expert; sigmoid: the sum of their two best, two equal values both
// counting) and masks the others (softmax: probability 0; sigmoid: -inf, never chosen while
// enough experts are kept, which te_async/routing.py checks). Then k rounds of a warp argmax pick
// the experts, larger choice value first and the lower index on ties (jax.lax.top_k's order). The
// weights are the chosen experts' unbiased scores (sigmoid: recomputed from their logits rather
// than held beside the choice values, which would take 8 more registers per lane), renormalised to
// sum to one when asked, then multiplied by `scaling`. te_async/routing.py holds the JAX reference.
#pragma once

#include <climits>
#include <cmath>

#include "cuda/block_reduce.cuh"

namespace te_async {

inline constexpr int kTopKPerLane = 8;  // a warp holds a token's E <= 256 scores, 8 per lane

struct TopKOptions {
  int experts, top_k, n_group, topk_group;
  bool renormalize;
  float scaling;
  bool sigmoid = false;         // DeepSeek-V3's scoring, else softmax (token_ffn.cu: always softmax)
  const float* bias = nullptr;  // [E] on the device, sigmoid's correction bias; nullptr: none
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
  return WarpReduce(v, [](float x, float y) { return fmaxf(x, y); });
}

__device__ __forceinline__ float WarpSum(float v) {
  return WarpReduce(v, [](float x, float y) { return x + y; });
}

__device__ __forceinline__ float Sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// Group g's score for the group-limited top-k, on every lane: its best choice value, or with
// `two_best` the sum of its two best (the top two by position: a value held twice counts twice).
__device__ __forceinline__ float GroupScore(const float (&c)[kTopKPerLane], const TopKOptions& o, int lane, int g,
                                            bool two_best) {
  const int per_group = o.experts / o.n_group;
  float b1 = -INFINITY, b2 = -INFINITY;  // this lane's best two of group g, b1 >= b2
#pragma unroll
  for (int i = 0; i < kTopKPerLane; ++i) {
    const int e = lane + 32 * i;
    if (e < o.experts && e / per_group == g) b2 = fmaxf(b2, fminf(b1, c[i])), b1 = fmaxf(b1, c[i]);
  }
  if (!two_best) return WarpMax(b1);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {  // the best two of both lanes' pairs
    const float o1 = __shfl_xor_sync(0xffffffffu, b1, d), o2 = __shfl_xor_sync(0xffffffffu, b2, d);
    b2 = fmaxf(fminf(b1, o1), fmaxf(b2, o2));
    b1 = fmaxf(b1, o1);
  }
  return b1 + b2;
}

// The whole warp calls it with the token's logits `row` [E]; lane j < top_k gets the j-th weight
// and expert.
__device__ inline void WarpTopK(const float* row, const TopKOptions& o, int lane, float& weight, int& expert) {
  float c[kTopKPerLane];  // the choice values of experts lane + 32 i
  if (o.sigmoid) {
#pragma unroll
    for (int i = 0; i < kTopKPerLane; ++i) {
      const int e = lane + 32 * i;
      c[i] = e < o.experts ? Sigmoid(row[e]) + (o.bias ? o.bias[e] : 0.f) : -INFINITY;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kTopKPerLane; ++i) {
      const int e = lane + 32 * i;
      c[i] = e < o.experts ? row[e] : -INFINITY;
    }
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kTopKPerLane; ++i) m = fmaxf(m, c[i]);
    m = WarpMax(m);
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kTopKPerLane; ++i) {
      c[i] = lane + 32 * i < o.experts ? expf(c[i] - m) : 0.f;
      s += c[i];
    }
    s = WarpSum(s);
#pragma unroll
    for (int i = 0; i < kTopKPerLane; ++i) c[i] /= s;
  }

  if (o.n_group > 1) {  // keep the topk_group best groups
    float best = -INFINITY;  // lane g < n_group: group g's score
    for (int g = 0; g < o.n_group; ++g) {
      const float v = GroupScore(c, o, lane, g, o.sigmoid);
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
    const int per_group = o.experts / o.n_group;
    const float masked = o.sigmoid ? -INFINITY : 0.f;  // biased sigmoid choice values may be negative
#pragma unroll
    for (int i = 0; i < kTopKPerLane; ++i) {
      const int e = lane + 32 * i;
      if (e < o.experts && !((kept >> (e / per_group)) & 1u)) c[i] = masked;
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
      if (ei < o.experts && !((taken >> i) & 1u) && (c[i] > v || e == INT_MAX)) v = c[i], e = ei;
    }
    WarpArgMax(v, e);
    if (e % 32 == lane) taken |= 1u << (e / 32);
    if (lane == j) w_mine = v, e_mine = e;
    total += v;
  }
  if (o.sigmoid) {  // the choice values held the bias: the weights are the plain scores
    w_mine = Sigmoid(row[e_mine]);
    total = WarpSum(lane < o.top_k ? w_mine : 0.f);
  }
  weight = (o.renormalize ? w_mine / total : w_mine) * o.scaling;
  expert = e_mine;
}

}  // namespace te_async
