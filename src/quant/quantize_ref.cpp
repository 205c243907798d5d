// CPU twin of quantize(): plain loops over blocks calling the shared per-block math of
// quant/scale_math.h and quant/hadamard16.h. Section numbers refer to formats.md.
#include <algorithm>
#include <vector>

#include "lowbit/formats.h"
#include "lowbit/quant/hadamard16.h"
#include "lowbit/quant/layout.h"
#include "lowbit/quant/scale_math.h"
#include "quant/quant_ref.h"

namespace lowbit {
namespace {

constexpr int64_t kFp8Block = 128;
constexpr int64_t kMxBlock = 32;
constexpr int64_t kNvfp4Block = 16;

// Stochastic-rounding bits of element `idx` of a copy of element type `t` (0 when rounding to
// nearest).
struct SrStream {
  bool on = false;
  RngKey key;
  DType t = DType::kE4M3;
  uint32_t bits(int64_t idx) const {
    return on ? sr_bits(t, key.seed, key.offset, static_cast<uint64_t>(idx)) : 0u;
  }
};

// The source [M, K] (bf16 or f32, any strides) as a dense f32 matrix, either as is ([M, K]) or
// transposed ([K, M]). bf16 → f32 is exact, so nothing is rounded here.
std::vector<float> load_f32(const TensorView& x, bool transposed) {
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t s0 = x.strides[0], s1 = x.strides[1];
  std::vector<float> v(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t off = i * s0 + j * s1;
      const float f = x.dtype == DType::kBF16 ? bf16_to_f32(x.ptr<const uint16_t>()[off])
                                              : x.ptr<const float>()[off];
      v[static_cast<size_t>(transposed ? j * m + i : i * k + j)] = f;
    }
  }
  return v;
}

Tensor scalar_f32(float v) {
  Tensor t = Tensor::empty({1}, DType::kF32, Device::cpu());
  t.ptr<float>()[0] = v;
  return t;
}

float amax_of(const std::vector<float>& v) {
  float a = 0.0f;
  for (float f : v) a = amax_combine(a, f);
  return a;
}

// codes [R, C] → [C, R] (payload bytes; E2M1 nibbles are moved one by one).
Tensor transpose_codes(const Tensor& codes) {
  const int64_t r = codes.shape()[0], c = codes.shape()[1];
  const DType t = codes.dtype();
  Tensor out = Tensor::zeros({c, r}, t, Device::cpu());
  const uint8_t* src = codes.ptr<const uint8_t>();
  uint8_t* dst = out.ptr<uint8_t>();
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < c; ++j) put_code(dst, t, j * r + i, get_code(src, t, i * c + j));
  }
  return out;
}

// --- FP8 per tensor (§2.2, §2.3) ---------------------------------------------------------------

void quantize_per_tensor(const TensorView& x, const QuantConfig& cfg, const SrStream& sr,
                         QuantizedTensor& out) {
  const int64_t m = x.size(0), k = x.size(1);
  const std::vector<float> v = load_f32(x, false);  // [M, K]
  const float amax = amax_of(v);
  float scale;
  if (cfg.delayed != nullptr) {
    scale = cfg.delayed->scale_at(cfg.delayed_slot);  // the scale of the previous update
  } else {
    // Current scaling: an overflowing scale becomes FLT_MAX (§2.3).
    scale = compute_scale_from_amax(amax, dtype_max_finite(cfg.dtype), cfg.effective_pow2(),
                                    cfg.amax_epsilon, f32_max_finite());
  }
  const float scale_inv = scale_inv_from_scale(scale);
  Tensor codes = Tensor::zeros({m, k}, cfg.dtype, Device::cpu());  // [M, K] fp8
  uint8_t* q = codes.ptr<uint8_t>();
  for (int64_t idx = 0; idx < m * k; ++idx) {
    q[idx] = static_cast<uint8_t>(
        quantize_element(cfg.dtype, v[static_cast<size_t>(idx)], scale, sr.on, sr.bits(idx)));
  }
  // One scale for the whole tensor: the columnwise copy is the exact transpose (§2.3).
  if (cfg.columnwise) {
    out.columnwise_data = transpose_codes(codes);  // [K, M] fp8
    out.columnwise_scale_inv = scalar_f32(scale_inv);
  }
  if (cfg.rowwise) {
    out.rowwise_data = codes;
    out.rowwise_scale_inv = scalar_f32(scale_inv);
  }
  out.amax = scalar_f32(amax);
  if (cfg.delayed != nullptr) cfg.delayed->record_amax(cfg.delayed_slot, amax);
}

// --- FP8 1×128 blocks (§2.4) -------------------------------------------------------------------

// Blocks of 128 along the rows of v [R, C]; scales in the VEC128 layout [ceil(C/128), pad4(R)].
// Partial last blocks cover what is left of the row.
void fp8_blocks_1d(const std::vector<float>& v, int64_t r_count, int64_t c_count,
                   const QuantConfig& cfg, float value_for_inf, const SrStream& sr, Tensor& data,
                   Tensor& scale_inv) {
  const int64_t n_blocks = ceil_div(c_count, kFp8Block);
  data = Tensor::zeros({r_count, c_count}, cfg.dtype, Device::cpu());                // [R, C] fp8
  scale_inv = Tensor::zeros({n_blocks, pad4(r_count)}, DType::kF32, Device::cpu());  // VEC128
  uint8_t* q = data.ptr<uint8_t>();
  float* si = scale_inv.ptr<float>();
  const float fmax = dtype_max_finite(cfg.dtype);
  for (int64_t r = 0; r < r_count; ++r) {
    const float* row = v.data() + r * c_count;
    for (int64_t b = 0; b < n_blocks; ++b) {
      const int64_t c0 = b * kFp8Block, c1 = std::min(c_count, c0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t c = c0; c < c1; ++c) amax = amax_combine(amax, row[c]);
      const float s = compute_scale_from_amax(amax, fmax, cfg.effective_pow2(), cfg.amax_epsilon,
                                              value_for_inf);
      si[vec128_scale_index(r, b, r_count)] = scale_inv_from_scale(s);
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t idx = r * c_count + c;
        q[idx] = static_cast<uint8_t>(quantize_element(cfg.dtype, row[c], s, sr.on, sr.bits(idx)));
      }
    }
  }
}

void quantize_block_1x128(const TensorView& x, const QuantConfig& cfg, const SrStream& row_sr,
                          const SrStream& col_sr, QuantizedTensor& out) {
  const int64_t m = x.size(0), k = x.size(1);
  // A scale that overflows becomes the input dtype's max finite (bf16: 0x7F7F), §2.4.
  const float value_for_inf = dtype_max_finite(x.dtype);
  if (cfg.rowwise) {
    const std::vector<float> v = load_f32(x, false);  // [M, K]
    fp8_blocks_1d(v, m, k, cfg, value_for_inf, row_sr, out.rowwise_data, out.rowwise_scale_inv);
  }
  if (cfg.columnwise) {
    // Quantized again from the high-precision source, transposed: blocks run along M (§2.4).
    const std::vector<float> vt = load_f32(x, true);  // [K, M]
    fp8_blocks_1d(vt, k, m, cfg, value_for_inf, col_sr, out.columnwise_data,
                  out.columnwise_scale_inv);
  }
}

// --- FP8 128×128 tiles (§2.4) ------------------------------------------------------------------

void quantize_block_128x128(const TensorView& x, const QuantConfig& cfg, const SrStream& sr,
                            QuantizedTensor& out) {
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t mb_count = ceil_div(m, kFp8Block), kb_count = ceil_div(k, kFp8Block);
  const std::vector<float> v = load_f32(x, false);  // [M, K]
  const float fmax = dtype_max_finite(cfg.dtype);
  const float value_for_inf = dtype_max_finite(x.dtype);
  Tensor codes = Tensor::zeros({m, k}, cfg.dtype, Device::cpu());                     // [M, K] fp8
  Tensor si = Tensor::zeros({mb_count, pad4(kb_count)}, DType::kF32, Device::cpu());  // BLK128
  Tensor si_t = Tensor::zeros({kb_count, pad4(mb_count)}, DType::kF32, Device::cpu());
  uint8_t* q = codes.ptr<uint8_t>();
  for (int64_t mb = 0; mb < mb_count; ++mb) {
    const int64_t i0 = mb * kFp8Block, i1 = std::min(m, i0 + kFp8Block);
    for (int64_t kb = 0; kb < kb_count; ++kb) {
      const int64_t j0 = kb * kFp8Block, j1 = std::min(k, j0 + kFp8Block);
      float amax = 0.0f;
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) amax = amax_combine(amax, v[i * k + j]);
      }
      const float s = compute_scale_from_amax(amax, fmax, cfg.effective_pow2(), cfg.amax_epsilon,
                                              value_for_inf);
      const float s_inv = scale_inv_from_scale(s);
      si.ptr<float>()[blk128_scale_index(mb, kb, kb_count)] = s_inv;
      si_t.ptr<float>()[blk128_scale_index(kb, mb, mb_count)] = s_inv;  // transposed grid
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t idx = i * k + j;
          q[idx] =
              static_cast<uint8_t>(quantize_element(cfg.dtype, v[idx], s, sr.on, sr.bits(idx)));
        }
      }
    }
  }
  // 2D tiles: the columnwise copy is the exact transpose with the transposed scale grid.
  if (cfg.columnwise) {
    out.columnwise_data = transpose_codes(codes);  // [K, M] fp8
    out.columnwise_scale_inv = si_t;               // [ceil(K/128), pad4(ceil(M/128))]
  }
  if (cfg.rowwise) {
    out.rowwise_data = codes;
    out.rowwise_scale_inv = si;  // [ceil(M/128), pad4(ceil(K/128))]
  }
}

// --- MX 1×32 / 32×1 (§2.5) ---------------------------------------------------------------------

// 1×32 blocks along the rows of v [R, C]: data [R, C] (E2M1 packed along C), scales [R, C/32]
// e8m0; element (r, c) has logical (Philox) index r·C + c.
void mx_blocks_1d(const std::vector<float>& v, int64_t r_count, int64_t c_count,
                  const QuantConfig& cfg, const SrStream& sr, Tensor& data, Tensor& scale) {
  const DType t = cfg.dtype;
  data = Tensor::zeros({r_count, c_count}, t, Device::cpu());
  scale = Tensor::zeros({r_count, c_count / kMxBlock}, DType::kE8M0, Device::cpu());
  uint8_t* q = data.ptr<uint8_t>();
  uint8_t* sc = scale.ptr<uint8_t>();
  for (int64_t i = 0; i < r_count; ++i) {
    for (int64_t b = 0; b < c_count / kMxBlock; ++b) {
      float amax = 0.0f;
      for (int64_t j = b * kMxBlock; j < (b + 1) * kMxBlock; ++j) {
        amax = amax_combine(amax, v[i * c_count + j]);
      }
      const uint8_t e = mx_scale(amax, t, cfg.mx_rounding);
      sc[i * (c_count / kMxBlock) + b] = e;
      const float mult = mx_multiplier(e);  // exact power of two: x · mult is exact
      for (int64_t j = b * kMxBlock; j < (b + 1) * kMxBlock; ++j) {
        const int64_t idx = i * c_count + j;
        put_code(q, t, idx, quantize_element(t, v[idx], mult, sr.on, sr.bits(idx)));
      }
    }
  }
}

void quantize_mx(const TensorView& x, const QuantConfig& cfg, const SrStream& row_sr,
                 const SrStream& col_sr, QuantizedTensor& out) {
  const int64_t m = x.size(0), k = x.size(1);
  if (cfg.rowwise) {
    const std::vector<float> v = load_f32(x, false);  // [M, K]
    mx_blocks_1d(v, m, k, cfg, row_sr, out.rowwise_data, out.rowwise_scale_inv);
  }
  if (cfg.columnwise) {
    // 32×1 blocks along M, stored transposed: the rowwise blocks of x^T [K, M] (§2.5; Hopper's
    // GEMMs want both operands K-contiguous, and Blackwell's take that layout too).
    const std::vector<float> vt = load_f32(x, true);  // [K, M]
    mx_blocks_1d(vt, k, m, cfg, col_sr, out.columnwise_data, out.columnwise_scale_inv);
  }
}

// --- NVFP4 (§2.6) ------------------------------------------------------------------------------

// 1×16 blocks along the rows of v [R, C] with the global amax `amax`: data [R, C] e2m1,
// scales [R, C/16] ue4m3.
void nvfp4_blocks_1d(const std::vector<float>& v, int64_t r_count, int64_t c_count, float amax,
                     const SrStream& sr, Tensor& data, Tensor& scale) {
  const Nvfp4GlobalScale g = nvfp4_global_scale(amax);
  const int64_t n_blocks = c_count / kNvfp4Block;
  data = Tensor::zeros({r_count, c_count}, DType::kE2M1, Device::cpu());
  scale = Tensor::zeros({r_count, n_blocks}, DType::kUE4M3, Device::cpu());
  uint8_t* q = data.ptr<uint8_t>();
  uint8_t* sc = scale.ptr<uint8_t>();
  for (int64_t r = 0; r < r_count; ++r) {
    for (int64_t b = 0; b < n_blocks; ++b) {
      const float* blk = v.data() + r * c_count + b * kNvfp4Block;
      float b_amax = 0.0f;
      for (int64_t c = 0; c < kNvfp4Block; ++c) b_amax = amax_combine(b_amax, blk[c]);
      const uint8_t sd = nvfp4_block_scale(b_amax, g.k);
      sc[r * n_blocks + b] = sd;
      const float mult = nvfp4_block_multiplier(sd, g.s_dec);
      for (int64_t c = 0; c < kNvfp4Block; ++c) {
        const int64_t idx = r * c_count + b * kNvfp4Block + c;
        put_code(q, DType::kE2M1, idx,
                 quantize_element(DType::kE2M1, blk[c], mult, sr.on, sr.bits(idx)));
      }
    }
  }
}

// RHT(x^T): every 16-element chunk of the rows of x^T [K, M] (along M) times H, rounded to
// bf16 (§5.2). Input bf16 only.
std::vector<float> hadamard_transposed(const TensorView& x) {
  const int64_t m = x.size(0), k = x.size(1);
  const int64_t s0 = x.strides[0], s1 = x.strides[1];
  const uint16_t* p = x.ptr<const uint16_t>();
  std::vector<float> out(static_cast<size_t>(m * k));  // [K, M]
  float chunk[16];
  for (int64_t j = 0; j < k; ++j) {
    for (int64_t i0 = 0; i0 < m; i0 += 16) {
      for (int t = 0; t < 16; ++t) chunk[t] = bf16_to_f32(p[(i0 + t) * s0 + j * s1]);
      rht16_apply_f32(chunk);
      for (int t = 0; t < 16; ++t) out[static_cast<size_t>(j * m + i0 + t)] = chunk[t];
    }
  }
  return out;
}

void quantize_nvfp4_1x16(const TensorView& x, const QuantConfig& cfg, const SrStream& row_sr,
                         const SrStream& col_sr, QuantizedTensor& out) {
  const int64_t m = x.size(0), k = x.size(1);
  if (cfg.rowwise) {
    const std::vector<float> v = load_f32(x, false);  // [M, K]
    const float amax = amax_of(v);
    nvfp4_blocks_1d(v, m, k, amax, row_sr, out.rowwise_data, out.rowwise_scale_inv);
    out.amax = scalar_f32(amax);
  }
  if (cfg.columnwise) {
    // Transposed copy [K, M], quantized independently; with RHT its global amax is taken
    // after the transform (§2.6 "post-RHT amax").
    const bool rht = cfg.hadamard_columnwise;
    const std::vector<float> vt = rht ? hadamard_transposed(x) : load_f32(x, true);  // [K, M]
    const float amax = amax_of(vt);
    nvfp4_blocks_1d(vt, k, m, amax, col_sr, out.columnwise_data, out.columnwise_scale_inv);
    out.columnwise_amax = scalar_f32(amax);
    out.columnwise_hadamard = rht;
  }
}

void quantize_nvfp4_16x16(const TensorView& x, const QuantConfig& cfg, const SrStream& sr,
                          QuantizedTensor& out) {
  const int64_t m = x.size(0), k = x.size(1);
  const std::vector<float> v = load_f32(x, false);  // [M, K]
  const float amax = amax_of(v);
  const Nvfp4GlobalScale g = nvfp4_global_scale(amax);
  const int64_t mb_count = m / kNvfp4Block, kb_count = k / kNvfp4Block;
  Tensor codes = Tensor::zeros({m, k}, DType::kE2M1, Device::cpu());         // [M, K]
  Tensor sc = Tensor::zeros({m, kb_count}, DType::kUE4M3, Device::cpu());    // [M, K/16]
  Tensor sc_t = Tensor::zeros({k, mb_count}, DType::kUE4M3, Device::cpu());  // [K, M/16]
  uint8_t* q = codes.ptr<uint8_t>();
  for (int64_t mb = 0; mb < mb_count; ++mb) {
    for (int64_t kb = 0; kb < kb_count; ++kb) {
      float t_amax = 0.0f;  // one amax over the 256 elements of the tile
      for (int64_t i = mb * 16; i < mb * 16 + 16; ++i) {
        for (int64_t j = kb * 16; j < kb * 16 + 16; ++j)
          t_amax = amax_combine(t_amax, v[i * k + j]);
      }
      const uint8_t sd = nvfp4_block_scale(t_amax, g.k);
      const float mult = nvfp4_block_multiplier(sd, g.s_dec);
      // cuBLAS only knows 1×16 scales: the tile's scale is replicated in its 16 rows (and in
      // the 16 rows of the transposed tile of the columnwise copy).
      for (int64_t t = 0; t < 16; ++t) {
        sc.ptr<uint8_t>()[(mb * 16 + t) * kb_count + kb] = sd;
        sc_t.ptr<uint8_t>()[(kb * 16 + t) * mb_count + mb] = sd;
      }
      for (int64_t i = mb * 16; i < mb * 16 + 16; ++i) {
        for (int64_t j = kb * 16; j < kb * 16 + 16; ++j) {
          const int64_t idx = i * k + j;
          put_code(q, DType::kE2M1, idx,
                   quantize_element(DType::kE2M1, v[idx], mult, sr.on, sr.bits(idx)));
        }
      }
    }
  }
  // Same tiles and global amax: the columnwise copy is the exact transpose (§2.6 "2D weights").
  if (cfg.columnwise) {
    out.columnwise_data = transpose_codes(codes);  // [K, M] e2m1
    out.columnwise_scale_inv = sc_t;
    out.columnwise_amax = scalar_f32(amax);
  }
  if (cfg.rowwise) {
    out.rowwise_data = codes;
    out.rowwise_scale_inv = sc;
    out.amax = scalar_f32(amax);
  }
}

}  // namespace

void quantize_ref(const TensorView& x, const QuantConfig& cfg, const QuantStreams& streams,
                  QuantizedTensor& out) {
  out = QuantizedTensor{};
  out.mode = cfg.mode;
  out.dtype = cfg.dtype;
  out.shape = x.shape;
  const SrStream row_sr{streams.stochastic, streams.rowwise, cfg.dtype};
  const SrStream col_sr{streams.stochastic, streams.columnwise, cfg.dtype};
  switch (cfg.mode) {
    case ScalingMode::kPerTensor: quantize_per_tensor(x, cfg, row_sr, out); break;
    case ScalingMode::kBlock1x128: quantize_block_1x128(x, cfg, row_sr, col_sr, out); break;
    case ScalingMode::kBlock128x128: quantize_block_128x128(x, cfg, row_sr, out); break;
    case ScalingMode::kMX1x32: quantize_mx(x, cfg, row_sr, col_sr, out); break;
    case ScalingMode::kNVFP4_1x16: quantize_nvfp4_1x16(x, cfg, row_sr, col_sr, out); break;
    case ScalingMode::kNVFP4_16x16: quantize_nvfp4_16x16(x, cfg, row_sr, out); break;
  }
}

}  // namespace lowbit
