// Appended by route_kernel_phases.py after moe_routing.cu's RouteKernel and its stamped copy (inside
// te_async's anonymous namespace). Two candidate changes, probe only, each giving the same bits:
// - kPair (step 1): a warp routes its tokens two at a time, the two tokens' dependent shuffle chains
//   interleaved (softmax scoring without groups; the other options route one at a time as now).
// - kChunks (step 3): each warp takes 32 consecutive choices, ranks them among equal experts with
//   __match_any_sync and writes its per-expert counts; a choice's row is its expert's offset plus
//   the counts of the chunks before it plus its rank (choices <= 1024, E <= 128; else as now).
// RouteKernelVariant<false, false> is RouteKernel with the hooks compiled out: its timing checks them.

constexpr int kChunkMax = kRouteThreads / 32, kChunkExperts = 128;

template <int kSlots>
__device__ __forceinline__ void PairTopK(const float* r0, const float* r1, const TopKOptions& o, int lane,
                                         float (&weight)[2], int (&expert)[2]) {
  float c[2][kSlots];
  const float* rows[2] = {r0, r1};
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < kSlots; ++i) c[n][i] = lane + 32 * i < o.experts ? rows[n][lane + 32 * i] : -INFINITY;
  float m[2] = {-INFINITY, -INFINITY}, s[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < kSlots; ++i) m[n] = fmaxf(m[n], c[n][i]);
#pragma unroll
  for (int d = 16; d > 0; d >>= 1)
#pragma unroll
    for (int n = 0; n < 2; ++n) m[n] = fmaxf(m[n], __shfl_xor_sync(0xffffffffu, m[n], d));
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      c[n][i] = lane + 32 * i < o.experts ? expf(c[n][i] - m[n]) : 0.f;
      s[n] += c[n][i];
    }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1)
#pragma unroll
    for (int n = 0; n < 2; ++n) s[n] = s[n] + __shfl_xor_sync(0xffffffffu, s[n], d);
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < kSlots; ++i) c[n][i] /= s[n];
  unsigned taken[2] = {0u, 0u};
  float w_mine[2] = {0.f, 0.f}, total[2] = {0.f, 0.f};
  int e_mine[2] = {0, 0};
  for (int j = 0; j < o.top_k; ++j) {
    float v[2] = {-INFINITY, -INFINITY};
    int e[2] = {INT_MAX, INT_MAX};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const int ei = lane + 32 * i;
        if (ei < o.experts && !((taken[n] >> i) & 1u) && (c[n][i] > v[n] || e[n] == INT_MAX)) v[n] = c[n][i], e[n] = ei;
      }
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) {
      float ov[2];
      int oi[2];
#pragma unroll
      for (int n = 0; n < 2; ++n) ov[n] = __shfl_xor_sync(0xffffffffu, v[n], d), oi[n] = __shfl_xor_sync(0xffffffffu, e[n], d);
#pragma unroll
      for (int n = 0; n < 2; ++n)
        if (ov[n] > v[n] || (ov[n] == v[n] && oi[n] < e[n])) v[n] = ov[n], e[n] = oi[n];
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      if (e[n] % 32 == lane) taken[n] |= 1u << (e[n] / 32);
      if (lane == j) w_mine[n] = v[n], e_mine[n] = e[n];
      total[n] += v[n];
    }
  }
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    weight[n] = FinalWeight(rows[n], o, lane, w_mine[n], e_mine[n], total[n]);
    expert[n] = e_mine[n];
  }
}

__device__ void RouteTokenPair(const RouteArgs& a, int t0, int t1, int lane, int* chosen_sh, int* count) {
  float w[2];
  int e[2];
  const float* r0 = a.logits + static_cast<long long>(t0) * a.top.experts;
  const float* r1 = a.logits + static_cast<long long>(t1) * a.top.experts;
  WithSlots(a.top.experts, [&](auto slots) { PairTopK<decltype(slots)::value>(r0, r1, a.top, lane, w, e); });
  if (lane < a.top.top_k) {
    const int ts[2] = {t0, t1};
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int at = ts[n] * a.top.top_k + lane;
      a.weights[at] = w[n];
      a.chosen[at] = e[n];
      chosen_sh[at] = e[n];
      atomicAdd(&count[e[n]], 1);
    }
  }
}

// Step 1 of the variant (RouteKernel's loop where !kPair or the options route one token at a time).
template <bool kPair>
__device__ void RouteTokens(const RouteArgs& a, int warp, int lane, int* chosen, int* count) {
  if (kPair && !a.top.sigmoid && a.top.n_group <= 1) {
    for (int t = warp; t < a.tokens; t += 2 * kRouteWarps) {
      if (t + kRouteWarps < a.tokens) RouteTokenPair(a, t, t + kRouteWarps, lane, chosen, count);
      else RouteToken(a, t, lane, chosen, count);
    }
  } else {
    for (int t = warp; t < a.tokens; t += kRouteWarps) RouteToken(a, t, lane, chosen, count);
  }
}

__shared__ int chunk_count[kChunkMax][kChunkExperts];  // [chunk][expert]: the chunk's choices of it

// Step 3 of the variant by chunks where kChunks and the sizes allow: zero the table (before the
// first barrier), rank the warp's chunk and count it (before the third), then write the order
// (after it; Order() false: RouteKernel's loop writes it instead).
template <bool kChunks>
struct Chunks {
  bool on;
  int mine = -1, rank = 0;
  __device__ Chunks(const RouteArgs& a, int choices) {
    const int chunks = (choices + 31) / 32;
    on = kChunks && chunks <= kChunkMax && a.top.experts <= kChunkExperts;
    if (on)
      for (int i = threadIdx.x; i < chunks * a.top.experts; i += kRouteThreads) chunk_count[i / a.top.experts][i % a.top.experts] = 0;
  }
  __device__ void Rank(const int* chosen, int choices, int warp, int lane) {
    if (!on || warp * 32 >= choices) return;
    const int i = warp * 32 + lane;
    mine = i < choices ? chosen[i] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, mine);
    rank = __popc(peers & ((1u << lane) - 1u));
    if (mine >= 0 && rank == 0) chunk_count[warp][mine] = __popc(peers);
  }
  __device__ bool Order(const RouteArgs& a, const int* offset, int warp, int lane) const {
    if (!on) return false;
    if (mine >= 0) {
      const int i = warp * 32 + lane;
      int r = offset[mine] + rank;
      for (int c = 0; c < warp; ++c) r += chunk_count[c][mine];
      a.choice_of_row[r] = i;
      a.row_of_choice[i] = r;
    }
    return true;
  }
};

//@VARIANT_KERNEL: route_kernel_phases.py puts RouteKernelVariant<kPair, kChunks> here, RouteKernel
// with the three hooks above.

}  // namespace
}  // namespace te_async

#include <cstdio>
#include <random>
#include <vector>

namespace {

using te_async::RouteArgs;

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)

struct Outputs {
  float* weights; int *chosen, *sizes, *cor, *roc;
  std::vector<int> host(int tokens, int experts, int k) const {  // every output's bits, in order
    const int n = tokens * k;
    std::vector<int> h(3 * n + experts + n);
    CHECK(cudaMemcpy(h.data(), weights, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(h.data() + n, chosen, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(h.data() + 2 * n, cor, n * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(h.data() + 3 * n, sizes, experts * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(h.data() + 3 * n + experts, roc, n * 4, cudaMemcpyDeviceToHost));
    return h;
  }
};

double Median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

// us per launch: the median over 30 batches of 20 back-to-back launches, event-timed.
template <typename K>
double PerLaunch(K kernel, const RouteArgs& a) {
  cudaEvent_t t0, t1;
  CHECK(cudaEventCreate(&t0)); CHECK(cudaEventCreate(&t1));
  std::vector<double> t;
  for (int r = 0; r < 33; ++r) {
    CHECK(cudaEventRecord(t0));
    for (int l = 0; l < 20; ++l) kernel<<<1, te_async::kRouteThreads>>>(a);
    CHECK(cudaEventRecord(t1));
    CHECK(cudaEventSynchronize(t1));
    float ms; CHECK(cudaEventElapsedTime(&ms, t0, t1));
    if (r >= 3) t.push_back(ms * 1e3 / 20);
  }
  return Median(t);
}

}  // namespace

int main() {
  using namespace te_async;
  const char* phase[] = {"counts zeroed", "tokens routed", "counts scanned", "order written"};
  struct Case { int tokens, experts, k; };
  for (Case c : {Case{1, 64, 6}, Case{8, 64, 6}, Case{32, 64, 6}, Case{64, 64, 6}, Case{128, 64, 6}, Case{64, 128, 8}}) {
    const int n = c.tokens * c.k;
    std::vector<float> logits(c.tokens * c.experts);
    std::mt19937 gen(c.tokens * 1000 + c.experts);
    std::normal_distribution<float> normal;
    for (float& v : logits) v = normal(gen);
    float* d_logits;
    CHECK(cudaMalloc(&d_logits, logits.size() * 4));
    CHECK(cudaMemcpy(d_logits, logits.data(), logits.size() * 4, cudaMemcpyHostToDevice));
    Outputs o;
    CHECK(cudaMalloc(&o.weights, n * 4)); CHECK(cudaMalloc(&o.chosen, n * 4)); CHECK(cudaMalloc(&o.sizes, c.experts * 4));
    CHECK(cudaMalloc(&o.cor, n * 4)); CHECK(cudaMalloc(&o.roc, n * 4));
    const RouteArgs a{d_logits, c.tokens, TopKOptions{c.experts, c.k, 1, 1, false, 1.0f}, o.weights, o.chosen, o.sizes,
                      o.cor, o.roc};
    RouteKernel<<<1, kRouteThreads>>>(a);
    CHECK(cudaDeviceSynchronize());
    const std::vector<int> want = o.host(c.tokens, c.experts, c.k);
    std::vector<std::vector<double>> d(4);
    for (int r = 0; r < 60; ++r) {
      RouteKernelStamped<<<1, kRouteThreads>>>(a);
      CHECK(cudaDeviceSynchronize());
      unsigned long long s[8];
      CHECK(cudaMemcpyFromSymbol(s, g_stamps, sizeof(s)));
      if (r >= 10)
        for (int i = 0; i < 4; ++i) d[i].push_back((s[i + 1] - s[i]) / 1e3);
    }
    std::printf("T=%d E=%d k=%d (%d choices), stamped phases (us):", c.tokens, c.experts, c.k, n);
    for (int i = 0; i < 4; ++i) std::printf(" %s %.2f;", phase[i], Median(d[i]));
    std::printf("\n  us per launch (20 back to back): RouteKernel %.2f", PerLaunch(RouteKernel, a));
    struct V { const char* name; void (*k)(RouteArgs); };
    for (V v : {V{"hooks off", RouteKernelVariant<false, false>}, V{"pair", RouteKernelVariant<true, false>},
                V{"chunks", RouteKernelVariant<false, true>}, V{"pair+chunks", RouteKernelVariant<true, true>}}) {
      for (auto [p, bytes] : {std::pair<void*, int>{o.weights, n * 4}, {o.chosen, n * 4}, {o.sizes, c.experts * 4},
                              {o.cor, n * 4}, {o.roc, n * 4}}) {
        CHECK(cudaMemset(p, 0xff, bytes));  // poison: an output a variant leaves unwritten differs
      }
      v.k<<<1, kRouteThreads>>>(a);
      CHECK(cudaDeviceSynchronize());
      const bool same = o.host(c.tokens, c.experts, c.k) == want;
      std::printf("; %s %.2f (%s)", v.name, PerLaunch(v.k, a), same ? "same bits" : "DIFFERENT");
    }
    std::printf("\n");
    CHECK(cudaFree(d_logits)); CHECK(cudaFree(o.weights)); CHECK(cudaFree(o.chosen)); CHECK(cudaFree(o.sizes));
    CHECK(cudaFree(o.cor)); CHECK(cudaFree(o.roc));
  }
  return 0;
}
