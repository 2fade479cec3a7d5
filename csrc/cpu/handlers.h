// The CPU FFI handler symbols, registered by module.cc.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace te_async {

XLA_FFI_DECLARE_HANDLER_SYMBOL(kCopyGroupSizesCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kKeepGroupSizesCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kGroupedGemmCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(kGroupedGemmDeviceCpu);

}  // namespace te_async
