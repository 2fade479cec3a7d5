"""Phase stamps of moe_routing.cu's RouteKernel (bench decode's routing from T=2 up), and two
candidate variants, in one file: writes route_kernel_phases.cu = the kernel's file up to its handler
(RouteKernel as it is), a copy with %globaltimer stamps by thread 0 after each of its barriers
(RouteKernelStamped; one barrier more at the end, so that the last stamp sees every warp done),
RouteKernelVariant (RouteKernel with the hooks of route_kernel_variants.cu for the candidates), and
route_kernel_variants.cu's harness (main). Usage:
route_kernel_phases.py csrc/cuda/moe_routing.cu; then nvcc -O3 -std=c++17 -arch=sm_90a -I csrc -I
<jaxlib>/include route_kernel_phases.cu."""
import os
import sys

text = open(sys.argv[1]).read()
stamp = ('__device__ unsigned long long g_stamps[8];\n'
         '#define STAMP(k) do { if (threadIdx.x == 0) { unsigned long long t_; '
         'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_)); g_stamps[k] = t_; } } while (0)\n')
kernel = text.index("// One block per launch, so minBlocksPerSM 1")
end = text.index("// bias: sigmoid's correction bias")
original = text[kernel:end]
body = original.replace("RouteKernel(RouteArgs a) {\n", "RouteKernelStamped(RouteArgs a) {\n  STAMP(0);\n", 1)
parts = body.split("  __syncthreads();\n")
assert len(parts) == 4, len(parts)  # three barriers: counts zeroed, tokens routed, counts scanned
body = "".join(p + f"  __syncthreads();\n  STAMP({i + 1});\n" for i, p in enumerate(parts[:-1])) + parts[-1]
closing = body.rindex("}\n")
body = body[:closing] + "  __syncthreads();\n  STAMP(4);\n" + body[closing:]
head = text[:kernel].replace("namespace ffi = xla::ffi;\n", "namespace ffi = xla::ffi;\n" + stamp, 1)
# RouteKernelVariant<kPair, kChunks>: RouteKernel with route_kernel_variants.cu's hooks for step 1 and step 3.
edits = [("__global__ void __launch_bounds__(kRouteThreads, 1) RouteKernel(RouteArgs a) {",
          "template <bool kPair, bool kChunks>\n__global__ void __launch_bounds__(kRouteThreads, 1) RouteKernelVariant(RouteArgs a) {"),
         ("  for (int e = tid; e < a.top.experts; e += kRouteThreads) count[e] = 0;\n",
          "  for (int e = tid; e < a.top.experts; e += kRouteThreads) count[e] = 0;\n  Chunks<kChunks> chunks(a, choices);\n"),
         ("  for (int t = warp; t < a.tokens; t += kRouteWarps) RouteToken(a, t, lane, chosen, count);\n",
          "  RouteTokens<kPair>(a, warp, lane, chosen, count);\n"),
         ("  }\n  __syncthreads();\n\n  for (int e = warp;",
          "  }\n  chunks.Rank(chosen, choices, warp, lane);\n  __syncthreads();\n  if (chunks.Order(a, offset, warp, lane)) return;\n\n  for (int e = warp;")]
variant = original
for old, new in edits:
    assert variant.count(old) == 1, old
    variant = variant.replace(old, new)
variants = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "route_kernel_variants.cu")).read()
marker = variants.index("//@VARIANT_KERNEL")
open("route_kernel_phases.cu", "w").write(head + original + body + variants[:marker] + variant + variants[marker:])
