// FP8 delayed scaling on the device: the same per-slot update as the CPU twin
// (delayed_update_slot in quant/scale_math.h). One block per slot rolls its history column in
// parallel (a thread per slot walked 1024 dependent rows: ~0.4 ms per update); the amax is a
// max, so the parallel reduction equals the twin's sequential one.
#include "core/pdl.cuh"
#include "lowbit/core/cuda_check.h"
#include "lowbit/quant/scale_math.h"
#include "quant/cuda_common.cuh"
#include "quant/quant_cuda.h"

namespace lowbit::quant_cuda {

namespace {

__global__ void delayed_update_kernel(float* history,  // [L, n] f32
                                      int64_t len, int64_t n, bool algo_max, float scaled_max,
                                      float* scale, float* scale_inv) {  // [n] f32 each
  pdl::grid_sync();
  const int64_t s = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (s < n) delayed_update_slot(history, len, n, s, algo_max, scaled_max, scale, scale_inv);
}

constexpr int kRollThreads = 256;
constexpr int64_t kRollMaxLen = 12000;  // the history column staged in shared memory (< 48 KiB)

__global__ void delayed_roll_kernel(float* history,  // [L, n] f32
                                    int64_t len, int64_t n, bool algo_max, float scaled_max,
                                    float* scale, float* scale_inv) {  // [n] f32 each
  pdl::grid_sync();
  extern __shared__ float col[];  // [L]: the rolled column
  __shared__ float warp_max[kRollThreads / 32];
  const int64_t s = blockIdx.x;
  const float last = history[s];  // read by every thread before row 0 is rewritten
  float a_max = 0.0f;
  if (last != 0.0f) {  // uniform across the block
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      const float a = i < len - 1 ? history[(i + 1) * n + s] : last;
      col[i] = a;
      a_max = fmax_num(a_max, a);
    }
    __syncthreads();  // every old value is read before any is overwritten
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      history[i * n + s] = i > 0 ? col[i] : 0.0f;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    a_max = fmax_num(a_max, __shfl_down_sync(0xFFFFFFFFu, a_max, off));
  }
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = a_max;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_max[0];
    for (int w = 1; w < kRollThreads / 32; ++w) m = fmax_num(m, warp_max[w]);
    const float a = algo_max ? m : last;
    const float sc = delayed_scale_from_amax(a, scaled_max, scale[s]);
    scale[s] = sc;
    scale_inv[s] = scale_inv_from_scale(sc);
  }
}

__global__ void record_amax_kernel(float* row0_slot, float amax) {
  pdl::grid_sync();
  *row0_slot = fmax_num(*row0_slot, amax);
}

}  // namespace

void delayed_record_amax(float* row0_slot, float amax, cudaStream_t stream) {
  pdl::launch(record_amax_kernel, 1, 1, 0, stream, row0_slot, amax);
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void delayed_update(float* history, int64_t len, int64_t n_slots, bool algo_max, float scaled_max,
                    float* scale, float* scale_inv, cudaStream_t stream) {
  if (n_slots == 0) return;
  if (len <= kRollMaxLen) {
    pdl::launch(delayed_roll_kernel, unsigned(n_slots), kRollThreads, size_t(len) * sizeof(float),
                stream, history, len, n_slots, algo_max, scaled_max, scale, scale_inv);
  } else {  // very long histories: the sequential per-slot walk
    const int threads = 128;
    pdl::launch(delayed_update_kernel, unsigned((n_slots + threads - 1) / threads), threads, 0,
                stream, history, len, n_slots, algo_max, scaled_max, scale, scale_inv);
  }
  LOWBIT_CUDA_CHECK_LAUNCH();
}

void device_synchronize() { LOWBIT_CUDA_CHECK(cudaDeviceSynchronize()); }

}  // namespace lowbit::quant_cuda
