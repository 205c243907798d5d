#include "core/tma.h"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

namespace lowbit::tma {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  // Looked up once; null when the driver lacks the function (the callers then skip TMA).
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of the failed lookup
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

bool make_bthd_map(CUtensorMap* map, const void* x, int64_t B, int64_t T, int64_t heads, int64_t dh,
                   int64_t sb, int64_t st, int64_t sh) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
  if (encode == nullptr || reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
  constexpr int64_t kElem = 2;  // bf16
  // Dimensions innermost first: channel, head, position, batch (strides increasing).
  if (!(sh * kElem >= dh * kElem && st >= sh * heads && sb >= st * T)) return false;
  const cuuint64_t dims[4] = {cuuint64_t(dh), cuuint64_t(heads), cuuint64_t(T), cuuint64_t(B)};
  const cuuint64_t strides[3] = {cuuint64_t(sh * kElem), cuuint64_t(st * kElem),
                                 cuuint64_t(sb * kElem)};
  for (cuuint64_t s : strides) {
    if (s % 16 != 0 || s >= (cuuint64_t(1) << 40)) return false;
  }
  const cuuint32_t box[4] = {64, 1, 64, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  CUtensorMap m;
  const CUresult r =
      encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(x), dims, strides, box,
             elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  *map = m;
  return true;
}

bool make_2d_map(CUtensorMap* map, const void* base, CUtensorMapDataType dtype, int64_t inner,
                 int64_t outer, int64_t row_stride_bytes, uint32_t box_inner, uint32_t box_outer,
                 CUtensorMapSwizzle swizzle) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_fn();
  if (encode == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  if (inner <= 0 || outer <= 0 || row_stride_bytes % 16 != 0 ||
      row_stride_bytes >= (int64_t{1} << 40)) {
    return false;
  }
  const cuuint64_t dims[2] = {cuuint64_t(inner), cuuint64_t(outer)};
  const cuuint64_t strides[1] = {cuuint64_t(row_stride_bytes)};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  CUtensorMap m;
  const CUresult r = encode(&m, dtype, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return false;
  *map = m;
  return true;
}

}  // namespace lowbit::tma
