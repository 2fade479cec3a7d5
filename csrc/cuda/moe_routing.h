// The routing kernel's limits (moe_routing.cu), which te_async/routing.py reads from the module to
// decide where the kernel applies: one thread block holds the T*k choices in shared memory, and a
// warp holds a token's expert scores in registers, 8 per lane.
#pragma once

namespace te_async {

inline constexpr int kRouteMaxExperts = 256;
inline constexpr int kRouteMaxChoices = 4096;  // tokens x top_k

}  // namespace te_async
