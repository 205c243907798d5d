// On a GPU host: the hardware conversions fast kernels use (PTX cvt.rn.satfinite.*, the
// __nv_cvt_* intrinsics as compiled for this target) are bit-identical to the portable codec
// over the same sweeps as the CPU tests; the codec itself and Philox give the same bits on the
// device as on the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp6.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/sweeps.h"
#include "lowbit/core/cuda_check.h"
#include "lowbit/core/philox.h"
#include "lowbit/formats.h"

namespace lowbit {
namespace {

enum class Op : int {
  kPtxE4M3,      // cvt.rn.satfinite.e4m3x2.f32
  kPtxE5M2,      // cvt.rn.satfinite.e5m2x2.f32
  kNvE4M3Sat,    // __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)
  kNvE4M3NoSat,  // __NV_NOSAT
  kNvE5M2Sat,
  kNvE5M2NoSat,
  kNvE2M1,  // __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest)
  kNvE3M2,  // __nv_cvt_float_to_fp6(x, __NV_E3M2, cudaRoundNearest)
  kNvE2M3,
  kNvE8M0CeilSat,   // __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf)
  kNvE8M0FloorSat,  // cudaRoundZero
  kNvE8M0CeilNoSat,
  kNvBf16Rn,      // __float2bfloat16_rn
  kNvF16Rn,       // __float2half_rn (IEEE: overflow → inf)
  kNvBf16x2E4M3,  // __nv_cvt_bfloat16raw2_to_fp8x2 from the bf16 pattern of x
  kNvBf16x2E5M2,
};

__global__ void hw_convert_kernel(uint32_t* out, const float* in, int n, Op op) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = in[i];
  uint32_t r = 0;
  switch (op) {
    case Op::kPtxE4M3: {
      unsigned short pair;
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
      r = pair & 0xFFu;  // b (second source) goes to the lower byte
      break;
    }
    case Op::kPtxE5M2: {
      unsigned short pair;
      asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(x), "f"(0.0f));
      r = pair >> 8;  // a (first source) goes to the upper byte
      break;
    }
    case Op::kNvE4M3Sat: r = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); break;
    case Op::kNvE4M3NoSat: r = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3); break;
    case Op::kNvE5M2Sat: r = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2); break;
    case Op::kNvE5M2NoSat: r = __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2); break;
    case Op::kNvE2M1: r = __nv_cvt_float_to_fp4(x, __NV_E2M1, cudaRoundNearest); break;
    case Op::kNvE3M2: r = __nv_cvt_float_to_fp6(x, __NV_E3M2, cudaRoundNearest); break;
    case Op::kNvE2M3: r = __nv_cvt_float_to_fp6(x, __NV_E2M3, cudaRoundNearest); break;
    case Op::kNvE8M0CeilSat: r = __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundPosInf); break;
    case Op::kNvE8M0FloorSat: r = __nv_cvt_float_to_e8m0(x, __NV_SATFINITE, cudaRoundZero); break;
    case Op::kNvE8M0CeilNoSat: r = __nv_cvt_float_to_e8m0(x, __NV_NOSAT, cudaRoundPosInf); break;
    case Op::kNvBf16Rn: r = __bfloat16_as_ushort(__float2bfloat16_rn(x)); break;
    case Op::kNvF16Rn: r = __half_as_ushort(__float2half_rn(x)); break;
    case Op::kNvBf16x2E4M3:
    case Op::kNvBf16x2E5M2: {
      __nv_bfloat162_raw pair;
      pair.x = static_cast<unsigned short>(__float_as_uint(x) >> 16);
      pair.y = 0;
      const __nv_fp8x2_storage_t s = __nv_cvt_bfloat16raw2_to_fp8x2(
          pair, __NV_SATFINITE, op == Op::kNvBf16x2E4M3 ? __NV_E4M3 : __NV_E5M2);
      r = s & 0xFFu;  // .x in the low byte
      break;
    }
  }
  out[i] = r;
}

// The portable codec, run on the device.
__global__ void codec_on_device_kernel(uint32_t* out, const float* in, int n, DType t, Overflow ov,
                                       int stochastic) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = stochastic ? encode_sr(t, in[i], philox_uint32(99, 5, i), ov) : encode_rn(t, in[i], ov);
}

__global__ void decode_on_device_kernel(float* out, int n_codes, DType t) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n_codes) return;
  out[c] = t == DType::kE8M0 ? decode_e8m0(static_cast<uint8_t>(c)) : decode(t, c);
}

__global__ void hw_decode_fp8_kernel(float* out, int e5m2) {
  const int c = threadIdx.x;
  unsigned int h2;
  const unsigned short pair = static_cast<unsigned short>(c | (c << 8));
  if (e5m2) {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h2) : "h"(pair));
  } else {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(pair));
  }
  __half lo = __ushort_as_half(static_cast<unsigned short>(h2 & 0xFFFFu));
  out[c] = __half2float(lo);
}

__global__ void philox_kernel(uint32_t* out, int n, uint64_t seed, uint64_t offset, uint64_t base) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = philox_uint32(seed, offset, base + i);
}

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

class GpuCodec : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(have_gpu()) << "the GPU tests need a CUDA GPU (run them on a GPU host)";
  }
};

// Copies `in` to the device, runs launch(d_out, d_in, n) over a poisoned output, returns it.
template <typename Launch>
std::vector<uint32_t> map_on_device(const std::vector<float>& in, Launch launch) {
  const int n = static_cast<int>(in.size());
  float* d_in;
  uint32_t* d_out;
  LOWBIT_CUDA_CHECK(cudaMalloc(&d_in, n * sizeof(float)));
  LOWBIT_CUDA_CHECK(cudaMalloc(&d_out, n * sizeof(uint32_t)));
  LOWBIT_CUDA_CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  LOWBIT_CUDA_CHECK(cudaMemset(d_out, 0xAB, n * sizeof(uint32_t)));  // poison
  launch(d_out, d_in, n);
  LOWBIT_CUDA_CHECK_LAUNCH();
  std::vector<uint32_t> out(n);
  LOWBIT_CUDA_CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  cudaFree(d_in);
  cudaFree(d_out);
  return out;
}

std::vector<uint32_t> run_on_device(const std::vector<float>& in, Op op) {
  return map_on_device(in, [op](uint32_t* out, const float* x, int n) {
    hw_convert_kernel<<<(n + 255) / 256, 256>>>(out, x, n, op);
  });
}

std::vector<uint32_t> codec_on_device(const std::vector<float>& in, DType t, Overflow ov, bool sr) {
  return map_on_device(in, [=](uint32_t* out, const float* x, int n) {
    codec_on_device_kernel<<<(n + 255) / 256, 256>>>(out, x, n, t, ov, sr ? 1 : 0);
  });
}

std::vector<float> inputs_for(DType t) {
  std::vector<float> in = test::all_bf16_as_f32();
  for (DType s : {DType::kE4M3, DType::kE5M2, DType::kE3M2, DType::kE2M3, DType::kE2M1}) {
    const std::vector<float> sw = test::boundary_sweep(s);
    in.insert(in.end(), sw.begin(), sw.end());
  }
  if (t == DType::kF16) {
    const std::vector<float> sw = test::boundary_sweep(DType::kF16);
    in.insert(in.end(), sw.begin(), sw.end());
  }
  return in;
}

template <typename Expected>
void expect_same(const std::vector<float>& in, const std::vector<uint32_t>& got, Expected want,
                 const std::string& what) {
  int64_t bad = 0;
  std::string first;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint32_t w = want(in[i]);
    if (w != got[i] && bad++ == 0) {
      first = "x bits 0x" + std::to_string(f32_bits(in[i])) + " want " + std::to_string(w) +
              " got " + std::to_string(got[i]);
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << in.size() << " differ; first " << first;
}

TEST_F(GpuCodec, PtxSatfiniteFp8MatchesCodec) {
  const std::vector<float> in = inputs_for(DType::kE4M3);
  expect_same(
      in, run_on_device(in, Op::kPtxE4M3), [](float x) { return encode_rn(DType::kE4M3, x); },
      "cvt.rn.satfinite.e4m3x2.f32");
  expect_same(
      in, run_on_device(in, Op::kPtxE5M2), [](float x) { return encode_rn(DType::kE5M2, x); },
      "cvt.rn.satfinite.e5m2x2.f32");
}

TEST_F(GpuCodec, NvCvtFp8SatAndNoSatMatchCodec) {
  const std::vector<float> in = inputs_for(DType::kE4M3);
  for (auto [op, t, ov, name] :
       {std::tuple{Op::kNvE4M3Sat, DType::kE4M3, Overflow::kSatFinite, "e4m3 satfinite"},
        std::tuple{Op::kNvE4M3NoSat, DType::kE4M3, Overflow::kNonSat, "e4m3 nosat"},
        std::tuple{Op::kNvE5M2Sat, DType::kE5M2, Overflow::kSatFinite, "e5m2 satfinite"},
        std::tuple{Op::kNvE5M2NoSat, DType::kE5M2, Overflow::kNonSat, "e5m2 nosat"}}) {
    expect_same(
        in, run_on_device(in, op), [t = t, ov = ov](float x) { return encode_rn(t, x, ov); },
        std::string("__nv_cvt_float_to_fp8 ") + name);
  }
}

TEST_F(GpuCodec, NvCvtFp4Fp6MatchCodec) {
  const std::vector<float> in = inputs_for(DType::kE2M1);
  expect_same(
      in, run_on_device(in, Op::kNvE2M1), [](float x) { return encode_rn(DType::kE2M1, x); },
      "__nv_cvt_float_to_fp4 e2m1");
  expect_same(
      in, run_on_device(in, Op::kNvE3M2), [](float x) { return encode_rn(DType::kE3M2, x); },
      "__nv_cvt_float_to_fp6 e3m2");
  expect_same(
      in, run_on_device(in, Op::kNvE2M3), [](float x) { return encode_rn(DType::kE2M3, x); },
      "__nv_cvt_float_to_fp6 e2m3");
}

TEST_F(GpuCodec, NvCvtE8M0MatchesCodec) {
  std::vector<float> in = inputs_for(DType::kE8M0);
  for (int k = -149; k <= 127; ++k) {
    const float p = std::ldexp(1.0f, k);
    for (int u = -2; u <= 2; ++u) in.push_back(test::step_ulps(p, u));
  }
  expect_same(
      in, run_on_device(in, Op::kNvE8M0CeilSat),
      [](float x) { return encode_e8m0(x, E8M0Rounding::kCeil, Overflow::kSatFinite); },
      "__nv_cvt_float_to_e8m0 rp satfinite");
  expect_same(
      in, run_on_device(in, Op::kNvE8M0FloorSat),
      [](float x) { return encode_e8m0(x, E8M0Rounding::kFloor, Overflow::kSatFinite); },
      "__nv_cvt_float_to_e8m0 rz satfinite");
  expect_same(
      in, run_on_device(in, Op::kNvE8M0CeilNoSat),
      [](float x) { return encode_e8m0(x, E8M0Rounding::kCeil, Overflow::kNonSat); },
      "__nv_cvt_float_to_e8m0 rp nosat");
}

TEST_F(GpuCodec, Bf16AndF16RoundingMatchCodec) {
  // NaN payloads are implementation-defined (CUDA writes 0x7FFF), so NaN inputs only need
  // to stay NaN; every other input must give the same bits.
  std::vector<float> finite_or_inf, nans;
  for (float x : inputs_for(DType::kF16)) (std::isnan(x) ? nans : finite_or_inf).push_back(x);
  expect_same(
      finite_or_inf, run_on_device(finite_or_inf, Op::kNvBf16Rn),
      [](float x) { return f32_to_bf16_rn(x); }, "__float2bfloat16_rn");
  for (uint32_t b : run_on_device(nans, Op::kNvBf16Rn)) {
    EXPECT_TRUE(std::isnan(bf16_to_f32(static_cast<uint16_t>(b))));
  }
  expect_same(
      finite_or_inf, run_on_device(finite_or_inf, Op::kNvF16Rn),
      [](float x) { return encode_rn(DType::kF16, x, Overflow::kNonSat); }, "__float2half_rn");
}

TEST_F(GpuCodec, Bf16PairToFp8MatchesCodec) {
  const std::vector<float> in = test::all_bf16_as_f32();
  expect_same(
      in, run_on_device(in, Op::kNvBf16x2E4M3), [](float x) { return encode_rn(DType::kE4M3, x); },
      "bf16x2 → e4m3x2");
  expect_same(
      in, run_on_device(in, Op::kNvBf16x2E5M2), [](float x) { return encode_rn(DType::kE5M2, x); },
      "bf16x2 → e5m2x2");
}

TEST_F(GpuCodec, HardwareFp8DecodeMatchesCodec) {
  float* d;
  LOWBIT_CUDA_CHECK(cudaMalloc(&d, 256 * sizeof(float)));
  for (int e5m2 = 0; e5m2 < 2; ++e5m2) {
    hw_decode_fp8_kernel<<<1, 256>>>(d, e5m2);
    LOWBIT_CUDA_CHECK_LAUNCH();
    float got[256];
    LOWBIT_CUDA_CHECK(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost));
    const DType t = e5m2 ? DType::kE5M2 : DType::kE4M3;
    for (int c = 0; c < 256; ++c) {
      const float want = decode(t, c);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[c])) << dtype_name(t) << " code " << c;
      } else {
        EXPECT_EQ(f32_bits(got[c]), f32_bits(want)) << dtype_name(t) << " code " << c;
      }
    }
  }
  cudaFree(d);
}

TEST_F(GpuCodec, PortableCodecIsBitIdenticalOnDevice) {
  for (DType t : {DType::kE4M3, DType::kE5M2, DType::kE3M2, DType::kE2M3, DType::kE2M1,
                  DType::kUE4M3, DType::kF16}) {
    const std::vector<float> in = inputs_for(t);
    for (Overflow ov : {Overflow::kSatFinite, Overflow::kNonSat}) {
      expect_same(
          in, codec_on_device(in, t, ov, false), [t, ov](float x) { return encode_rn(t, x, ov); },
          std::string("device encode_rn ") + std::string(dtype_name(t)));
      std::vector<uint32_t> sr = codec_on_device(in, t, ov, true);
      int64_t bad = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        bad += sr[i] != encode_sr(t, in[i], philox_uint32(99, 5, i), ov);
      }
      EXPECT_EQ(bad, 0) << "device encode_sr " << dtype_name(t);
    }
  }
  // Decoding every code, including E8M0.
  float* d;
  LOWBIT_CUDA_CHECK(cudaMalloc(&d, 65536 * sizeof(float)));
  for (DType t : {DType::kE4M3, DType::kE5M2, DType::kE3M2, DType::kE2M3, DType::kE2M1,
                  DType::kUE4M3, DType::kE8M0, DType::kF16}) {
    const int n = t == DType::kF16                         ? 65536
                  : t == DType::kE2M1                      ? 16
                  : t == DType::kE3M2 || t == DType::kE2M3 ? 64
                                                           : 256;
    decode_on_device_kernel<<<(n + 255) / 256, 256>>>(d, n, t);
    LOWBIT_CUDA_CHECK_LAUNCH();
    std::vector<float> got(n);
    LOWBIT_CUDA_CHECK(cudaMemcpy(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int c = 0; c < n; ++c) {
      const float want = t == DType::kE8M0 ? decode_e8m0(static_cast<uint8_t>(c)) : decode(t, c);
      ASSERT_EQ(f32_bits(got[c]), f32_bits(want)) << dtype_name(t) << " code " << c;
    }
  }
  cudaFree(d);
}

TEST_F(GpuCodec, PhiloxStreamMatchesHost) {
  const int n = 1 << 20;
  uint32_t* d;
  LOWBIT_CUDA_CHECK(cudaMalloc(&d, n * sizeof(uint32_t)));
  for (uint64_t base : {0ull, (1ull << 33) + 7}) {
    philox_kernel<<<n / 256, 256>>>(d, n, 0xDEADBEEFCAFEull, 77, base);
    LOWBIT_CUDA_CHECK_LAUNCH();
    std::vector<uint32_t> got(n);
    LOWBIT_CUDA_CHECK(cudaMemcpy(got.data(), d, n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(got[i], philox_uint32(0xDEADBEEFCAFEull, 77, base + i)) << "index " << base + i;
    }
  }
  cudaFree(d);
}

}  // namespace
}  // namespace lowbit
