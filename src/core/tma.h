// Host side of the TMA tile copies (core/tma.cuh): tensor maps for the attention kernels' bf16
// operands and plain 2-D maps (the fused MX / NVFP4 GEMM's operands and output).
// cuTensorMapEncodeTiled is a driver function; it is looked up through the runtime
// (cudaGetDriverEntryPointByVersion), so nothing links against libcuda.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace lowbit::tma {

// A tensor map over x [B, T, heads, Dh] bf16 (element strides sb, st, sh; the last dimension
// contiguous) whose box is 64 positions × 64 channels of one (batch, head), stored in shared
// memory as a [64, 64] tile in the 128-byte swizzle (16-byte chunk j of row r at j ^ (r % 8)),
// the wgmma panel layout. Box coordinates: (channel, head, position, batch). Positions ≥ T read
// as zeros. False (and *map untouched) when the driver has no TMA or rejects the layout (strides
// not multiples of 16 bytes, or not increasing from head to position to batch): the caller then
// uses its non-TMA kernels.
bool make_bthd_map(CUtensorMap* map, const void* x, int64_t B, int64_t T, int64_t heads, int64_t dh,
                   int64_t sb, int64_t st, int64_t sh);

// A 2-D tensor map over a row-major matrix of `outer` rows × `inner` elements (row stride
// `row_stride_bytes`, a multiple of 16) whose box is box_outer rows × box_inner elements, with
// the given shared-memory swizzle. Boxes past the matrix read as zeros. False (and *map
// untouched) when the driver has no TMA or rejects the layout.
bool make_2d_map(CUtensorMap* map, const void* base, CUtensorMapDataType dtype, int64_t inner,
                 int64_t outer, int64_t row_stride_bytes, uint32_t box_inner, uint32_t box_outer,
                 CUtensorMapSwizzle swizzle);

}  // namespace lowbit::tma
