// CPU twin of rotary position embedding, and the frequency table shared with the GPU.
#include <cmath>
#include <vector>

#include "ops/ops_check.h"
#include "ops/rope_impl.h"

namespace lowbit::ops_detail {

std::vector<double> rope_inv_freq(int64_t head_dim, const RopeConfig& cfg) {
  const int64_t half = head_dim / 2;
  std::vector<double> f(half);
  for (int64_t i = 0; i < half; ++i) {
    f[i] = 1.0 / std::pow(double(cfg.theta), double(2 * i) / double(head_dim));
  }
  if (cfg.factor > 1.0f) {
    // Wavelengths (in positions) above low_freq_wavelen are slowed down by `factor`, those below
    // high_freq_wavelen kept, and those in between interpolated linearly in
    // original_max_positions / wavelength.
    const double factor = cfg.factor, lo = cfg.low_freq_factor, hi = cfg.high_freq_factor;
    const double old_len = cfg.original_max_positions;
    const double low_freq_wavelen = old_len / lo, high_freq_wavelen = old_len / hi;
    const double two_pi = 6.283185307179586476925286766559;
    for (double& v : f) {
      const double wavelen = two_pi / v;
      if (wavelen < high_freq_wavelen) continue;
      if (wavelen > low_freq_wavelen) {
        v = v / factor;
      } else {
        const double smooth = (old_len / wavelen - lo) / (hi - lo);
        v = (1.0 - smooth) * v / factor + smooth * v;
      }
    }
  }
  return f;
}

void rope_table_host(float* table, int64_t positions, int64_t head_dim, const RopeConfig& cfg) {
  const std::vector<double> f = rope_inv_freq(head_dim, cfg);
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < positions; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = double(t) * f[i];
      table[(t * half + i) * 2] = static_cast<float>(std::cos(angle));
      table[(t * half + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
}

void rope_apply_cpu(const TensorView& y, const TensorView& x, const TensorView& table, float sign) {
  const int64_t nb = x.size(0), nt = x.size(1), nh = x.size(2), dh = x.size(3), half = dh / 2;
  const float* tab = table.ptr<const float>();  // [T', Dh/2, 2]
  std::vector<float> in(dh), out(dh);           // [Dh] each; in-place safe
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t t = 0; t < nt; ++t) {
      const float* cs = tab + t * half * 2;  // [Dh/2, 2]
      for (int64_t h = 0; h < nh; ++h) {
        load_row(x, b * x.strides[0] + t * x.strides[1] + h * x.strides[2], dh, in.data());
        for (int64_t i = 0; i < half; ++i) {
          rope_rotate(in[i], in[i + half], cs[2 * i], sign * cs[2 * i + 1], out[i], out[i + half]);
        }
        store_row(y, b * y.strides[0] + t * y.strides[1] + h * y.strides[2], dh, out.data());
      }
    }
  }
}

}  // namespace lowbit::ops_detail
