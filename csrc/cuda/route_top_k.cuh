// One token's top-k routing, shared by the routing kernel (moe_routing.cu: a warp a token) and the
// one-token MoE call (token_ffn.cu: a whole block for its one token, softmax only). Choice values:
// softmax scoring, the softmax of the E router logits in f32 (expf), which are also the weights;
// sigmoid scoring (DeepSeek-V3), sigmoid(logit) + bias[e], the bias being an optional
// load-balancing correction that steers the choice but not the weights. A warp computes them, each
// lane holding experts lane, lane + 32, ... in kSlots registers (kSlots from E, so that E = 64
// walks 2 slots a lane, not 256 / 32). With n_group > 1, DeepSeek's group-limited top-k keeps the
// topk_group groups that score highest (softmax: their best expert; sigmoid: the sum of their two
// best, two equal values both counting) and masks the others (softmax: probability 0; sigmoid:
// -inf, never chosen while enough experts are kept, which te_async/routing.py checks). The top-k
// is the larger choice value first and the lower index on ties (jax.lax.top_k's order): WarpTopK
// picks it in k rounds of a warp argmax; BlockTopK ranks every expert at once (its rank: the
// experts before it in that order, counted by P threads an expert), which has no chain of k
// dependent shuffle rounds and measured faster where a block serves one token. The weights are
// the chosen experts' unbiased scores (sigmoid: recomputed from their logits rather than held
// beside the choice values), renormalised to sum to one when asked (summed in rank order), then
// multiplied by `scaling`. A warp may route several tokens at once (WarpTopK<kTokens>): every step
// runs over the tokens innermost, so that their chains of dependent shuffles interleave (two
// tokens a warp: the routing kernel 11.0 -> 10.1 us at 64 tokens on an H100, alone).
// te_async/routing.py holds the JAX reference.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cuda/block_reduce.cuh"

namespace te_async {

inline constexpr int kTopKPerLane = 8;  // a warp holds a token's E <= 256 choice values, up to 8 a lane

struct TopKOptions {
  int experts, top_k, n_group, topk_group;
  bool renormalize;
  float scaling;
  bool sigmoid = false;         // DeepSeek-V3's scoring, else softmax (token_ffn.cu: always softmax)
  const float* bias = nullptr;  // [E] on the device, sigmoid's correction bias; nullptr: none
};

// What a kernel instantiation compiles of the top-k: kSlots (E <= 32 kSlots), the scoring and the
// group-limited step. A launch then holds one form's code: the routing kernel with every slot
// count's code inside took 7.8 us at 8 tokens in a decode step where it took 5.2 alone (H100), the
// kernels before it having evicted the SMs' instruction caches; the sigmoid and group code was
// most of what was left (RouteKernel at E = 64: 117 KB, 38 KB without it).
template <int kSlots_, bool kSigmoid_, bool kGrouped_>
struct TopKForm {
  static constexpr int kSlots = kSlots_;
  static constexpr bool kSigmoid = kSigmoid_, kGrouped = kGrouped_;
};

// f(TopKForm<...>()) for o's form, kSlots the fewest of 1, 2, 4, 8 that hold E / 32; on the host,
// to pick a kernel's instantiation. kMaySigmoid false: softmax forms only (o.sigmoid is false).
template <bool kMaySigmoid = true, typename F>
__host__ __device__ __forceinline__ void WithForm(const TopKOptions& o, F f) {
  const auto scored = [&](auto slots) {
    constexpr int k = decltype(slots)::value;
    if (kMaySigmoid && o.sigmoid) {
      if (o.n_group > 1) {
        f(TopKForm<k, kMaySigmoid, true>());
      } else {
        f(TopKForm<k, kMaySigmoid, false>());
      }
    } else if (o.n_group > 1) {
      f(TopKForm<k, false, true>());
    } else {
      f(TopKForm<k, false, false>());
    }
  };
  if (o.experts <= 32) {
    scored(std::integral_constant<int, 1>());
  } else if (o.experts <= 64) {
    scored(std::integral_constant<int, 2>());
  } else if (o.experts <= 128) {
    scored(std::integral_constant<int, 4>());
  } else {
    scored(std::integral_constant<int, kTopKPerLane>());
  }
}

// Warp argmax over kTokens (value, index) pairs: the larger value, the lower index on ties. Every
// lane gets each.
template <int kTokens>
__device__ __forceinline__ void WarpArgMax(float (&v)[kTokens], int (&i)[kTokens]) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    float ov[kTokens];
    int oi[kTokens];
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
      ov[n] = __shfl_xor_sync(0xffffffffu, v[n], d);
      oi[n] = __shfl_xor_sync(0xffffffffu, i[n], d);
    }
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
      if (ov[n] > v[n] || (ov[n] == v[n] && oi[n] < i[n])) v[n] = ov[n], i[n] = oi[n];
    }
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
template <int kSlots>
__device__ __forceinline__ float GroupScore(const float (&c)[kSlots], const TopKOptions& o, int lane, int g,
                                            bool two_best) {
  const int per_group = o.experts / o.n_group;
  float b1 = -INFINITY, b2 = -INFINITY;  // this lane's best two of group g, b1 >= b2
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
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

// DeepSeek's group-limited top-k on one token's choice values c (experts lane + 32 i): the
// topk_group best groups are kept, the others' experts masked.
template <bool kSigmoid, int kSlots>
__device__ inline void MaskGroups(float (&c)[kSlots], const TopKOptions& o, int lane) {
  float best = -INFINITY;  // lane g < n_group: group g's score
  for (int g = 0; g < o.n_group; ++g) {
    const float v = GroupScore(c, o, lane, g, kSigmoid);
    if (lane == g) best = v;
  }
  unsigned kept = 0;
  for (int j = 0; j < o.topk_group; ++j) {
    float v[1] = {best};
    int g[1] = {lane < o.n_group ? lane : INT_MAX};
    WarpArgMax(v, g);
    kept |= 1u << g[0];
    if (lane == g[0]) best = -INFINITY;
  }
  const int per_group = o.experts / o.n_group;
  const float masked = kSigmoid ? -INFINITY : 0.f;  // biased sigmoid choice values may be negative
#pragma unroll
  for (int i = 0; i < kSlots; ++i) {
    const int e = lane + 32 * i;
    if (e < o.experts && !((kept >> (e / per_group)) & 1u)) c[i] = masked;
  }
}

// The choice values of experts lane + 32 i of each of kTokens tokens from its logits rows[n] [E],
// by the whole warp.
template <int kTokens, typename Form>
__device__ inline void WarpChoiceValues(const float* const (&rows)[kTokens], const TopKOptions& o, int lane,
                                        float (&c)[kTokens][Form::kSlots]) {
  constexpr int kSlots = Form::kSlots;
  if constexpr (Form::kSigmoid) {
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int e = lane + 32 * i;
        c[n][i] = e < o.experts ? Sigmoid(rows[n][e]) + (o.bias ? o.bias[e] : 0.f) : -INFINITY;
      }
    }
  } else {  // softmax
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) c[n][i] = lane + 32 * i < o.experts ? rows[n][lane + 32 * i] : -INFINITY;
    }
    float m[kTokens], s[kTokens];
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
      m[n] = -INFINITY;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) m[n] = fmaxf(m[n], c[n][i]);
    }
    WarpReduceEach(m, [](float x, float y) { return fmaxf(x, y); });
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
      s[n] = 0.f;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        c[n][i] = lane + 32 * i < o.experts ? expf(c[n][i] - m[n]) : 0.f;
        s[n] += c[n][i];
      }
    }
    WarpReduceEach(s, [](float x, float y) { return x + y; });
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) c[n][i] /= s[n];
    }
  }
  if constexpr (Form::kGrouped) {
#pragma unroll
    for (int n = 0; n < kTokens; ++n) MaskGroups<Form::kSigmoid>(c[n], o, lane);
  }
}

// Lane j < top_k holds the j-th choice value v and expert e, every lane `total` (the k values
// summed in rank order); returns lane j's weight.
template <bool kSigmoid>
__device__ __forceinline__ float FinalWeight(const float* row, const TopKOptions& o, int lane, float v, int e,
                                             float total) {
  if constexpr (kSigmoid) {  // the choice values held the bias: the weights are the plain scores
    v = lane < o.top_k ? Sigmoid(row[e]) : 0.f;
    total = WarpSum(v);
  }
  return (o.renormalize ? v / total : v) * o.scaling;
}

// The whole warp calls it with kTokens tokens' logits rows[n] [E] (o of the form Form); lane j <
// top_k gets the j-th weight and expert of each.
template <int kTokens, typename Form>
__device__ inline void WarpTopK(const float* const (&rows)[kTokens], const TopKOptions& o, int lane,
                                float (&weight)[kTokens], int (&expert)[kTokens]) {
  constexpr int kSlots = Form::kSlots;
  float c[kTokens][kSlots];
  WarpChoiceValues<kTokens, Form>(rows, o, lane, c);
  unsigned taken[kTokens] = {};  // bit i: this lane's expert lane + 32 i is chosen
  float w_mine[kTokens] = {}, total[kTokens] = {};
  int e_mine[kTokens] = {};
  for (int j = 0; j < o.top_k; ++j) {
    float v[kTokens];
    int e[kTokens];
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
      v[n] = -INFINITY, e[n] = INT_MAX;
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int ei = lane + 32 * i;
        if (ei < o.experts && !((taken[n] >> i) & 1u) && (c[n][i] > v[n] || e[n] == INT_MAX)) v[n] = c[n][i], e[n] = ei;
      }
    }
    WarpArgMax(v, e);
#pragma unroll
    for (int n = 0; n < kTokens; ++n) {
      if (e[n] % 32 == lane) taken[n] |= 1u << (e[n] / 32);
      if (lane == j) w_mine[n] = v[n], e_mine[n] = e[n];
      total[n] += v[n];
    }
  }
#pragma unroll
  for (int n = 0; n < kTokens; ++n) {
    weight[n] = FinalWeight<Form::kSigmoid>(rows[n], o, lane, w_mine[n], e_mine[n], total[n]);
    expert[n] = e_mine[n];
  }
}

// A float's position in the order of floats as an unsigned integer (-0 taken as +0).
__device__ __forceinline__ unsigned OrderKey(float v) {
  const unsigned u = __float_as_uint(v + 0.f);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}

// The top-k of one token by a block of kBlock threads, all of which call it: warp 0 computes the
// choice values and their order keys, every expert's rank is counted by P threads (each every
// P-th other expert, then a butterfly), the first k ranks go to slots, and warp 0 writes
// weights[j] and experts[j] for j < top_k. row: the logits [E]; work: 2 E + 64 words of shared
// memory. o of the form Form.
template <int kBlock, typename Form>
__device__ inline void BlockTopK(const float* row, const TopKOptions& o, float* work, float* weights,
                                 int32_t* experts) {
  const int tid = threadIdx.x, lane = tid % 32, E = o.experts;
  float* choice = work;
  unsigned* key = reinterpret_cast<unsigned*>(work + E);
  float* slot_value = work + 2 * E;
  int* slot_expert = reinterpret_cast<int*>(slot_value + 32);
  if (tid < 32) {
    constexpr int kSlots = Form::kSlots;
    const float* rows[1] = {row};
    float c[1][kSlots];
    WarpChoiceValues<1, Form>(rows, o, lane, c);
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      if (lane + 32 * i < E) choice[lane + 32 * i] = c[0][i], key[lane + 32 * i] = OrderKey(c[0][i]);
    }
  }
  __syncthreads();
  const int lanes = LanesPerItem(E, kBlock), shift = __ffs(lanes) - 1;
  const int e = tid >> shift, part = tid & (lanes - 1);
  int before = 0;  // experts of this part ahead of e
  if (e < E) {
    const unsigned mine = key[e];
#pragma unroll 8
    for (int j = part; j < E; j += lanes) {
      const unsigned other = key[j];
      before += other > mine || (other == mine && j < e);
    }
  }
  before = LaneGroupReduce(before, lanes, [](int x, int y) { return x + y; });
  if (e < E && part == 0 && before < o.top_k) slot_value[before] = choice[e], slot_expert[before] = e;
  __syncthreads();
  if (tid >= 32) return;
  const float v = lane < o.top_k ? slot_value[lane] : 0.f;
  const int chosen = lane < o.top_k ? slot_expert[lane] : 0;
  float total = 0.f;
#pragma unroll 8
  for (int j = 0; j < o.top_k; ++j) total += __shfl_sync(0xffffffffu, v, j);
  const float w = FinalWeight<Form::kSigmoid>(row, o, lane, v, chosen, total);
  if (lane < o.top_k) weights[lane] = w, experts[lane] = chosen;
}

}  // namespace te_async
