// FP8 delayed scaling on the device: the same per-slot update as the CPU twin
// (delayed_update_slot in quant/scale_math.h), one thread per slot.
#include "lowbit/core/cuda_check.h"
#include "lowbit/quant/scale_math.h"
#include "quant/cuda_common.cuh"
#include "quant/quant_cuda.h"

namespace lowbit::quant_cuda {

namespace {

__global__ void delayed_update_kernel(float* history,  // [L, n] f32
                                      int64_t len, int64_t n, bool algo_max, float scaled_max,
                                      float* scale, float* scale_inv) {  // [n] f32 each
  const int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (s < n) delayed_update_slot(history, len, n, s, algo_max, scaled_max, scale, scale_inv);
}

__global__ void record_amax_kernel(float* row0_slot, float amax) {
  *row0_slot = fmax_num(*row0_slot, amax);
}

}  // namespace

void delayed_record_amax(float* row0_slot, float amax, cudaStream_t stream) {
  record_amax_kernel<<<1, 1, 0, stream>>>(row0_slot, amax);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void delayed_update(float* history, int64_t len, int64_t n_slots, bool algo_max, float scaled_max,
                    float* scale, float* scale_inv, cudaStream_t stream) {
  const int threads = 128;
  delayed_update_kernel<<<unsigned((n_slots + threads - 1) / threads), threads, 0, stream>>>(
      history, len, n_slots, algo_max, scaled_max, scale, scale_inv);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void device_synchronize() { LOWBIT_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace lowbit::quant_cuda
