// Stream-ordered fills of a few bytes by a kernel that takes part in programmatic dependent
// launch (see fill_small.cu for why not cudaMemsetAsync).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace lowbit {

// The largest fill fill_small_on takes (one block of byte stores).
constexpr size_t kSmallFillBytes = 4096;

// dst[0 .. bytes) = byte on `stream`, after the work before it on that stream.
void fill_small_on(void* dst, uint8_t byte, size_t bytes, cudaStream_t stream);

}  // namespace lowbit
