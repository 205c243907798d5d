// Checkpoints and Hugging Face interop (include/lowbit/train/checkpoint.h).
#include "lowbit/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_read.h"
#include "lowbit/core/error.h"
#include "lowbit/core/sysinfo.h"
#include "lowbit/core/tensor.h"
#include "lowbit/data/safetensors.h"
#include "lowbit/formats.h"
#include "lowbit/recipe.h"
#include "train/checkpoint_parsed.h"

namespace lowbit {

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian and written from host memory as is");

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// ---- CRC-64/XZ ----------------------------------------------------------------------------------
// Slicing by 8 (one 8-byte word per step through eight 256-entry tables). A single CRC is one
// long dependency chain, so large buffers run four independent lanes of kLaneBytes each,
// interleaved, and join them: for finalised CRC values (init = xorout = ~0),
// crc(A‖B) = Z^|B|(crc(A)) ⊕ crc(B), Z^n being the linear map of n zero bytes on the register.

namespace {

constexpr uint64_t kCrc64Poly = 0xC96C5795D7870F42ULL;  // ECMA-182, reflected
constexpr size_t kLaneBytes = 8192;
constexpr int kLanes = 4;

struct Crc64Tables {
  std::array<std::array<uint64_t, 256>, 8> t{};
  std::array<uint64_t, 64> shift_lane{};  // columns of Z^kLaneBytes
  Crc64Tables() {
    for (uint64_t i = 0; i < 256; ++i) {
      uint64_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCrc64Poly : c >> 1;
      t[0][i] = c;
    }
    for (int s = 1; s < 8; ++s) {
      for (int i = 0; i < 256; ++i) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
    for (int b = 0; b < 64; ++b) {
      uint64_t r = uint64_t(1) << b;
      for (size_t i = 0; i < kLaneBytes / 8; ++i) r = step(r);
      shift_lane[b] = r;
    }
  }
  // One 8-byte word of zeros (the word itself is xored in by the caller).
  uint64_t step(uint64_t c) const {
    return t[7][c & 0xFF] ^ t[6][(c >> 8) & 0xFF] ^ t[5][(c >> 16) & 0xFF] ^
           t[4][(c >> 24) & 0xFF] ^ t[3][(c >> 32) & 0xFF] ^ t[2][(c >> 40) & 0xFF] ^
           t[1][(c >> 48) & 0xFF] ^ t[0][c >> 56];
  }
  uint64_t shift(uint64_t c) const {
    uint64_t r = 0;
    for (int b = 0; c != 0; ++b, c >>= 1) {
      if (c & 1) r ^= shift_lane[b];
    }
    return r;
  }
};

const Crc64Tables& crc_tables() {
  static const Crc64Tables tables;
  return tables;
}

inline uint64_t load64(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;
}

}  // namespace

uint64_t crc64(const void* data, size_t bytes, uint64_t crc) {
  const Crc64Tables& tb = crc_tables();
  const auto& t = tb.t;
  const auto* p = static_cast<const uint8_t*>(data);
  while (bytes >= kLanes * kLaneBytes) {
    // Raw registers: lane 0 continues `crc`, the others start fresh.
    uint64_t c[kLanes] = {~crc, ~uint64_t(0), ~uint64_t(0), ~uint64_t(0)};
    for (size_t i = 0; i < kLaneBytes; i += 8) {
      for (int l = 0; l < kLanes; ++l) c[l] = tb.step(c[l] ^ load64(p + l * kLaneBytes + i));
    }
    crc = ~c[0];
    for (int l = 1; l < kLanes; ++l) crc = tb.shift(crc) ^ ~c[l];
    p += kLanes * kLaneBytes;
    bytes -= kLanes * kLaneBytes;
  }
  uint64_t c = ~crc;
  for (; bytes >= 8; p += 8, bytes -= 8) c = tb.step(c ^ load64(p));
  while (bytes-- > 0) c = t[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
  return ~c;
}

namespace {

std::string errno_text() { return std::strerror(errno); }

// Size and CRC-64 of `path`, read in 4 MiB pieces.
struct FileDigest {
  uint64_t bytes = 0;
  uint64_t crc = 0;
};

FileDigest digest_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LOWBIT_USER_CHECK(fd >= 0, "{}: cannot open the file: {}", path, errno_text());
  std::vector<uint8_t> buf(4u << 20);
  FileDigest d;
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string err = errno_text();
      ::close(fd);
      throw UserError(fmt::format("{}: reading the file failed: {}", path, err));
    }
    if (r == 0) break;
    d.crc = crc64(buf.data(), static_cast<size_t>(r), d.crc);
    d.bytes += static_cast<uint64_t>(r);
  }
  ::close(fd);
  return d;
}

std::string crc_hex(uint64_t crc) { return fmt::format("{:016x}", crc); }

}  // namespace

uint64_t crc64_file(const std::string& path) { return digest_file(path).crc; }

// ---- fault injection --------------------------------------------------------------------------

namespace {

std::mutex g_hook_mutex;
std::function<void(std::string_view)> g_failure_hook;

void failure_point(std::string_view stage) {
  std::function<void(std::string_view)> hook;
  {
    std::lock_guard<std::mutex> lock(g_hook_mutex);
    hook = g_failure_hook;
  }
  if (hook) hook(stage);
}

}  // namespace

void set_checkpoint_failure_hook(std::function<void(std::string_view stage)> hook) {
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  g_failure_hook = std::move(hook);
}

// ---- files -------------------------------------------------------------------------------------

namespace {

// A file written with write(2), its size and CRC-64 tracked, fsynced on close. The destructor
// of an unclosed writer closes the descriptor (the caller removes the directory).
class FileWriter {
 public:
  explicit FileWriter(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    LOWBIT_USER_CHECK(fd_ >= 0, "{}: cannot create the file: {}", path_, errno_text());
  }
  ~FileWriter() {
    if (fd_ >= 0) ::close(fd_);
  }
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  void write(const void* data, size_t n) {
    digest_.crc = crc64(data, n, digest_.crc);
    digest_.bytes += n;
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t(1) << 30));
      if (w < 0 && errno == EINTR) continue;
      LOWBIT_USER_CHECK(w > 0, "{}: writing failed: {} (disk full?)", path_,
                        w < 0 ? errno_text() : std::string("no progress"));
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  void write(const std::string& s) { write(s.data(), s.size()); }

  FileDigest close() {
    LOWBIT_USER_CHECK(::fsync(fd_) == 0, "{}: fsync failed: {}", path_, errno_text());
    const int fd = fd_;
    fd_ = -1;
    LOWBIT_USER_CHECK(::close(fd) == 0, "{}: closing failed: {}", path_, errno_text());
    return digest_;
  }

 private:
  std::string path_;
  int fd_ = -1;
  FileDigest digest_;
};

// fsync of a directory, so that the names created or renamed in it are durable. Some file
// systems do not support it (EINVAL): best effort.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOWBIT_USER_CHECK(in.good(), "{}: cannot read the file: {}", path, errno_text());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "dir/" → "dir"; empty → error.
std::string normalize_dir(const std::string& dir, const char* what) {
  LOWBIT_USER_CHECK(!dir.empty(), "{}: the directory name is empty", what);
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

std::string parent_of(const std::string& dir) {
  const fs::path p = fs::path(dir).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

// One tensor of a safetensors file being written: its header entry and where its bytes are.
struct OutTensor {
  std::string name;
  std::string dtype;  // safetensors name
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// The 8-byte header length and the JSON header (padded with spaces to a multiple of 8) of a
// safetensors file holding `tensors` back to back in the given order.
std::string safetensors_header(const std::vector<OutTensor>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  ojson h = ojson::object();
  if (!metadata.empty()) {
    ojson m = ojson::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t at = 0;
  for (const OutTensor& t : tensors) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes}}};
    at += t.bytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i, n >>= 8) out[i] = static_cast<char>(n & 0xFF);
  return out + text;
}

std::vector<int64_t> shape_vec(const Shape& s) {
  std::vector<int64_t> v;
  for (int i = 0; i < s.ndim; ++i) v.push_back(s.d[i]);
  return v;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + "]";
}

// A host tensor with the contents of `t` (no copy when it is already on the host).
Tensor on_host(const Tensor& t) {
  if (t.device().is_cpu()) return t;
  return Tensor::copy_of(t.view(), Device::cpu());
}

// A float printed as the shortest decimal that reads back as the same float, as a JSON
// number (1e-5f is written 1e-05, not 9.999999747378752e-06).
ojson json_float(float f) { return ojson(std::stod(fmt::format("{}", f))); }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return f32_from_bits(sign | 0x7F800000u | (man << 13));
  return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

// ---- the directory swap ---------------------------------------------------------------------

// Checks that `target` may be replaced: absent, or a directory holding only names of `ours`.
void check_replaceable(const std::string& target, const std::set<std::string>& ours,
                       const char* what) {
  std::error_code ec;
  const fs::file_status st = fs::status(target, ec);
  if (ec || !fs::exists(st)) return;
  LOWBIT_USER_CHECK(fs::is_directory(st),
                    "cannot save the {} to '{}': it exists and is not a directory; remove it or "
                    "choose another path",
                    what, target);
  for (const fs::directory_entry& e : fs::directory_iterator(target)) {
    const std::string name = e.path().filename().string();
    LOWBIT_USER_CHECK(ours.count(name) != 0,
                      "cannot save the {} to '{}': the directory exists and holds '{}', which is "
                      "not part of a {} and would be deleted when it is replaced; remove or move "
                      "the directory, or choose another path",
                      what, target, name, what);
  }
}

// Writes a directory through `fill(tmp_dir)` and renames it onto `target` (see the header).
void write_dir_atomically(const std::string& target, const char* what,
                          const std::function<void(const std::string& tmp)>& fill) {
  const std::string pid = std::to_string(static_cast<long>(::getpid()));
  const std::string tmp = target + ".tmp-" + pid;
  const std::string old = target + ".old-" + pid;
  const std::string parent = parent_of(target);
  std::error_code exists_ec;
  const bool had_old = fs::exists(target, exists_ec);
  std::string old_state =
      had_old ? "the previous one there is unchanged" : "nothing was written there";
  try {
    fs::create_directories(parent);
    fs::remove_all(tmp);  // a leftover of an earlier process with the same id
    fs::create_directory(tmp);
    fill(tmp);
    fsync_dir(tmp);
    if (had_old) {
      fs::remove_all(old);
      fs::rename(target, old);
      try {
        failure_point("swap");
        fs::rename(tmp, target);
      } catch (...) {
        std::error_code ec;
        fs::rename(old, target, ec);
        if (ec) old_state = fmt::format("the previous one is at {}: rename it back", old);
        throw;
      }
    } else {
      failure_point("swap");
      fs::rename(tmp, target);
    }
    fsync_dir(parent);
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw UserError(
        fmt::format("saving the {} to '{}' failed: {}; {}", what, target, e.what(), old_state));
  }
  std::error_code ec;
  fs::remove_all(old, ec);
  if (ec) {
    std::fprintf(stderr, "warning: could not remove the previous %s at %s: %s\n", what, old.c_str(),
                 ec.message().c_str());
  }
}

// ---- model file ---------------------------------------------------------------------------

// Writes the master weights of `arena` as a safetensors file in F32 or BF16.
FileDigest write_model_file(const std::string& path, const ParamArena& arena, DType dtype) {
  const std::vector<ParamInfo>& ps = arena.params();
  const int esize = dtype == DType::kBF16 ? 2 : 4;
  std::vector<OutTensor> out;
  for (const ParamInfo& p : ps) {
    out.push_back({p.name, data::safetensors_dtype_name(dtype), shape_vec(p.shape),
                   static_cast<uint64_t>(p.shape.numel()) * esize});
  }
  const Tensor host = on_host(arena.master_all);
  FileWriter w(path);
  w.write(safetensors_header(out, {{"format", "pt"}}));
  std::vector<uint16_t> buf;
  for (const ParamInfo& p : ps) {
    const float* src = host.ptr<float>() + p.offset;
    const int64_t n = p.shape.numel();
    if (dtype == DType::kBF16) {
      buf.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) buf[i] = f32_to_bf16_rn(src[i]);
      w.write(buf.data(), buf.size() * 2);
    } else {
      w.write(src, static_cast<size_t>(n) * 4);
    }
  }
  return w.close();
}

// The delayed-scaling tensors of one pass, in file order.
struct Fp8Pass {
  const char* name;  // "forward", "backward"
  DelayedScalingState* state;
};

std::vector<Fp8Pass> fp8_passes(const LlamaModel& model) {
  return {{"forward", model.fp8_forward_state()}, {"backward", model.fp8_backward_state()}};
}

FileDigest write_optimizer_file(const std::string& path, const LlamaModel& model) {
  const ParamArena& arena = model.params();
  const std::vector<ParamInfo>& ps = arena.params();
  std::vector<OutTensor> out;
  for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
    for (const ParamInfo& p : ps) {
      out.push_back(
          {p.name + suffix, "F32", shape_vec(p.shape), static_cast<uint64_t>(p.shape.numel()) * 4});
    }
  }
  std::vector<Tensor> fp8_host;
  for (const Fp8Pass& pass : fp8_passes(model)) {
    if (!pass.state) continue;
    const std::pair<const char*, const Tensor*> parts[] = {
        {"amax_history", &pass.state->amax_history()},
        {"scale", &pass.state->scale()},
        {"scale_inv", &pass.state->scale_inv()}};
    for (const auto& [part, t] : parts) {
      fp8_host.push_back(on_host(*t));
      out.push_back({fmt::format("fp8.{}.{}", pass.name, part), "F32", shape_vec(t->shape()),
                     static_cast<uint64_t>(t->nbytes())});
    }
  }
  FileWriter w(path);
  w.write(safetensors_header(out, {{"format", "pt"}}));
  // One moment buffer on the host at a time.
  for (const Tensor* moments : {&arena.m_all, &arena.v_all}) {
    const Tensor host = on_host(*moments);
    for (const ParamInfo& p : ps) {
      w.write(host.ptr<float>() + p.offset, static_cast<size_t>(p.shape.numel()) * 4);
    }
  }
  for (const Tensor& t : fp8_host) w.write(t.data(), static_cast<size_t>(t.nbytes()));
  return w.close();
}

FileDigest write_text(const std::string& path, const std::string& text) {
  FileWriter w(path);
  w.write(text);
  return w.close();
}

// Caller JSON (data state, train config): empty → null, else it must parse.
ojson caller_json(const std::string& text, const char* what) {
  if (text.empty()) return nullptr;
  try {
    return ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("checkpoint: the {} is not valid JSON ({}): {}", what, e.what(),
                                text.substr(0, 200)));
  }
}

}  // namespace

// ---- Hugging Face config ------------------------------------------------------------------------

std::string hf_config_json(const ModelConfig& cfg, DType weight_dtype) {
  LOWBIT_USER_CHECK(weight_dtype == DType::kF32 || weight_dtype == DType::kBF16,
                    "Hugging Face export: weights are written in f32 or bf16, not {}",
                    dtype_name(weight_dtype));
  ojson j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = cfg.d_model;
  j["intermediate_size"] = cfg.ffn_hidden;
  j["num_attention_heads"] = cfg.n_heads;
  j["num_key_value_heads"] = cfg.n_kv_heads;
  j["num_hidden_layers"] = cfg.n_layers;
  j["head_dim"] = cfg.head_dim();
  j["vocab_size"] = cfg.vocab_size;
  j["max_position_embeddings"] = cfg.max_seq_len;
  j["rms_norm_eps"] = json_float(cfg.norm_eps);
  j["rope_theta"] = json_float(cfg.rope.theta);
  if (cfg.rope.factor > 1.0f) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", json_float(cfg.rope.factor)},
                         {"low_freq_factor", json_float(cfg.rope.low_freq_factor)},
                         {"high_freq_factor", json_float(cfg.rope.high_freq_factor)},
                         {"original_max_position_embeddings", cfg.rope.original_max_positions}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = cfg.tie_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;
  j["pretraining_tp"] = 1;
  j["use_cache"] = true;
  j["torch_dtype"] = weight_dtype == DType::kBF16 ? "bfloat16" : "float32";
  return j.dump(2) + "\n";
}

ModelConfig hf_model_config(const std::string& dir, const ModelConfig& base) {
  const std::string path = normalize_dir(dir, "Hugging Face model") + "/config.json";
  LOWBIT_USER_CHECK(fs::exists(path),
                    "{}: missing; a Hugging Face model directory holds config.json and "
                    "model.safetensors",
                    path);
  return model_config_from_file(path, base);
}

// ---- save ---------------------------------------------------------------------------------------

void check_checkpoint_target(const std::string& dir) {
  check_replaceable(normalize_dir(dir, "checkpoint"),
                    {kCheckpointModelFile, kCheckpointOptimizerFile, kCheckpointConfigFile,
                     kCheckpointTrainerFile},
                    "checkpoint");
}

void save_checkpoint(const std::string& dir, const LlamaModel& model,
                     const CheckpointState& state) {
  const std::string target = normalize_dir(dir, "checkpoint");
  LOWBIT_USER_CHECK(state.step >= 0 && state.tokens >= 0,
                    "checkpoint: step ({}) and tokens ({}) must be ≥ 0", state.step, state.tokens);
  const ojson data_state = caller_json(state.data_state_json, "data loader state");
  const ojson train_config = caller_json(state.train_config_json, "training config");
  check_checkpoint_target(dir);
  const ModelConfig& cfg = model.config();
  const PrecisionPlan& plan = model.plan();

  write_dir_atomically(target, "checkpoint", [&](const std::string& tmp) {
    std::map<std::string, FileDigest> digests;
    digests[kCheckpointModelFile] =
        write_model_file(tmp + "/" + kCheckpointModelFile, model.params(), DType::kF32);
    failure_point(kCheckpointModelFile);
    digests[kCheckpointOptimizerFile] =
        write_optimizer_file(tmp + "/" + kCheckpointOptimizerFile, model);
    failure_point(kCheckpointOptimizerFile);
    digests[kCheckpointConfigFile] =
        write_text(tmp + "/" + kCheckpointConfigFile, hf_config_json(cfg, DType::kF32));
    failure_point(kCheckpointConfigFile);

    ojson t;
    t["format"] = "lowbit-checkpoint";
    t["format_version"] = kCheckpointFormatVersion;
    t["lowbit_version"] = build_info().version;
    t["saved_at_unix"] = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    t["step"] = state.step;
    t["tokens"] = state.tokens;
    t["rng"] = {{"seed", state.rng_seed}, {"offset", state.rng_offset}};
    t["recipe"] = recipe_name(plan.recipe);
    t["precision_plan"] = ojson::parse(plan.to_json());
    t["model_config"] = ojson::parse(cfg.to_json());
    t["train_config"] = train_config;
    t["data_state"] = data_state;
    ojson fp8 = ojson::array();
    for (const Fp8Pass& pass : fp8_passes(model)) {
      if (pass.state) fp8.push_back(pass.name);
    }
    t["fp8_scaling_state"] = fp8;
    ojson files = ojson::object();
    for (const auto& [name, d] : digests) {
      files[name] = {{"bytes", d.bytes}, {"crc64", crc_hex(d.crc)}};
    }
    t["files"] = files;
    write_text(tmp + "/" + kCheckpointTrainerFile, t.dump(2) + "\n");
    failure_point(kCheckpointTrainerFile);
  });
}

void save_hf_model(const std::string& dir, const LlamaModel& model, DType weight_dtype) {
  const std::string target = normalize_dir(dir, "Hugging Face model");
  const std::string config = hf_config_json(model.config(), weight_dtype);
  check_replaceable(target, {kCheckpointModelFile, kCheckpointConfigFile}, "Hugging Face model");
  write_dir_atomically(target, "Hugging Face model", [&](const std::string& tmp) {
    write_model_file(tmp + "/" + kCheckpointModelFile, model.params(), weight_dtype);
    write_text(tmp + "/" + kCheckpointConfigFile, config);
  });
}

// ---- load ---------------------------------------------------------------------------------------

namespace {

// Explains a missing checkpoint directory, pointing at what an interrupted save left behind.
[[noreturn]] void throw_missing_dir(const std::string& dir) {
  std::string hint;
  const fs::path p(dir);
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string base = p.filename().string();
  std::error_code ec;
  if (fs::is_directory(parent, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(parent, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(base + ".old-", 0) == 0) {
        hint = fmt::format(
            "; {} holds the previous checkpoint of an interrupted save: rename it to {} to use it",
            e.path().string(), dir);
        break;
      }
    }
  }
  throw UserError(fmt::format("checkpoint directory '{}' does not exist{}", dir, hint));
}

ojson read_trainer_json(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw_missing_dir(dir);
  LOWBIT_USER_CHECK(fs::is_directory(dir, ec),
                    "'{}' is not a directory; a checkpoint is a directory holding trainer.json, "
                    "model.safetensors, optimizer.safetensors and config.json",
                    dir);
  const std::string path = dir + "/" + kCheckpointTrainerFile;
  if (!fs::exists(path, ec)) {
    const bool hf = fs::exists(dir + "/" + kCheckpointConfigFile, ec);
    throw UserError(
        hf ? fmt::format("'{}' is not a lowbit checkpoint (no trainer.json); it looks like a "
                         "Hugging Face model: start from its weights with --init-from {}",
                         dir, dir)
           : fmt::format("'{}' is not a lowbit checkpoint: trainer.json is missing (an "
                         "incomplete copy?)",
                         dir));
  }
  LOWBIT_USER_CHECK(fs::is_regular_file(path, ec),
                    "{}: not a regular file; the checkpoint is damaged", path);
  ojson t;
  try {
    t = parse_json_limited<ojson>(read_text_file(path), path);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(
        fmt::format("{}: not valid JSON ({}); the checkpoint is damaged, use another "
                    "one",
                    path, e.what()));
  }
  LOWBIT_USER_CHECK(json_string_or(t, "format", "") == "lowbit-checkpoint",
                    "{}: not a lowbit checkpoint description (\"format\" is not "
                    "\"lowbit-checkpoint\")",
                    path);
  const int64_t version = json_int_or(t, "format_version", 0);
  LOWBIT_USER_CHECK(version >= 1,
                    "{}: \"format_version\" is missing or not a positive integer; the checkpoint "
                    "is damaged",
                    path);
  LOWBIT_USER_CHECK(version <= kCheckpointFormatVersion,
                    "{}: checkpoint format version {} written by lowbit {}; this build reads "
                    "version {} and earlier: use a newer lowbit",
                    path, version, json_string_or(t, "lowbit_version", "?"),
                    kCheckpointFormatVersion);
  for (const char* key : {"step", "tokens"}) {
    LOWBIT_USER_CHECK(t.contains(key) && t[key].is_number_integer() && t[key].get<int64_t>() >= 0,
                      "{}: \"{}\" is missing or not a non-negative integer; the checkpoint is "
                      "damaged",
                      path, key);
  }
  LOWBIT_USER_CHECK(t.contains("rng") && t["rng"].is_object() && t["rng"].contains("seed") &&
                        t["rng"]["seed"].is_number_unsigned() && t["rng"].contains("offset") &&
                        t["rng"]["offset"].is_number_unsigned(),
                    "{}: \"rng\" must hold unsigned \"seed\" and \"offset\"; the checkpoint is "
                    "damaged",
                    path);
  LOWBIT_USER_CHECK(t.contains("recipe") && t["recipe"].is_string(),
                    "{}: \"recipe\" is missing or not a string; the checkpoint is damaged", path);
  try {
    recipe_from_name(t["recipe"].get<std::string>());
  } catch (const UserError& e) {
    throw UserError(
        fmt::format("{}: \"recipe\" names no recipe of this build ({}); the "
                    "checkpoint is damaged or from another lowbit",
                    path, e.what()));
  }
  LOWBIT_USER_CHECK(t.contains("model_config") && t["model_config"].is_object(),
                    "{}: \"model_config\" is missing; the checkpoint is damaged", path);
  LOWBIT_USER_CHECK(t.contains("files") && t["files"].is_object(),
                    "{}: \"files\" (sizes and checksums) is missing; the checkpoint is damaged",
                    path);
  return t;
}

// Checks the size and CRC-64 of `name` against trainer.json.
void verify_file(const std::string& dir, const ojson& files, const std::string& name) {
  const std::string path = dir + "/" + name;
  LOWBIT_USER_CHECK(files.contains(name) && files[name].is_object() &&
                        files[name].contains("bytes") &&
                        files[name]["bytes"].is_number_unsigned() &&
                        files[name].contains("crc64") && files[name]["crc64"].is_string(),
                    "{}/trainer.json: no size and checksum recorded for {}; the checkpoint is "
                    "damaged",
                    dir, name);
  const uint64_t bytes = files[name]["bytes"].get<uint64_t>();
  const std::string crc = files[name]["crc64"].get<std::string>();
  std::error_code ec;
  LOWBIT_USER_CHECK(fs::exists(path, ec),
                    "{}: missing; the checkpoint is incomplete, use another checkpoint", path);
  const uint64_t size = fs::file_size(path, ec);
  LOWBIT_USER_CHECK(!ec, "{}: cannot read its size: {}", path, ec.message());
  LOWBIT_USER_CHECK(size == bytes,
                    "{}: {} bytes, but trainer.json records {}: the file is {} (an interrupted "
                    "copy?); use another checkpoint or copy this one again",
                    path, size, bytes, size < bytes ? "truncated" : "not the one written");
  const FileDigest d = digest_file(path);
  LOWBIT_USER_CHECK(crc_hex(d.crc) == crc,
                    "{}: checksum mismatch (CRC-64 {}, trainer.json records {}): the file is "
                    "corrupt; use another checkpoint or copy this one again",
                    path, crc_hex(d.crc), crc);
}

// Fields of `want` that `have` does not match, as "d_model 256 in <have_name>, 128 in the model".
// max_seq_len is left out (the weights do not depend on it); `seq_note` says when it differs.
std::vector<std::string> config_differences(const ModelConfig& have, const ModelConfig& want,
                                            const char* have_name, std::string* seq_note) {
  const nlohmann::json a = nlohmann::json::parse(have.to_json());
  const nlohmann::json b = nlohmann::json::parse(want.to_json());
  std::vector<std::string> out;
  for (auto it = b.begin(); it != b.end(); ++it) {
    if (it.key() == "preset") continue;
    const nlohmann::json av = a.contains(it.key()) ? a[it.key()] : nlohmann::json();
    if (av == it.value()) continue;
    if (it.key() == "max_seq_len") {
      if (seq_note) {
        *seq_note = fmt::format("max_seq_len is {} in the {}, {} in the model", av.dump(),
                                have_name, it.value().dump());
      }
      continue;
    }
    out.push_back(fmt::format("{} {} in the {}, {} in the model", it.key(), av.dump(), have_name,
                              it.value().dump()));
  }
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

// ---- safetensors reading, one tensor at a time -------------------------------------------------

bool is_weight_dtype(const std::string& d) { return d == "F32" || d == "BF16" || d == "F16"; }

struct StEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // in the data buffer
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// A safetensors file whose header is read and validated up front (the checks of
// data::read_safetensors) and whose tensors are then read one at a time, so that loading a
// model never holds more than one tensor beyond the model itself.
class StReader {
 public:
  explicit StReader(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    LOWBIT_USER_CHECK(fd_ >= 0, "{}: cannot open the file: {}", path_, errno_text());
    const off_t size = ::lseek(fd_, 0, SEEK_END);
    LOWBIT_USER_CHECK(size >= 0, "{}: cannot read the file size: {}", path_, errno_text());
    const uint64_t file_size = static_cast<uint64_t>(size);
    LOWBIT_USER_CHECK(file_size >= 8,
                      "{}: not a safetensors file: {} bytes is shorter than the 8-byte header "
                      "length (truncated?)",
                      path_, file_size);
    uint8_t len_bytes[8];
    read_at(len_bytes, 8, 0);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
    LOWBIT_USER_CHECK(header_len <= file_size - 8 && header_len <= (100u << 20),
                      "{}: header length {} is beyond the file size of {} bytes (truncated or not "
                      "a safetensors file)",
                      path_, header_len, file_size);
    std::string header(header_len, '\0');
    read_at(header.data(), header_len, 8);
    data_start_ = 8 + header_len;
    const uint64_t buffer = file_size - data_start_;
    data::check_safetensors_header_text(header, path_);
    nlohmann::json j;
    try {
      j = parse_json_limited(header, path_, /*unique_top_level_keys=*/true);
    } catch (const nlohmann::json::exception& e) {
      throw UserError(
          fmt::format("{}: the header is not valid JSON ({}); the file is damaged or "
                      "not a safetensors file",
                      path_, e.what()));
    }
    LOWBIT_USER_CHECK(j.is_object(), "{}: the header is not a JSON object", path_);
    std::vector<data::SafeTensorsSpan> spans;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "__metadata__") continue;
      const nlohmann::json& v = it.value();
      const std::string& name = it.key();
      auto bad = [&](const std::string& what) {
        throw UserError(fmt::format("{}: tensor '{}': {}; the file is damaged", path_, name, what));
      };
      if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string()) bad("no dtype");
      StEntry e;
      e.dtype = v["dtype"].get<std::string>();
      const int esize = data::safetensors_dtype_size(e.dtype);
      if (esize == 0) bad(fmt::format("unknown dtype '{}'", e.dtype));
      if (!v.contains("shape") || !v["shape"].is_array()) bad("no shape");
      uint64_t numel = 1;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned())
          bad(fmt::format("shape {} is not a list of sizes", v["shape"].dump()));
        const uint64_t n = d.get<uint64_t>();
        if (n != 0 && numel > (uint64_t(1) << 60) / n) bad("the shape is too large");
        numel *= n;
        e.shape.push_back(static_cast<int64_t>(n));
      }
      const auto& off = v.contains("data_offsets") ? v["data_offsets"] : nlohmann::json();
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
          !off[1].is_number_unsigned()) {
        bad("data_offsets must be two non-negative integers");
      }
      e.begin = off[0].get<uint64_t>();
      e.end = off[1].get<uint64_t>();
      if (e.begin > e.end || e.end - e.begin != numel * esize) {
        bad(fmt::format("data_offsets [{}, {}] do not match shape {} of {}", e.begin, e.end,
                        v["shape"].dump(), e.dtype));
      }
      if (e.end > buffer) {
        bad(fmt::format("data_offsets [{}, {}] are beyond the {} bytes of data (file truncated?)",
                        e.begin, e.end, buffer));
      }
      spans.push_back({e.begin, e.end, name});
      tensors_.emplace(name, std::move(e));
    }
    data::check_safetensors_spans(spans, buffer, path_);
  }
  ~StReader() {
    if (fd_ >= 0) ::close(fd_);
  }
  StReader(const StReader&) = delete;
  StReader& operator=(const StReader&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, StEntry>& tensors() const { return tensors_; }
  const StEntry* find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }

  // Tensor `e` (F32, BF16 or F16) as f32 into dst[numel]; `scratch` holds 16-bit data.
  void read_f32(const StEntry& e, float* dst, std::vector<uint8_t>& scratch) const {
    const uint64_t bytes = e.end - e.begin;
    const int64_t n = e.numel();
    if (e.dtype == "F32") {
      read_at(dst, bytes, data_start_ + e.begin);
      return;
    }
    scratch.resize(bytes);
    read_at(scratch.data(), bytes, data_start_ + e.begin);
    LOWBIT_CHECK(e.dtype == "BF16" || e.dtype == "F16", "dtype {}", e.dtype);
    const bool bf16 = e.dtype == "BF16";
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, scratch.data() + 2 * i, 2);
      dst[i] = bf16 ? bf16_to_f32(b) : f16_to_f32(b);
    }
  }

 private:
  void read_at(void* dst, uint64_t n, uint64_t offset) const {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r =
          ::pread(fd_, p, std::min<uint64_t>(n, uint64_t(1) << 30), static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      LOWBIT_USER_CHECK(r > 0, "{}: reading {} bytes at offset {} failed: {}", path_, n, offset,
                        r < 0 ? errno_text() : std::string("unexpected end of file (truncated?)"));
      p += r;
      n -= static_cast<uint64_t>(r);
      offset += static_cast<uint64_t>(r);
    }
  }

  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::map<std::string, StEntry> tensors_;
};

// Checks that `r` holds "<param name><suffix>" for every parameter with the parameter's shape
// and a weight dtype; `used` collects the names.
void check_params(const StReader& r, const ParamArena& arena, const std::string& suffix,
                  std::set<std::string>& used) {
  for (const ParamInfo& p : arena.params()) {
    const std::string name = p.name + suffix;
    const StEntry* e = r.find(name);
    LOWBIT_USER_CHECK(e != nullptr,
                      "{}: tensor '{}' is missing; the checkpoint does not hold this model's "
                      "parameters (written for another model?)",
                      r.path(), name);
    const std::vector<int64_t> want = shape_vec(p.shape);
    LOWBIT_USER_CHECK(e->shape == want,
                      "{}: tensor '{}' has shape {} but the model expects {}; the checkpoint was "
                      "written for another model config",
                      r.path(), name, shape_str(e->shape), shape_str(want));
    LOWBIT_USER_CHECK(is_weight_dtype(e->dtype),
                      "{}: tensor '{}' is {}; parameters must be F32, BF16 or F16", r.path(), name,
                      e->dtype);
    used.insert(name);
  }
}

void check_all_used(const StReader& r, const std::set<std::string>& used) {
  std::vector<std::string> extra;
  for (const auto& [name, e] : r.tensors()) {
    if (!used.count(name)) extra.push_back("'" + name + "'");
  }
  if (extra.empty()) return;
  const size_t n = extra.size();
  if (n > 5) extra.resize(5);
  throw UserError(
      fmt::format("{}: {} tensor{} that this model does not have ({}{}); the "
                  "checkpoint was written for another model",
                  r.path(), n, n == 1 ? "" : "s", join(extra, ", "), n > 5 ? ", …" : ""));
}

// Copies f32 data into `dst` (any device) through a host buffer when needed.
class SegmentLoader {
 public:
  // Reads tensor `e` of `r` into the contiguous f32 view `dst`.
  void load(const StReader& r, const StEntry& e, const TensorView& dst) {
    if (dst.device.is_cpu()) {
      r.read_f32(e, dst.ptr<float>(), scratch_);
      return;
    }
    host_.resize(static_cast<size_t>(e.numel()));
    r.read_f32(e, host_.data(), scratch_);
    copy_tensor(dst, TensorView(host_.data(), DType::kF32, dst.shape, Device::cpu()));
  }

 private:
  std::vector<float> host_;
  std::vector<uint8_t> scratch_;
};

// The view of parameter `p` in a [P] f32 arena buffer.
TensorView param_view(const Tensor& all, const ParamInfo& p) {
  return TensorView(all.ptr<float>() + p.offset, DType::kF32, p.shape, all.device());
}

}  // namespace

bool is_checkpoint_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(normalize_dir(dir, "checkpoint") + "/" + kCheckpointTrainerFile, ec);
}

CheckpointInfo read_checkpoint(const std::string& dir) {
  CheckpointInfo info;
  info.dir = normalize_dir(dir, "checkpoint");
  info.trainer_path = info.dir + "/" + kCheckpointTrainerFile;
  auto parsed = std::make_shared<CheckpointInfo::Parsed>();
  parsed->trainer = read_trainer_json(info.dir);
  const ojson& t = parsed->trainer;
  info.model_config =
      model_config_from_json(t["model_config"].dump(), ModelConfig{}, info.trainer_path);
  CheckpointState& st = info.state;
  st.recipe = t["recipe"].get<std::string>();
  st.step = t["step"].get<int64_t>();
  st.tokens = t["tokens"].get<int64_t>();
  st.rng_seed = t["rng"]["seed"].get<uint64_t>();
  st.rng_offset = t["rng"]["offset"].get<uint64_t>();
  const auto opaque = [&](const char* key) {
    return t.contains(key) && !t[key].is_null() ? t[key].dump() : std::string();
  };
  st.data_state_json = opaque("data_state");
  st.train_config_json = opaque("train_config");
  st.lowbit_version = json_string_or(t, "lowbit_version", "");
  info.parsed = std::move(parsed);
  return info;
}

CheckpointState load_checkpoint(const std::string& dir, LlamaModel& model, bool load_optimizer) {
  return load_checkpoint(read_checkpoint(dir), model, load_optimizer);
}

CheckpointState load_checkpoint(const CheckpointInfo& info, LlamaModel& model,
                                bool load_optimizer) {
  LOWBIT_CHECK(info.parsed != nullptr, "load_checkpoint: the CheckpointInfo of {} was not read",
               info.dir);
  const std::string& d = info.dir;
  const ojson& t = info.parsed->trainer;
  CheckpointState st = info.state;
  std::string seq_note;
  const std::vector<std::string> diffs =
      config_differences(info.model_config, model.config(), "checkpoint", &seq_note);
  LOWBIT_USER_CHECK(diffs.empty(),
                    "checkpoint '{}' was written for another model: {}; build the model from "
                    "the checkpoint's config ({}/config.json) to load it",
                    d, join(diffs, "; "), d);
  if (!seq_note.empty()) st.notes.push_back(seq_note);
  const std::string model_recipe = recipe_name(model.plan().recipe);
  if (st.recipe != model_recipe) {
    st.notes.push_back(fmt::format(
        "the checkpoint was trained with recipe {}, the model runs {}: weights{} carry over",
        st.recipe, model_recipe, load_optimizer ? " and optimizer moments" : ""));
  }

  // Every check runs before the model is touched: sizes and checksums of the files, then the
  // names, shapes and dtypes of every tensor.
  const ojson& files = t["files"];
  verify_file(d, files, kCheckpointModelFile);
  if (files.contains(kCheckpointConfigFile)) verify_file(d, files, kCheckpointConfigFile);
  if (load_optimizer) verify_file(d, files, kCheckpointOptimizerFile);

  ParamArena& arena = model.params();
  const StReader weights(d + "/" + kCheckpointModelFile);
  {
    std::set<std::string> used;
    check_params(weights, arena, "", used);
    check_all_used(weights, used);
  }
  std::unique_ptr<StReader> opt;
  struct Fp8Load {
    DelayedScalingState* state;
    const StEntry *history, *scale, *scale_inv;
  };
  std::vector<Fp8Load> fp8;
  if (load_optimizer) {
    opt = std::make_unique<StReader>(d + "/" + kCheckpointOptimizerFile);
    std::set<std::string> used;
    check_params(*opt, arena, ".exp_avg", used);
    check_params(*opt, arena, ".exp_avg_sq", used);
    for (const Fp8Pass& pass : fp8_passes(model)) {
      const std::string prefix = fmt::format("fp8.{}.", pass.name);
      for (const auto& [name, e] : opt->tensors()) {
        if (name.rfind(prefix, 0) == 0) used.insert(name);
      }
      if (!pass.state) continue;
      const StEntry* hist = opt->find(prefix + "amax_history");
      const StEntry* scale = opt->find(prefix + "scale");
      const StEntry* scale_inv = opt->find(prefix + "scale_inv");
      if (!hist || !scale || !scale_inv) {
        st.notes.push_back(fmt::format(
            "the checkpoint has no fp8 {} scaling state (recipe {}): its scales start fresh",
            pass.name, st.recipe));
        continue;
      }
      const std::vector<int64_t> want_h = shape_vec(pass.state->amax_history().shape());
      const std::vector<int64_t> want_s = shape_vec(pass.state->scale().shape());
      if (hist->shape != want_h || scale->shape != want_s || scale_inv->shape != want_s) {
        st.notes.push_back(fmt::format(
            "the checkpoint's fp8 {} amax history is {}, the model's {} (another amax history "
            "length or layer count): its scales start fresh",
            pass.name, shape_str(hist->shape), shape_str(want_h)));
        continue;
      }
      for (const StEntry* e : {hist, scale, scale_inv}) {
        LOWBIT_USER_CHECK(e->dtype == "F32", "{}: fp8 {} scaling state is {}, not F32", opt->path(),
                          pass.name, e->dtype);
      }
      fp8.push_back({pass.state, hist, scale, scale_inv});
    }
    check_all_used(*opt, used);
  }

  // Copy in, one tensor at a time.
  SegmentLoader loader;
  for (const ParamInfo& p : arena.params()) {
    loader.load(weights, *weights.find(p.name), param_view(arena.master_all, p));
  }
  if (load_optimizer) {
    for (const ParamInfo& p : arena.params()) {
      loader.load(*opt, *opt->find(p.name + ".exp_avg"), param_view(arena.m_all, p));
      loader.load(*opt, *opt->find(p.name + ".exp_avg_sq"), param_view(arena.v_all, p));
    }
    for (const Fp8Load& f : fp8) {
      loader.load(*opt, *f.history, f.state->amax_history());
      loader.load(*opt, *f.scale, f.state->scale());
      loader.load(*opt, *f.scale_inv, f.state->scale_inv());
    }
  } else {
    fill_bytes(arena.m_all, 0);
    fill_bytes(arena.v_all, 0);
  }
  model.sync_compute_weights();
  return st;
}

// ---- Hugging Face weights -----------------------------------------------------------------------

void load_hf_weights(const std::string& dir, LlamaModel& model) {
  const std::string d = normalize_dir(dir, "Hugging Face model");
  std::error_code ec;
  LOWBIT_USER_CHECK(fs::is_directory(d, ec),
                    "'{}' is not a directory; a Hugging Face model directory holds config.json "
                    "and model.safetensors",
                    d);
  const std::string config_path = d + "/" + kCheckpointConfigFile;
  const ModelConfig hc = hf_model_config(d, model.config());
  const std::vector<std::string> diffs =
      config_differences(hc, model.config(), "Hugging Face config", nullptr);
  LOWBIT_USER_CHECK(diffs.empty(),
                    "{}: the model was built with another config: {}; build the model from this "
                    "config.json to load its weights",
                    config_path, join(diffs, "; "));

  // The weight files: one model.safetensors, or the shards of an index.
  std::vector<std::string> shards;
  const std::string single = d + "/model.safetensors";
  const std::string index = d + "/model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    shards.push_back(single);
  } else if (fs::exists(index, ec)) {
    ojson j;
    try {
      j = parse_json_limited<ojson>(read_text_file(index), index);
    } catch (const nlohmann::json::exception& e) {
      throw UserError(fmt::format("{}: not valid JSON ({})", index, e.what()));
    }
    LOWBIT_USER_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                      "{}: no \"weight_map\" object (tensor name → shard file)", index);
    std::set<std::string> names;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      LOWBIT_USER_CHECK(it.value().is_string(), "{}: weight_map entry '{}' is not a file name",
                        index, it.key());
      const std::string f = it.value().get<std::string>();
      LOWBIT_USER_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
                        "{}: weight_map entry '{}' names '{}', which is not a file of this "
                        "directory",
                        index, it.key(), f);
      names.insert(f);
    }
    LOWBIT_USER_CHECK(!names.empty(), "{}: the weight_map is empty", index);
    for (const std::string& f : names) {
      const std::string p = d + "/" + f;
      LOWBIT_USER_CHECK(fs::exists(p, ec), "{}: shard {} is missing (listed in {})", p, f, index);
      shards.push_back(p);
    }
  } else if (fs::exists(d + "/pytorch_model.bin", ec) ||
             fs::exists(d + "/pytorch_model.bin.index.json", ec)) {
    throw UserError(fmt::format(
        "{}: only PyTorch .bin weights found; lowbit reads safetensors: convert them (in Python, "
        "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, "
        "safe_serialization=True))",
        d));
  } else {
    throw UserError(fmt::format("{}: no model.safetensors or model.safetensors.index.json", d));
  }

  // Every header first: each parameter found once, with its shape and a weight dtype.
  ParamArena& arena = model.params();
  const std::vector<ParamInfo>& ps = arena.params();
  std::vector<std::unique_ptr<StReader>> readers;
  std::vector<std::pair<const StReader*, const StEntry*>> source(ps.size(), {nullptr, nullptr});
  std::vector<std::string> extra;
  for (const std::string& path : shards) {
    readers.push_back(std::make_unique<StReader>(path));
    const StReader& r = *readers.back();
    for (const auto& [name, e] : r.tensors()) {
      const int i = arena.find(name);
      if (i < 0) {
        const bool skip = (name.size() >= 20 &&
                           name.compare(name.size() - 20, 20, ".rotary_emb.inv_freq") == 0) ||
                          (name == "lm_head.weight" && model.config().tie_embeddings);
        if (!skip) extra.push_back("'" + name + "'");
        continue;
      }
      LOWBIT_USER_CHECK(source[i].first == nullptr, "{}: tensor '{}' is also in {}", path, name,
                        source[i].first ? source[i].first->path() : "");
      const std::vector<int64_t> want = shape_vec(ps[i].shape);
      LOWBIT_USER_CHECK(e.shape == want,
                        "{}: tensor '{}' has shape {} but the model expects {} (from {})", path,
                        name, shape_str(e.shape), shape_str(want), config_path);
      LOWBIT_USER_CHECK(is_weight_dtype(e.dtype),
                        "{}: tensor '{}' is {}; weights must be F32, BF16 or F16", path, name,
                        e.dtype);
      source[i] = {&r, &e};
    }
  }
  if (!extra.empty()) {
    const size_t n = extra.size();
    if (n > 5) extra.resize(5);
    throw UserError(fmt::format(
        "{}: {} tensor{} that a LLaMA model does not have ({}{}): biases, another architecture "
        "or another layout; only plain LLaMA checkpoints load",
        d, n, n == 1 ? "" : "s", join(extra, ", "), n > 5 ? ", …" : ""));
  }
  std::vector<std::string> missing;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!source[i].first) missing.push_back("'" + ps[i].name + "'");
  }
  if (!missing.empty()) {
    const size_t n = missing.size();
    if (n > 5) missing.resize(5);
    throw UserError(
        fmt::format("{}: {} parameter{} missing ({}{}); the weight files are "
                    "incomplete or belong to another model",
                    d, n, n == 1 ? " is" : "s are", join(missing, ", "), n > 5 ? ", …" : ""));
  }
  SegmentLoader loader;
  for (size_t i = 0; i < ps.size(); ++i) {
    loader.load(*source[i].first, *source[i].second, param_view(arena.master_all, ps[i]));
  }
  fill_bytes(arena.m_all, 0);
  fill_bytes(arena.v_all, 0);
  model.sync_compute_weights();
}

std::string init_weights_from(const std::string& path, LlamaModel& model) {
  const std::string d = normalize_dir(path, "--init-from");
  std::error_code ec;
  LOWBIT_USER_CHECK(fs::exists(d, ec), "--init-from {}: no such directory", d);
  LOWBIT_USER_CHECK(fs::is_directory(d, ec),
                    "--init-from {}: not a directory; give the directory that holds the weights "
                    "(a lowbit checkpoint or a Hugging Face model)",
                    d);
  if (is_checkpoint_dir(d)) {
    const CheckpointState st = load_checkpoint(d, model, /*load_optimizer=*/false);
    std::string out =
        fmt::format("weights of lowbit checkpoint {} (step {}, recipe {})", d, st.step, st.recipe);
    for (const std::string& n : st.notes) out += "; " + n;
    return out;
  }
  LOWBIT_USER_CHECK(fs::exists(d + "/" + kCheckpointConfigFile, ec),
                    "--init-from {}: neither a lowbit checkpoint (trainer.json) nor a Hugging Face "
                    "model directory (config.json with model.safetensors)",
                    d);
  load_hf_weights(d, model);
  return fmt::format("weights of Hugging Face model {}", d);
}

}  // namespace lowbit
