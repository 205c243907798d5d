// Small device fills as a kernel launched with programmatic dependent launch (core/pdl.cuh)
// instead of cudaMemsetAsync. A memset node ends the overlap of dependent launches: the kernel
// after it is scheduled only once the memset is done, and the memset only once the kernel before
// it is, so a 4-byte fill between two kernels (the amax of every fused FP8 epilogue) costs two
// launch gaps. As a PDL kernel the fill waits for the previous kernel like any other (its
// griddepcontrol.wait), and the next kernel's blocks are already resident when it ends.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/fill_small.h"
#include "core/pdl.cuh"
#include "lowbit/core/cuda_check.h"

namespace lowbit {

namespace {

// dst [bytes] = byte, one block; the launcher keeps bytes ≤ kSmallFillBytes.
__global__ void fill_small_kernel(uint8_t* __restrict__ dst, uint8_t byte, uint32_t bytes) {
  pdl::grid_sync();
  for (uint32_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = byte;
}

}  // namespace

void fill_small_on(void* dst, uint8_t byte, size_t bytes, cudaStream_t stream) {
  LOWBIT_CHECK(bytes <= kSmallFillBytes, "fill_small_on: {} bytes exceed the small fill's {}",
               bytes, kSmallFillBytes);
  if (bytes == 0) return;
  pdl::launch(fill_small_kernel, 1, 256, 0, stream, static_cast<uint8_t*>(dst), byte,
              static_cast<uint32_t>(bytes));
  LOWBIT_CUDA_CHECK_LAUNCH();
}

}  // namespace lowbit
