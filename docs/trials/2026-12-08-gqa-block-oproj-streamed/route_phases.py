"""Phase stamps of RouteTokenKernel: writes route_phases_<name>.cu from a token_ffn.cu (copied from docs/results/2026-12-04-h200-route-phases/probes, its anchors matched to the top-k form) with
%globaltimer / clock64 stamps (thread 0 of each block) at anchor lines, plus a harness that runs
flush (L2 cold) -> RouteTokenKernel (cluster launch) -> a programmatic dependent of 239 blocks
that waits as TokenFfnKernel's routed blocks do. Usage: route_phases.py SRC NAME."""
import re, sys
src, name = sys.argv[1], sys.argv[2]
text = open(src).read()
start = text.index("constexpr int kThreads = 256;")
end = text.index("template <typename T>\n__global__ void __launch_bounds__(kThreads, kBlocksPerSm) TokenFfnKernel")
body = text[start:end]
# (function name it lives in, anchor regex, 'before'|'after', stamp id)
anchors = [
    ("RouteTokenKernel(RouteTokenArgs a) {", r"RouteTokenKernel\(RouteTokenArgs a\) \{\n", "after", 0),
    ("__device__ __forceinline__ int RouterSlice", r"pre\[i\] = load\(g \+ i \* groups\);\n", "after", 1),
    ("__device__ __forceinline__ int RouterSlice", r"  float acc\[V\] = \{\};\n", "before", 2),
    ("__device__ __forceinline__ int RouterSlice", r"  if \(owner\) \{\n", "before", 3),
    ("__device__ __forceinline__ int RouterSlice", r"  return groups;\n", "before", 4),
    ("RouteTokenKernel(RouteTokenArgs a) {", r"  __cluster_barrier_wait\(\);\n", "after", 5),
    ("RouteTokenKernel(RouteTokenArgs a) {", r"  __cluster_barrier_arrive\(\);", "before", 6),
    ("RouteTokenKernel(RouteTokenArgs a) {", r"  if \(rank != 0\) return;\n  __cluster_barrier_wait\(\);\n", "after", 7),
    ("RouteTokenKernel(RouteTokenArgs a) {", r"  if \(tid < 32\) \{\n    float w;|  BlockTopK<kThreads", "before", 8),
    ("RouteTokenKernel(RouteTokenArgs a) {", r"a\.experts\[tid\] = e;\n  \}\n|  BlockTopK<kThreads.*\n", "after", 9),
]
for fn, pat, where, k in sorted(anchors, key=lambda a: -a[3]):
    f0 = body.index(fn)
    m = re.compile(pat).search(body, f0)
    assert m, (fn, pat)
    pos = m.end() if where == "after" else m.start()
    body = body[:pos] + f"  STAMP({k});\n" + body[pos:]
harness = open(__file__.replace("route_phases.py", "route_phases_harness.cu")).read()
head = harness[: harness.index("//@BODY")]
tail = harness[harness.index("//@BODY") :]
open(f"route_phases_{name}.cu", "w").write(head + body + tail)
