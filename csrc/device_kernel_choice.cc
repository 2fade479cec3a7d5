#include "device_kernel_choice.h"

namespace te_async {

bool CutlassShapeEligible(const GroupedGemmShape& s) {
  const bool sixteen_bit = s.in_type == ffi::DataType::BF16 || s.in_type == ffi::DataType::F16;
  const int64_t limit = int64_t{1} << 31;
  return sixteen_bit && s.out_type == s.in_type && s.k % 8 == 0 && s.n % 8 == 0 && s.rows < limit &&
         s.k < limit && s.n < limit;
}

DeviceKernel ChooseDeviceKernel(const GroupedGemmShape& s, int compute_capability, bool cutlass_built,
                                int64_t small_groups_max_rows) {
  const bool cutlass = compute_capability == 90 && cutlass_built && CutlassShapeEligible(s);
  const bool few_rows_per_group = s.rows <= kSmallGroupsMaxRowsPerGroup * (s.groups > 0 ? s.groups : 1);
  if (!s.ragged_k && s.rows <= small_groups_max_rows && (few_rows_per_group || !cutlass)) {
    return DeviceKernel::kSmallGroups;
  }
  if (cutlass) return DeviceKernel::kCutlassSm90;
  return DeviceKernel::kPortable;
}

const char* DeviceKernelName(DeviceKernel k) {
  switch (k) {
    case DeviceKernel::kSmallGroups:
      return "small_groups";
    case DeviceKernel::kCutlassSm90:
      return "cutlass_sm90";
    default:
      return "portable";
  }
}

std::optional<DeviceKernel> DeviceKernelFromName(std::string_view name) {
  for (DeviceKernel k : {DeviceKernel::kSmallGroups, DeviceKernel::kCutlassSm90, DeviceKernel::kPortable}) {
    if (name == DeviceKernelName(k)) return k;
  }
  return std::nullopt;
}

namespace {

ffi::DataType DataTypeFromName(const std::string& name) {
  if (name == "bfloat16") return ffi::DataType::BF16;
  if (name == "float16") return ffi::DataType::F16;
  if (name == "float32") return ffi::DataType::F32;
  return ffi::DataType::INVALID;
}

}  // namespace

GroupedGemmShape ShapeFromStatic(int64_t groups, int64_t rows, int64_t k, int64_t n, bool ragged_k,
                                 bool transpose_rhs, const std::string& in_dtype, const std::string& out_dtype) {
  GroupedGemmShape s;
  s.groups = groups;
  s.rows = rows;
  s.k = k;
  s.n = n;
  s.ragged_k = ragged_k;
  s.transpose_rhs = transpose_rhs;
  s.in_type = DataTypeFromName(in_dtype);
  s.out_type = DataTypeFromName(out_dtype);
  return s;
}

}  // namespace te_async
