// Model configurations: presets, validation, our JSON form and Hugging Face config.json.
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <type_traits>

// toml++ used header-only (the Debian package also ships a shared library we do not link).
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include "core/json_read.h"
#include "lowbit/model.h"

namespace lowbit {

namespace {

struct Preset {
  const char* name;
  int64_t vocab;  // 0: from the tokenizer
  int d, layers, heads, kv_heads, ffn, seq;
  bool tie;
  float theta;
};

// LLaMA-family shapes. tiny/124m/350m take their vocabulary from the tokenizer they are trained
// with; 1b/8b/70b are the LLaMA-3 shapes (128256 tokens) for memory planning and fine-tuning.
constexpr Preset kPresets[] = {
    {"tiny", 0, 128, 4, 2, 1, 384, 128, true, 10000.0f},
    {"124m", 0, 768, 12, 12, 12, 2048, 1024, true, 10000.0f},
    {"350m", 0, 1024, 24, 16, 8, 2816, 1024, true, 10000.0f},
    {"1b", 128256, 2048, 16, 32, 8, 8192, 2048, true, 500000.0f},
    {"8b", 128256, 4096, 32, 32, 8, 14336, 8192, false, 500000.0f},
    {"70b", 128256, 8192, 80, 64, 8, 28672, 8192, false, 500000.0f},
};

template <typename T>
void take(const nlohmann::json& j, const char* key, T& dst) {
  if (!j.contains(key) || j[key].is_null()) return;
  const nlohmann::json& v = j[key];
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // get<int>() would truncate 128.9 and wrap 2^32 + 128 to 128: integers in range only (a
    // whole-number float such as 4096.0 counts as one).
    constexpr double lo = double(std::numeric_limits<T>::min());
    constexpr double hi = double(std::numeric_limits<T>::max());
    const bool in_range =
        v.is_number_unsigned()  ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
        : v.is_number_integer() ? v.get<int64_t>() >= std::numeric_limits<T>::min() &&
                                      v.get<int64_t>() <= std::numeric_limits<T>::max()
        : v.is_number_float() ? std::trunc(v.get<double>()) == v.get<double>() &&
                                    v.get<double>() >= lo && v.get<double>() <= hi
                              : false;
    if (!in_range) {
      throw std::invalid_argument(fmt::format(
          "'{}' must be an integer in [{}, {}], got {}", key, std::numeric_limits<T>::min(),
          std::numeric_limits<T>::max(), v.is_primitive() ? v.dump() : std::string(v.type_name())));
    }
    dst = v.is_number_float() ? static_cast<T>(v.get<double>()) : v.get<T>();
    return;
  }
  dst = v.get<T>();
}

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

ModelConfig model_preset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    ModelConfig c;
    c.preset = p.name;
    c.vocab_size = p.vocab;
    c.d_model = p.d;
    c.n_layers = p.layers;
    c.n_heads = p.heads;
    c.n_kv_heads = p.kv_heads;
    c.ffn_hidden = p.ffn;
    c.max_seq_len = p.seq;
    c.tie_embeddings = p.tie;
    c.rope.theta = p.theta;
    return c;
  }
  std::string names;
  for (const Preset& p : kPresets) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
  throw UserError(fmt::format("unknown model preset '{}'; presets: {}", name, names));
}

int64_t ModelConfig::num_params() const {
  const int64_t d = d_model, dh = head_dim(), f = ffn_hidden;
  const int64_t per_block = d * (int64_t(n_heads) + 2 * n_kv_heads) * dh  // q, k, v
                            + int64_t(n_heads) * dh * d                   // o
                            + 3 * d * f                                   // gate, up, down
                            + 2 * d;                                      // two norms
  const int64_t emb = vocab_size * d;
  return emb + (tie_embeddings ? 0 : emb) + n_layers * per_block + d;
}

int64_t ModelConfig::num_matmul_params() const {
  return num_params() - vocab_size * d_model * (tie_embeddings ? 1 : 2);
}

double ModelConfig::train_flops_per_token(int seq_len) const {
  // The head is a matmul of every token even when tied to the embedding table.
  const double matmul = double(num_matmul_params()) + double(vocab_size) * d_model;
  const double attn = 6.0 * n_layers * double(seq_len) * n_heads * head_dim();
  return 6.0 * matmul + attn;
}

void ModelConfig::validate() const {
  auto fail = [&](const std::string& what) {
    throw UserError(fmt::format("model config ({}): {}", preset, what));
  };
  if (vocab_size <= 0) fail(fmt::format("vocab_size must be positive, got {}", vocab_size));
  if (vocab_size > (int64_t(1) << 31) - 1) fail("vocab_size must fit in int32");
  if (d_model <= 0 || n_layers <= 0 || n_heads <= 0 || n_kv_heads <= 0 || ffn_hidden <= 0 ||
      max_seq_len <= 0) {
    fail(fmt::format(
        "d_model, n_layers, n_heads, n_kv_heads, ffn_hidden and max_seq_len must be positive "
        "(got {}, {}, {}, {}, {}, {})",
        d_model, n_layers, n_heads, n_kv_heads, ffn_hidden, max_seq_len));
  }
  // Far above any model (Llama 3 405B has 126 blocks): a larger count is a typo, and the
  // per-block plans and buffers sized from it would exhaust host memory first.
  if (n_layers > 4096) fail(fmt::format("n_layers {} is above the limit of 4096 blocks", n_layers));
  if (d_model % n_heads != 0) {
    fail(fmt::format("d_model {} is not a multiple of n_heads {}", d_model, n_heads));
  }
  if (n_heads % n_kv_heads != 0) {
    fail(fmt::format("n_heads {} is not a multiple of n_kv_heads {} (grouped-query attention)",
                     n_heads, n_kv_heads));
  }
  if (head_dim() != 64 && head_dim() != 128) {
    fail(fmt::format("head dim d_model/n_heads = {} is not supported; use 64 or 128", head_dim()));
  }
  if (d_model % 16 != 0 || ffn_hidden % 16 != 0) {
    fail(fmt::format("d_model ({}) and ffn_hidden ({}) must be multiples of 16", d_model,
                     ffn_hidden));
  }
  if (!(norm_eps > 0) || !std::isfinite(norm_eps)) fail("norm_eps must be a positive number");
  if (!(rope.theta > 1) || !std::isfinite(rope.theta)) fail("rope_theta must be > 1");
}

std::string ModelConfig::to_json() const {
  nlohmann::json j;
  j["preset"] = preset;
  j["vocab_size"] = vocab_size;
  j["d_model"] = d_model;
  j["n_layers"] = n_layers;
  j["n_heads"] = n_heads;
  j["n_kv_heads"] = n_kv_heads;
  j["ffn_hidden"] = ffn_hidden;
  j["max_seq_len"] = max_seq_len;
  j["norm_eps"] = norm_eps;
  j["rope_theta"] = rope.theta;
  j["rope_factor"] = rope.factor;
  j["rope_low_freq_factor"] = rope.low_freq_factor;
  j["rope_high_freq_factor"] = rope.high_freq_factor;
  j["rope_original_max_positions"] = rope.original_max_positions;
  j["tie_embeddings"] = tie_embeddings;
  return j.dump();
}

ModelConfig model_config_from_json(const std::string& text, const ModelConfig& base,
                                   const std::string& source) {
  nlohmann::json j;
  try {
    j = parse_json_limited(text, source);
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& e) {
    throw UserError(fmt::format("{}: not valid JSON ({})", source, e.what()));
  }
  if (!j.is_object()) throw UserError(fmt::format("{}: expected a JSON object", source));
  ModelConfig c = base;
  try {
    if (j.contains("hidden_size") || j.contains("num_hidden_layers")) {
      // Hugging Face LLaMA config.json.
      c.preset = "hf";
      take(j, "vocab_size", c.vocab_size);
      take(j, "hidden_size", c.d_model);
      take(j, "num_hidden_layers", c.n_layers);
      take(j, "num_attention_heads", c.n_heads);
      c.n_kv_heads = c.n_heads;
      take(j, "num_key_value_heads", c.n_kv_heads);
      take(j, "intermediate_size", c.ffn_hidden);
      take(j, "max_position_embeddings", c.max_seq_len);
      take(j, "rms_norm_eps", c.norm_eps);
      take(j, "rope_theta", c.rope.theta);
      take(j, "tie_word_embeddings", c.tie_embeddings);
      if (j.contains("head_dim") && !j["head_dim"].is_null() && c.n_heads > 0) {
        int head_dim = 0;
        take(j, "head_dim", head_dim);
        if (head_dim != c.d_model / c.n_heads) {
          throw UserError(
              fmt::format("{}: head_dim {} ≠ hidden_size / num_attention_heads is not supported",
                          source, head_dim));
        }
      }
      if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
        const auto& rs = j["rope_scaling"];
        const std::string type = rs.value("rope_type", rs.value("type", std::string()));
        if (type != "llama3") {
          throw UserError(fmt::format("{}: rope_scaling type '{}' is not supported (only llama3)",
                                      source, type));
        }
        take(rs, "factor", c.rope.factor);
        take(rs, "low_freq_factor", c.rope.low_freq_factor);
        take(rs, "high_freq_factor", c.rope.high_freq_factor);
        take(rs, "original_max_position_embeddings", c.rope.original_max_positions);
      }
      if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
        throw UserError(fmt::format("{}: hidden_act {} is not supported (SwiGLU uses silu)", source,
                                    j["hidden_act"].dump()));
      }
    } else {
      static const char* kKnown[] = {"preset",
                                     "vocab_size",
                                     "d_model",
                                     "n_layers",
                                     "n_heads",
                                     "n_kv_heads",
                                     "ffn_hidden",
                                     "max_seq_len",
                                     "norm_eps",
                                     "rope_theta",
                                     "rope_factor",
                                     "rope_low_freq_factor",
                                     "rope_high_freq_factor",
                                     "rope_original_max_positions",
                                     "tie_embeddings"};
      for (auto it = j.begin(); it != j.end(); ++it) {
        bool known = false;
        for (const char* k : kKnown) known |= it.key() == k;
        if (!known) {
          throw UserError(fmt::format("{}: unknown model config key '{}'", source, it.key()));
        }
      }
      take(j, "preset", c.preset);
      take(j, "vocab_size", c.vocab_size);
      take(j, "d_model", c.d_model);
      take(j, "n_layers", c.n_layers);
      take(j, "n_heads", c.n_heads);
      take(j, "n_kv_heads", c.n_kv_heads);
      take(j, "ffn_hidden", c.ffn_hidden);
      take(j, "max_seq_len", c.max_seq_len);
      take(j, "norm_eps", c.norm_eps);
      take(j, "rope_theta", c.rope.theta);
      take(j, "rope_factor", c.rope.factor);
      take(j, "rope_low_freq_factor", c.rope.low_freq_factor);
      take(j, "rope_high_freq_factor", c.rope.high_freq_factor);
      take(j, "rope_original_max_positions", c.rope.original_max_positions);
      take(j, "tie_embeddings", c.tie_embeddings);
    }
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: a value has the wrong type ({})", source, e.what()));
  } catch (const std::invalid_argument& e) {  // take(): an integer out of range
    throw UserError(fmt::format("{}: {}", source, e.what()));
  }
  return c;
}

ModelConfig model_config_from_toml(const std::string& text, const ModelConfig& base,
                                   const std::string& source) {
  toml::table t;
  try {
    t = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw UserError(fmt::format("{}: not valid TOML ({})", source, e.description()));
  }
  // The same keys as our JSON form, at the top level or under [model].
  const toml::table* keys = t.get_as<toml::table>("model");
  if (keys == nullptr) keys = &t;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : *keys) {
    const std::string key(k.str());
    if (auto i = v.value<int64_t>(); i && v.is_integer()) {
      j[key] = *i;
    } else if (auto f = v.value<double>(); f && v.is_floating_point()) {
      // JSON has no NaN / inf (they would turn into null, i.e. "not given").
      LOWBIT_USER_CHECK(std::isfinite(*f), "{}: key '{}' is {}; give a finite number", source, key,
                        *f);
      j[key] = *f;
    } else if (auto b = v.value<bool>(); b && v.is_boolean()) {
      j[key] = *b;
    } else if (auto str = v.value<std::string>(); str && v.is_string()) {
      j[key] = *str;
    } else {
      throw UserError(fmt::format("{}: key '{}' must be a number, boolean or string", source, key));
    }
  }
  return model_config_from_json(j.dump(), base, source);
}

ModelConfig model_config_from_file(const std::string& path, const ModelConfig& base) {
  std::error_code ec;
  LOWBIT_USER_CHECK(!std::filesystem::is_directory(path, ec),
                    "model config '{}' is a directory; give the config file", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UserError(
        fmt::format("cannot read model config file '{}': {}", path, std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  const bool toml = path.size() >= 5 && path.compare(path.size() - 5, 5, ".toml") == 0;
  return toml ? model_config_from_toml(ss.str(), base, path)
              : model_config_from_json(ss.str(), base, path);
}

}  // namespace lowbit
