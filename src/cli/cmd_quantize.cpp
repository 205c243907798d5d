// `lowbit quantize IN OUT --recipe R`: converts the rank-2 floating tensors of a safetensors
// checkpoint to a low-precision recipe's payload and scales (docs/quantized-checkpoints.md).
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "lowbit/core.h"
#include "lowbit/data/safetensors.h"
#include "lowbit/formats.h"
#include "lowbit/quant.h"
#include "lowbit/quant/layout.h"

namespace lowbit::cli {

namespace {

struct QuantRecipe {
  const char* name;
  QuantConfig cfg;
  int k_multiple;  // the rowwise copy needs K % k_multiple == 0
  int m_multiple;  // and M % m_multiple == 0
  const char* data_desc;
  const char* scale_desc;
  const char* scale2_desc;  // NVFP4 only
};

constexpr const char* kRecipeNames =
    "fp8, fp8-current, fp8-block, mxfp8, nvfp4, mxfp4, mxfp6-e3m2, mxfp6-e2m3";

QuantRecipe make_recipe(const std::string& r) {
  QuantRecipe q{};
  q.name = nullptr;
  q.k_multiple = 1;
  q.m_multiple = 1;
  q.scale2_desc = nullptr;
  if (r == "fp8" || r == "fp8-current") {
    q.cfg = QuantConfig::fp8_current(DType::kE4M3);
    q.data_desc = "F8_E4M3 [M, K]: E4M3 codes";
    q.scale_desc =
        "F32 [1]: per-tensor dequantization scale (1 / quantization scale); "
        "value = e4m3 * scale";
  } else if (r == "fp8-block") {
    q.cfg = QuantConfig::fp8_block_128x128(DType::kE4M3);
    q.data_desc = "F8_E4M3 [M, K]: E4M3 codes";
    q.scale_desc =
        "F32 [ceil(M/128), ceil(K/128)]: dequantization scale of each 128x128 tile "
        "(power of two); value[i][j] = e4m3[i][j] * scale[i/128][j/128]";
  } else if (r == "mxfp8") {
    q.cfg = QuantConfig::mx(DType::kE4M3);
    q.k_multiple = 32;
    q.data_desc = "F8_E4M3 [M, K]: E4M3 codes";
    q.scale_desc =
        "U8 [M, K/32]: E8M0 scale of each 1x32 block along K (2^(s-127)); "
        "value[i][j] = e4m3[i][j] * 2^(scale[i][j/32] - 127)";
  } else if (r == "mxfp6-e3m2" || r == "mxfp6-e2m3") {
    const bool e3m2 = r == "mxfp6-e3m2";
    q.cfg = QuantConfig::mx(e3m2 ? DType::kE3M2 : DType::kE2M3);
    q.k_multiple = 32;
    q.data_desc = e3m2 ? "U8 [M, K]: FP6 E3M2 codes, one per byte, two MSBs zero"
                       : "U8 [M, K]: FP6 E2M3 codes, one per byte, two MSBs zero";
    q.scale_desc =
        "U8 [M, K/32]: E8M0 scale of each 1x32 block along K (2^(s-127)); "
        "value[i][j] = fp6[i][j] * 2^(scale[i][j/32] - 127)";
  } else if (r == "mxfp4") {
    q.cfg = QuantConfig::mx(DType::kE2M1);
    q.k_multiple = 32;
    q.data_desc = "U8 [M, K/2]: E2M1 codes, two per byte, even element in the low nibble";
    q.scale_desc =
        "U8 [M, K/32]: E8M0 scale of each 1x32 block along K (2^(s-127)); "
        "value[i][j] = e2m1[i][j] * 2^(scale[i][j/32] - 127)";
  } else if (r == "nvfp4") {
    q.cfg = QuantConfig::nvfp4_weight();
    q.k_multiple = 16;
    q.m_multiple = 16;
    q.data_desc = "U8 [M, K/2]: E2M1 codes, two per byte, even element in the low nibble";
    q.scale_desc =
        "F8_E4M3 [M, K/16]: UE4M3 scale of each 16x16 tile, repeated in the tile's "
        "16 rows; value[i][j] = e2m1[i][j] * scale[i][j/16] * scale_2";
    q.scale2_desc =
        "F32 [1]: second-level scale amax / 2688 (2688 = 448 * 6), amax = max |x| "
        "of the source tensor";
  } else {
    throw UserError(fmt::format("--recipe: unknown recipe '{}' (recipes: {})", r, kRecipeNames));
  }
  q.name = r.c_str();
  q.cfg.columnwise = false;
  q.cfg.rowwise = true;
  return q;
}

// IEEE binary16 → binary32 (exact).
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::vector<uint8_t> tensor_bytes(const TensorView& v) {
  const auto* p = static_cast<const uint8_t*>(v.data);
  return std::vector<uint8_t>(p, p + v.nbytes());
}

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

// What the non-finite values of `src` cost its finite ones: an inf enters the amax of its scale
// block (and of the tensor, for per-tensor and NVFP4 scales), whose scale can then flush the
// block's finite values to 0, turn them into NaN or round them more coarsely. Measured against a
// quantization of `src` with its non-finite values set to 0, among the finite values whose
// dequantized value differs from that one: `lost` counts those that dequantize to 0 (from a
// non-zero source) or NaN / inf in `dq`, `changed` the others.
struct NonfiniteCost {
  int64_t lost = 0, changed = 0;
};
NonfiniteCost nonfinite_cost(Context& ctx, const std::vector<float>& src, int64_t m, int64_t k,
                             const QuantConfig& cfg, const float* dq) {
  std::vector<float> clean(src);
  for (float& v : clean) {
    if (!std::isfinite(v)) v = 0.0f;
  }
  QuantizedTensor qc;
  quantize(ctx, TensorView(clean.data(), DType::kF32, Shape{m, k}, Device::cpu()), cfg, qc);
  const Tensor dc = dequantize(qc, Usage::kRowwise);
  const float* cp = dc.ptr<float>();
  const auto gone = [](float x, float d) { return !std::isfinite(d) || (d == 0.0f && x != 0.0f); };
  NonfiniteCost cost;
  for (size_t i = 0; i < src.size(); ++i) {
    if (!std::isfinite(src[i]) || dq[i] == cp[i] || (std::isnan(dq[i]) && std::isnan(cp[i]))) {
      continue;
    }
    ++(gone(src[i], dq[i]) ? cost.lost : cost.changed);
  }
  return cost;
}

// OUT's directory must exist and take a new file: checked before the conversion, which can take
// minutes, rather than when the output is written.
void check_out_dir(const std::string& out_path) {
  const std::filesystem::path parent = std::filesystem::path(out_path).parent_path();
  const std::string dir = parent.empty() ? "." : parent.string();
  std::error_code ec;
  const bool exists = std::filesystem::exists(dir, ec);
  LOWBIT_USER_CHECK(exists, "{}: cannot create the output file: the directory {} does not exist",
                    out_path, dir);
  LOWBIT_USER_CHECK(std::filesystem::is_directory(dir, ec),
                    "{}: cannot create the output file: {} is not a directory", out_path, dir);
  LOWBIT_USER_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0,
                    "{}: cannot create the output file: the directory {} is not writable ({})",
                    out_path, dir, std::strerror(errno));
}

int run_quantize(const std::string& in_path, const std::string& out_path,
                 const std::string& recipe_name) {
  const QuantRecipe recipe = make_recipe(recipe_name);
  {
    // OUT must not be IN (by any name): the full-precision weights would be replaced by their
    // quantized copy.
    std::error_code ec;
    LOWBIT_USER_CHECK(!std::filesystem::equivalent(in_path, out_path, ec),
                      "{}: OUT is the input file; write the quantized copy to another file",
                      out_path);
    // Refused before any tensor is read and quantized.
    LOWBIT_USER_CHECK(!out_path.empty(),
                      "the output file name is empty: give OUT, the path of the file to write");
    LOWBIT_USER_CHECK(out_path.back() != '/' && !std::filesystem::is_directory(out_path, ec),
                      "{}: OUT is a directory; give the path of the file to write", out_path);
    check_out_dir(out_path);
  }
  const data::SafeTensorsFile in = data::read_safetensors(in_path);
  {
    // An output of this command holds payloads and scales, not weights: quantizing it again
    // would read E4M3 codes and scales as numbers (or copy U8 codes as they are).
    const auto recipe_it = in.metadata.find("quantization");
    const auto format_it = in.metadata.find("format");
    LOWBIT_USER_CHECK(recipe_it == in.metadata.end() &&
                          (format_it == in.metadata.end() || format_it->second != "lowbit"),
                      "{}: the file is already quantized (with recipe '{}'); quantize the "
                      "original full-precision checkpoint instead",
                      in_path, recipe_it != in.metadata.end() ? recipe_it->second : "unknown");
  }
  const int64_t in_bytes = file_size(in_path);
  Context ctx(Device::cpu());

  data::SafeTensorsFile out;
  int converted = 0, copied = 0;
  double max_err = 0.0, sum_err = 0.0;
  std::string max_err_name;
  auto put = [&](const std::string& name, data::SafeTensor t) {
    LOWBIT_USER_CHECK(!out.tensors.count(name),
                      "{}: output tensor '{}' would be written twice (the input already has a "
                      "tensor of that name)",
                      in_path, name);
    out.tensors.emplace(name, std::move(t));
  };

  for (const auto& [name, t] : in.tensors) {
    const bool is_float = t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16";
    if (!is_float || t.shape.size() != 2) {
      put(name, t);
      ++copied;
      continue;
    }
    const int64_t m = t.shape[0], k = t.shape[1];
    if (m == 0 || k == 0 || k % recipe.k_multiple != 0 || m % recipe.m_multiple != 0) {
      const std::string need = m == 0 || k == 0 ? std::string("a non-empty tensor")
                               : recipe.m_multiple > 1
                                   ? fmt::format("M and K multiples of {}", recipe.k_multiple)
                                   : fmt::format("K a multiple of {}", recipe.k_multiple);
      std::fprintf(stderr, "note: %s [%lld, %lld] copied unchanged: %s needs %s\n", name.c_str(),
                   static_cast<long long>(m), static_cast<long long>(k), recipe.name, need.c_str());
      put(name, t);
      ++copied;
      continue;
    }
    // The source as f32 (exact for BF16 and F16), also the reference for the error.
    std::vector<float> src(static_cast<size_t>(m * k));
    if (t.dtype == "F32") {
      std::memcpy(src.data(), t.data.data(), t.data.size());
    } else {
      const auto* h = reinterpret_cast<const uint16_t*>(t.data.data());
      for (size_t i = 0; i < src.size(); ++i) {
        uint16_t u;
        std::memcpy(&u, h + i, 2);
        src[i] = t.dtype == "BF16" ? bf16_to_f32(u) : f16_to_f32(u);
      }
    }
    const TensorView x(src.data(), DType::kF32, Shape{m, k}, Device::cpu());
    QuantizedTensor q;
    try {
      quantize(ctx, x, recipe.cfg, q);
    } catch (const UserError& e) {
      std::fprintf(stderr, "note: %s [%lld, %lld] copied unchanged: %s\n", name.c_str(),
                   static_cast<long long>(m), static_cast<long long>(k), e.what());
      put(name, t);
      ++copied;
      continue;
    }

    data::SafeTensor payload;
    payload.dtype = data::safetensors_dtype_name(q.dtype);
    payload.shape =
        q.dtype == DType::kE2M1 ? std::vector<int64_t>{m, k / 2} : std::vector<int64_t>{m, k};
    payload.data = tensor_bytes(q.rowwise_data);

    data::SafeTensor scale;
    const TensorView& s = q.rowwise_scale_inv.view();
    scale.dtype = data::safetensors_dtype_name(s.dtype);
    if (q.mode == ScalingMode::kBlock128x128) {
      // Drop the pad4 columns of the GEMM layout: compact [ceil(M/128), ceil(K/128)].
      const int64_t rows = s.shape[0], cols = ceil_div(k, int64_t{128});
      scale.shape = {rows, cols};
      const auto* p = static_cast<const uint8_t*>(s.data);
      for (int64_t r = 0; r < rows; ++r) {
        scale.data.insert(scale.data.end(), p + r * s.shape[1] * 4,
                          p + (r * s.shape[1] + cols) * 4);
      }
    } else {
      scale.shape.assign(s.shape.d, s.shape.d + s.shape.ndim);
      scale.data = tensor_bytes(s);
    }

    put(name, std::move(payload));
    put(name + "_scale", std::move(scale));
    if (q.mode == ScalingMode::kNVFP4_16x16 || q.mode == ScalingMode::kNVFP4_1x16) {
      const float amax = q.amax.ptr<float>()[0];
      const float scale_2 = mul_rn(amax, rcp_rn(2688.0f));
      data::SafeTensor s2;
      s2.dtype = "F32";
      s2.shape = {1};
      s2.data.resize(4);
      std::memcpy(s2.data.data(), &scale_2, 4);
      put(name + "_scale_2", std::move(s2));
    }

    // ||dequant - x||_2 / ||x||_2 over the finite source elements; a finite element that comes
    // back non-finite makes it infinite (and is reported, as are non-finite sources).
    const Tensor d = dequantize(q, Usage::kRowwise);
    const float* dp = d.ptr<float>();
    double num = 0.0, den = 0.0;
    int64_t nonfinite_src = 0, to_nonfinite = 0;
    for (size_t i = 0; i < src.size(); ++i) {
      if (!std::isfinite(src[i])) {
        ++nonfinite_src;
        continue;
      }
      if (!std::isfinite(dp[i])) {
        ++to_nonfinite;
        continue;
      }
      const double diff = static_cast<double>(dp[i]) - src[i];
      num += diff * diff;
      den += static_cast<double>(src[i]) * src[i];
    }
    double err = den > 0.0 ? std::sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0);
    if (to_nonfinite > 0) err = INFINITY;
    if (nonfinite_src > 0) {
      const NonfiniteCost c = nonfinite_cost(ctx, src, m, k, recipe.cfg, dp);
      const std::string cost =
          c.lost > 0 || c.changed > 0
              ? fmt::format(
                    "of the finite values sharing a scale with them, {} are lost (they "
                    "dequantize to 0 or NaN / inf) and {} come back otherwise changed; "
                    "check the source weights",
                    c.lost, c.changed)
              : "the finite values sharing a scale with them are unaffected";
      std::fprintf(stderr, "warning: %s [%lld, %lld]: %lld non-finite source values; %s\n",
                   name.c_str(), static_cast<long long>(m), static_cast<long long>(k),
                   static_cast<long long>(nonfinite_src), cost.c_str());
    } else if (to_nonfinite > 0) {
      std::fprintf(stderr,
                   "warning: %s [%lld, %lld]: %lld finite values dequantize to NaN / inf (values "
                   "near the float limit: their scales overflow); check the source weights\n",
                   name.c_str(), static_cast<long long>(m), static_cast<long long>(k),
                   static_cast<long long>(to_nonfinite));
    }
    if (converted == 0 || err > max_err) {
      max_err = err;
      max_err_name = name;
    }
    sum_err += err;
    ++converted;
  }

  // The input's own keys are kept, but not `layout.*`: those describe this command's output, and
  // only the ones written below may appear there.
  for (const auto& [key, value] : in.metadata) {
    if (key.rfind("layout.", 0) != 0) out.metadata[key] = value;
  }
  out.metadata["quantization"] = recipe_name;
  out.metadata["format"] = "lowbit";
  out.metadata["version"] = "1";
  out.metadata["layout.data"] = recipe.data_desc;
  out.metadata["layout.scale"] = recipe.scale_desc;
  if (recipe.scale2_desc != nullptr) out.metadata["layout.scale_2"] = recipe.scale2_desc;
  out.metadata["layout.copied"] =
      "tensors of rank other than 2, non-float tensors and shapes the recipe cannot take keep "
      "their name, dtype and bytes";
  data::write_safetensors(out_path, out);

  std::printf("quantize %s -> %s (recipe %s)\n", in_path.c_str(), out_path.c_str(),
              recipe_name.c_str());
  std::printf("  tensors: %d converted, %d copied unchanged\n", converted, copied);
  std::printf("  bytes:   %lld in, %lld out\n", static_cast<long long>(in_bytes),
              static_cast<long long>(file_size(out_path)));
  if (converted > 0) {
    std::printf("  relative error ||dequant - x|| / ||x|| (%s): max %.3e (%s), mean %.3e\n",
                recipe_name.c_str(), max_err, max_err_name.c_str(), sum_err / converted);
  }
  return 0;
}

}  // namespace

void add_quantize_command(CLI::App& app, CommandAction& action) {
  struct Opts {
    std::string in, out, recipe;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Convert the weights of a safetensors checkpoint to a low-precision recipe");
  cmd->add_option("IN", o->in, "Input .safetensors file")->required();
  cmd->add_option("OUT", o->out, "Output .safetensors file (written atomically)")->required();
  cmd->add_option("--recipe", o->recipe, fmt::format("One of: {}", kRecipeNames))->required();
  cmd->footer(
      "Every rank-2 F32/BF16/F16 tensor <name> [M, K] is quantized (rowwise copy, CPU) into\n"
      "<name> (payload), <name>_scale (scales) and, for nvfp4, <name>_scale_2 (F32 [1]).\n"
      "Rank-1 tensors (norms, biases), tensors of other ranks, non-float tensors and shapes\n"
      "the recipe cannot take (e.g. K not a multiple of 32 for MX) are copied unchanged.\n"
      "fp8 means fp8-current here: a one-shot conversion has no amax history for delayed\n"
      "scaling. fp8-block uses 128x128 tiles, nvfp4 16x16 tiles (weight layout).\n"
      "Layouts: docs/quantized-checkpoints.md.");
  cmd->callback([o, &action] { action = [o] { return run_quantize(o->in, o->out, o->recipe); }; });
}

}  // namespace lowbit::cli
