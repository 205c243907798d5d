// `lowbit bench quant`: throughput of the shipped quantization kernels against the device's
// measured copy bandwidth, timed with CUDA events (median of the timed iterations).
//
// Bytes counted per recipe are the fewest the conversion must move: the bf16 source read once,
// every payload and scale written once. Kernels that read the source twice (current scaling's
// amax pass, NVFP4's global-amax pass) are still charged the single read, so their GB/s shows
// the cost of the second pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "bench/quant_bench.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/core/philox.h"
#include "lowbit/formats.h"
#include "quant/quant_cuda.h"

namespace lowbit::bench {

namespace {

// Normal(0, 1) bf16 values with a few heavy outliers, from Philox (Box–Muller).
__global__ void fill_normal_bf16_kernel(uint16_t* x, int64_t n, uint64_t seed) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float u1 = philox_uniform(seed, 0, 2 * i) + 1e-7f;
  const float u2 = philox_uniform(seed, 0, 2 * i + 1);
  float v = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
  if ((i % 4099) == 0) v *= 64.0f;  // outliers, as activations have
  x[i] = f32_to_bf16_rn(v);
}

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    LOWBIT_CUDA_CHECK(cudaMalloc(&p, bytes < 256 ? 256 : bytes));
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// Median milliseconds of one call of fn(i) (i selects the input buffer): each sample times a
// burst of back-to-back calls (about 1 ms of work) and divides, so that the host's launch latency
// stays out of the numbers — in a training step the host runs ahead of the GPU, and a single
// call timed between two events would count its launches (~5 µs, a quarter of a 16384 × 768
// conversion). Consecutive calls take consecutive input buffers.
template <typename Fn>
double time_median_ms(cudaStream_t stream, int warmup, int iters, Fn fn) {
  int next = 0;
  for (int i = 0; i < warmup; ++i) fn(next++);
  cudaEvent_t a, b;
  LOWBIT_CUDA_CHECK(cudaEventCreate(&a));
  LOWBIT_CUDA_CHECK(cudaEventCreate(&b));
  auto burst = [&](int calls) {
    LOWBIT_CUDA_CHECK(cudaEventRecord(a, stream));
    for (int c = 0; c < calls; ++c) fn(next++);
    LOWBIT_CUDA_CHECK(cudaEventRecord(b, stream));
    LOWBIT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    LOWBIT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    return double(t) / calls;
  };
  const double est = burst(3);
  const int calls = std::clamp(int(1.0 / std::max(est, 1e-3)) + 1, 1, 1000);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) ms.push_back(burst(calls));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

std::vector<QuantBenchRow> run_quant_bench(const QuantBenchOptions& opt) {
  LOWBIT_USER_CHECK(cuda_device_count() > 0, "bench quant needs a CUDA GPU; none was found");
  cudaStream_t stream;
  LOWBIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<QuantBenchRow> rows;
  for (const auto& shape_mk : opt.shapes) {
    const int64_t M = shape_mk.first, K = shape_mk.second;
    const int64_t n = M * K;
    const double mk = double(n);
    // Rotate inputs so that small shapes are not served from the 50 MB L2.
    const int nbuf = n * 2 < (256 << 20) ? 4 : 1;
    std::vector<std::unique_ptr<DeviceBuffer>> in;
    for (int b = 0; b < nbuf; ++b) {
      in.push_back(std::make_unique<DeviceBuffer>(n * 2));
      fill_normal_bf16_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(
          in.back()->as<uint16_t>(), n, 1000 + b);
      LOWBIT_CUDA_CHECK_LAUNCH();
    }
    DeviceBuffer copy_out(n * 2), q(n), qt(n), scale_row(n / 8 + 4096), scale_col(n / 8 + 4096);
    DeviceBuffer scalars(64 * sizeof(float));
    // Grid-reduction words of the current-scaling pass (zero between kernels, as a Context's).
    DeviceBuffer acc(64);
    LOWBIT_CUDA_CHECK(cudaMemsetAsync(acc.p, 0, 64, stream));
    float* amax = scalars.as<float>();
    float* scale = amax + 8;
    float* scale_inv = amax + 16;
    float* amax2 = amax + 24;
    const float one = 1.0f / 64.0f;
    LOWBIT_CUDA_CHECK(cudaMemcpy(scale, &one, sizeof(float), cudaMemcpyHostToDevice));
    auto src = [&](int i) { return in[i % nbuf]->as<const uint16_t>(); };
    const std::string shape = std::to_string(M) + "x" + std::to_string(K);
    auto add = [&](const char* recipe, double bytes, double ms, double copy_gbps) {
      QuantBenchRow r{shape, recipe, ms, bytes, bytes / ms / 1e6, 0.0};
      r.frac_of_copy = copy_gbps > 0 ? r.gbps / copy_gbps : 1.0;
      rows.push_back(r);
      std::printf("%-12s %-26s %9.4f ms %8.1f GB/s %6.1f%% of copy\n", shape.c_str(), recipe, ms,
                  r.gbps, 100.0 * r.frac_of_copy);
      std::fflush(stdout);
    };
    const int W = opt.warmup, I = opt.iters;

    const double copy_ms = time_median_ms(stream, W, I, [&](int i) {
      LOWBIT_CUDA_CHECK(
          cudaMemcpyAsync(copy_out.p, src(i), n * 2, cudaMemcpyDeviceToDevice, stream));
    });
    const double copy_gbps = 4 * mk / copy_ms / 1e6;
    add("copy (d2d)", 4 * mk, copy_ms, 0);

    add("fp8 delayed cast+T", 4 * mk,
        time_median_ms(stream, W, I,
                       [&](int i) {
                         quant_cuda::fp8_cast_transpose(src(i), M, K, scale, false, q.as<uint8_t>(),
                                                        qt.as<uint8_t>(), scale_inv, amax, nullptr,
                                                        stream);
                       }),
        copy_gbps);
    add("fp8 current cast+T", 4 * mk,
        time_median_ms(
            stream, W, I,
            [&](int i) {
              // As quantize() runs it (LOWBIT_QUANT_KERNELS=v11: the v11 kernels).
              if (quant_cuda::quant_kernels_version() >= 12) {
                quant_cuda::amax_scale(src(i), M, K, 448.0f, false, 0.0f, acc.as<uint32_t>(), amax2,
                                       scale + 1, scale_inv + 1, stream);
              } else {
                LOWBIT_CUDA_CHECK(cudaMemsetAsync(amax2, 0, 4, stream));
                quant_cuda::amax(src(i), n, amax2, stream);
                quant_cuda::current_scale(amax2, 448.0f, false, 0.0f, scale + 1, scale_inv + 1,
                                          stream);
              }
              quant_cuda::fp8_cast_transpose(src(i), M, K, scale + 1, false, q.as<uint8_t>(),
                                             qt.as<uint8_t>(), nullptr, nullptr, nullptr, stream);
            }),
        copy_gbps);
    const double s128 = 2 * mk / 128 * 4;
    add("fp8 block 1x128 +T", 4 * mk + s128,
        time_median_ms(stream, W, I,
                       [&](int i) {
                         quant_cuda::fp8_block(src(i), M, K, false, false, 448.0f, true, 0.0f,
                                               3.3895314e38f, q.as<uint8_t>(),
                                               scale_row.as<float>(), qt.as<uint8_t>(),
                                               scale_col.as<float>(), nullptr, stream);
                       }),
        copy_gbps);
    add("fp8 block 128x128 +T", 4 * mk,
        time_median_ms(stream, W, I,
                       [&](int i) {
                         quant_cuda::fp8_block(src(i), M, K, true, false, 448.0f, true, 0.0f,
                                               3.3895314e38f, q.as<uint8_t>(),
                                               scale_row.as<float>(), qt.as<uint8_t>(),
                                               scale_col.as<float>(), nullptr, stream);
                       }),
        copy_gbps);
    if (M % 32 == 0 && K % 32 == 0) {
      add("mxfp8 row+col", 4 * mk + 2 * mk / 32,
          time_median_ms(stream, W, I,
                         [&](int i) {
                           quant_cuda::mx(src(i), M, K, DType::kE4M3, MxScaleRounding::kCeil, true,
                                          true, false, RngKey{}, RngKey{}, q.as<uint8_t>(),
                                          scale_row.as<uint8_t>(), qt.as<uint8_t>(),
                                          scale_col.as<uint8_t>(), stream);
                         }),
          copy_gbps);
    }
    if (M % 16 == 0 && K % 16 == 0) {
      const double nv_bytes = 2 * mk + mk + 2 * mk / 16;
      auto nvfp4 = [&](int i, bool rht, bool sr, bool two_d, bool amax_ready = false) {
        // As quantize() runs it: the amax pass on the reduction words, no zeroing.
        quant_cuda::nvfp4(src(i), M, K, true, true, rht, sr, two_d, RngKey{7, 1}, RngKey{7, 2},
                          q.as<uint8_t>(), scale_row.as<uint8_t>(), qt.as<uint8_t>(),
                          scale_col.as<uint8_t>(), amax2, amax2 + 1, amax_ready, acc.as<uint32_t>(),
                          stream);
      };
      add("nvfp4 act (RHT col)", nv_bytes,
          time_median_ms(stream, W, I, [&](int i) { nvfp4(i, true, false, false); }), copy_gbps);
      // The quantize pass alone, the global amaxes already in place (what a producer computing
      // them in its epilogue would hand over; no producer does yet, so training runs the two
      // passes of the rows above and below).
      nvfp4(0, true, false, false);
      add("nvfp4 act, amax given", nv_bytes,
          time_median_ms(stream, W, I, [&](int i) { nvfp4(i, true, false, false, true); }),
          copy_gbps);
      add("nvfp4 grad (RHT+SR)", nv_bytes,
          time_median_ms(stream, W, I, [&](int i) { nvfp4(i, true, true, false); }), copy_gbps);
      add("nvfp4 grad, amax given", nv_bytes,
          time_median_ms(stream, W, I, [&](int i) { nvfp4(i, true, true, false, true); }),
          copy_gbps);
      add("nvfp4 weight 16x16", nv_bytes,
          time_median_ms(stream, W, I, [&](int i) { nvfp4(i, false, false, true); }), copy_gbps);
    }
    LOWBIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  cudaStreamDestroy(stream);
  return rows;
}

}  // namespace lowbit::bench
