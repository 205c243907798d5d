// Checkpoints on the CPU: bit-exact round trips, the files a user (and transformers) sees, every
// damaged-checkpoint error, atomic replacement under injected failures, and Hugging Face
// directories (single file and sharded).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "lowbit/data/safetensors.h"
#include "lowbit/formats.h"
#include "lowbit/model.h"
#include "lowbit/train/checkpoint.h"
#include "user_error.h"

namespace lowbit {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_config() {
  ModelConfig c = model_preset("tiny");
  c.vocab_size = 64;
  c.n_layers = 2;
  c.ffn_hidden = 256;
  c.max_seq_len = 16;
  return c;
}

// A CPU model of `cfg` under `recipe`, with its context.
struct TestModel {
  Context ctx{Device::cpu()};
  std::unique_ptr<LlamaModel> model;
  explicit TestModel(const ModelConfig& cfg = tiny_config(), Recipe recipe = Recipe::kBF16) {
    model = std::make_unique<LlamaModel>(cfg, resolve_precision(recipe, cfg), ctx);
  }
  ParamArena& arena() { return model->params(); }
};

// Fills master, m and v (and the fp8 state, if any) with distinct random values, including
// subnormals and negative zero, so that a round trip must preserve every bit.
void randomize(LlamaModel& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  ParamArena& a = m.params();
  for (const Tensor* t : {&a.master_all, &a.m_all, &a.v_all}) {
    float* p = t->ptr<float>();
    for (const ParamInfo& info : a.params()) {
      for (int64_t i = 0; i < info.shape.numel(); ++i) p[info.offset + i] = nd(rng);
      p[info.offset] = -0.0f;
      if (info.shape.numel() > 1) p[info.offset + 1] = 1e-40f;
    }
  }
  m.sync_compute_weights();
  for (DelayedScalingState* s : {m.fp8_forward_state(), m.fp8_backward_state()}) {
    if (!s) continue;
    for (const Tensor* t : {&s->amax_history(), &s->scale(), &s->scale_inv()}) {
      for (int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] = std::fabs(nd(rng)) * 100;
    }
  }
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

// The F16 encoding of a float that F16 holds exactly as a normal number (or zero).
uint16_t f16_bits_of_exact(float v) {
  const uint32_t u = f32_bits(v);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7FFFFFFFu) == 0) return sign;
  const int exp = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
  return static_cast<uint16_t>(sign | (exp << 10) | ((u & 0x7FFFFFu) >> 13));
}

using lowbit::test_util::user_error;

#define EXPECT_HAS(msg, part) \
  EXPECT_NE(std::string(msg).find(part), std::string::npos) << "message: " << (msg)

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("lowbit_ckpt_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    set_checkpoint_failure_hook({});
    std::error_code ec;
    fs::permissions(root_, fs::perms::owner_all, ec);
    fs::remove_all(root_, ec);
  }
  std::string path(const std::string& name) const { return (root_ / name).string(); }
  // Names in the test directory other than `keep` (leftover temporaries).
  std::vector<std::string> leftovers(const std::set<std::string>& keep) const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(root_)) {
      const std::string n = e.path().filename().string();
      if (!keep.count(n)) out.push_back(n);
    }
    return out;
  }
  // Rewrites the recorded size and checksum of `file` in trainer.json (a consistent but wrong
  // checkpoint).
  void reseal(const std::string& dir, const std::string& file) {
    const std::string tj = dir + "/trainer.json";
    nlohmann::json t = nlohmann::json::parse(read_file(tj));
    t["files"][file]["bytes"] = fs::file_size(dir + "/" + file);
    t["files"][file]["crc64"] = fmt::format("{:016x}", crc64_file(dir + "/" + file));
    write_file(tj, t.dump(2));
  }

  CheckpointState sample_state() const {
    CheckpointState st;
    st.step = 1234;
    st.tokens = 5678901234;
    st.data_state_json = R"({"shard":3,"offset":18446744073709551615,"order":[2,0,1],"f":0.1})";
    st.train_config_json = R"({"lr":0.001,"batch_size":8})";
    st.rng_seed = 0xFEDCBA9876543210ULL;
    st.rng_offset = 77;
    return st;
  }

  fs::path root_;
};

TEST(Crc64Test, KnownValueAndIncremental) {
  const char* s = "123456789";
  EXPECT_EQ(crc64(s, 9), 0x995DC9BBDF1939FAULL);
  EXPECT_EQ(crc64(nullptr, 0), 0u);
  std::vector<uint8_t> buf(100003);
  std::mt19937 rng(7);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  const uint64_t whole = crc64(buf.data(), buf.size());
  uint64_t parts = 0;
  for (size_t at = 0; at < buf.size(); at += 777) {
    parts = crc64(buf.data() + at, std::min<size_t>(777, buf.size() - at), parts);
  }
  EXPECT_EQ(parts, whole);
  // Against the bit-at-a-time definition.
  uint64_t ref = ~uint64_t(0);
  for (uint8_t b : buf) {
    ref ^= b;
    for (int k = 0; k < 8; ++k) ref = (ref & 1) ? (ref >> 1) ^ 0xC96C5795D7870F42ULL : ref >> 1;
  }
  EXPECT_EQ(~ref, whole);
  buf[5000] ^= 1;
  EXPECT_NE(crc64(buf.data(), buf.size()), whole);
}

// Thread CPU time, so that other processes sharing the cores do not count.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

TEST(Crc64Test, FasterThanOneGigabytePerSecond) {
  std::vector<uint8_t> buf(16u << 20);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  uint64_t c = crc64(buf.data(), 1 << 20);  // tables built, caches warm
  double best = 0;
  for (int k = 0; k < 3; ++k) {
    const double t0 = thread_seconds();
    c = crc64(buf.data(), buf.size(), c);
    best = std::max(best, buf.size() / std::max(thread_seconds() - t0, 1e-9) / 1e9);
  }
  RecordProperty("crc64_GBps", std::to_string(best));
  std::printf("crc64: %.2f GB/s (%016llx)\n", best, static_cast<unsigned long long>(c));
#ifdef NDEBUG
  EXPECT_GT(best, 1.0);
#endif
}

TEST_F(CheckpointTest, RoundTripIsBitExact) {
  TestModel a(tiny_config(), Recipe::kFP8);
  randomize(*a.model, 1);
  const std::string dir = path("ckpt");
  save_checkpoint(dir, *a.model, sample_state());
  EXPECT_TRUE(is_checkpoint_dir(dir));
  EXPECT_EQ(read_checkpoint(dir).state.recipe, "fp8");

  TestModel b(tiny_config(), Recipe::kFP8);
  const CheckpointState st = load_checkpoint(dir, *b.model, /*load_optimizer=*/true);
  EXPECT_TRUE(same_bytes(a.arena().master_all, b.arena().master_all));
  EXPECT_TRUE(same_bytes(a.arena().m_all, b.arena().m_all));
  EXPECT_TRUE(same_bytes(a.arena().v_all, b.arena().v_all));
  EXPECT_TRUE(same_bytes(a.arena().compute_all, b.arena().compute_all));  // refreshed
  for (auto [sa, sb] : {std::pair{a.model->fp8_forward_state(), b.model->fp8_forward_state()},
                        std::pair{a.model->fp8_backward_state(), b.model->fp8_backward_state()}}) {
    ASSERT_NE(sa, nullptr);
    EXPECT_TRUE(same_bytes(sa->amax_history(), sb->amax_history()));
    EXPECT_TRUE(same_bytes(sa->scale(), sb->scale()));
    EXPECT_TRUE(same_bytes(sa->scale_inv(), sb->scale_inv()));
  }
  const CheckpointState want = sample_state();
  EXPECT_EQ(st.step, want.step);
  EXPECT_EQ(st.tokens, want.tokens);
  EXPECT_EQ(nlohmann::json::parse(st.data_state_json), nlohmann::json::parse(want.data_state_json));
  EXPECT_EQ(nlohmann::json::parse(st.train_config_json),
            nlohmann::json::parse(want.train_config_json));
  EXPECT_EQ(st.rng_seed, want.rng_seed);
  EXPECT_EQ(st.rng_offset, want.rng_offset);
  EXPECT_EQ(st.recipe, "fp8");
  EXPECT_FALSE(st.lowbit_version.empty());
  EXPECT_TRUE(st.notes.empty()) << st.notes[0];
  EXPECT_TRUE(leftovers({"ckpt"}).empty());
}

TEST_F(CheckpointTest, FilesAreWhatUsersAndTransformersRead) {
  TestModel a;
  randomize(*a.model, 2);
  const std::string dir = path("ckpt");
  CheckpointState st = sample_state();
  st.data_state_json.clear();  // none
  save_checkpoint(dir, *a.model, st);

  // model.safetensors: every parameter under its HF name, F32, metadata format "pt".
  const data::SafeTensorsFile mf = data::read_safetensors(dir + "/model.safetensors");
  EXPECT_EQ(mf.metadata.at("format"), "pt");
  const ParamArena& arena = a.arena();
  EXPECT_EQ(mf.tensors.size(), arena.params().size());
  EXPECT_EQ(mf.tensors.count("lm_head.weight"), 0u);  // tied
  for (const ParamInfo& p : arena.params()) {
    const data::SafeTensor& t = mf.tensors.at(p.name);
    EXPECT_EQ(t.dtype, "F32");
    ASSERT_EQ(static_cast<int64_t>(t.data.size()), p.shape.numel() * 4);
    EXPECT_EQ(std::memcmp(t.data.data(), arena.master_all.ptr<float>() + p.offset, t.data.size()),
              0)
        << p.name;
  }
  EXPECT_EQ(mf.tensors.at("model.layers.1.self_attn.k_proj.weight").shape,
            (std::vector<int64_t>{64, 128}));
  // optimizer.safetensors: both moments per parameter; no fp8 state under bf16.
  const data::SafeTensorsFile of = data::read_safetensors(dir + "/optimizer.safetensors");
  EXPECT_EQ(of.tensors.size(), 2 * arena.params().size());
  EXPECT_EQ(of.tensors.count("model.norm.weight.exp_avg_sq"), 1u);

  // config.json: a Hugging Face LLaMA config.
  const nlohmann::json c = nlohmann::json::parse(read_file(dir + "/config.json"));
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["model_type"], "llama");
  EXPECT_EQ(c["hidden_size"], 128);
  EXPECT_EQ(c["intermediate_size"], 256);
  EXPECT_EQ(c["num_attention_heads"], 2);
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["vocab_size"], 64);
  EXPECT_EQ(c["max_position_embeddings"], 16);
  EXPECT_EQ(c["rope_theta"], 10000.0);
  EXPECT_TRUE(c["rope_scaling"].is_null());
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["torch_dtype"], "float32");
  EXPECT_EQ(c["hidden_act"], "silu");
  EXPECT_NE(read_file(dir + "/config.json").find("\"rms_norm_eps\": 1e-05"), std::string::npos);
  // ... which reads back as the same model.
  ModelConfig back = hf_model_config(dir, ModelConfig{});
  back.preset = a.model->config().preset;
  EXPECT_EQ(back.to_json(), a.model->config().to_json());

  // trainer.json: the state, the plan, and the size and CRC-64 of every other file.
  const nlohmann::json t = nlohmann::json::parse(read_file(dir + "/trainer.json"));
  EXPECT_EQ(t["format"], "lowbit-checkpoint");
  EXPECT_EQ(t["step"], 1234);
  EXPECT_EQ(t["tokens"], 5678901234);
  EXPECT_EQ(t["rng"]["seed"], 0xFEDCBA9876543210ULL);
  EXPECT_EQ(t["recipe"], "bf16");
  EXPECT_EQ(t["precision_plan"]["recipe"], "bf16");
  EXPECT_EQ(t["model_config"]["d_model"], 128);
  EXPECT_EQ(t["train_config"]["batch_size"], 8);
  EXPECT_TRUE(t["data_state"].is_null());
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json"}) {
    const std::string p = dir + "/" + f;
    EXPECT_EQ(t["files"][f]["bytes"], fs::file_size(p)) << f;
    EXPECT_EQ(t["files"][f]["crc64"], fmt::format("{:016x}", crc64_file(p))) << f;
  }
  TestModel b;
  EXPECT_TRUE(load_checkpoint(dir, *b.model, true).data_state_json.empty());
}

TEST_F(CheckpointTest, HfConfigWritesLlama3RopeScaling) {
  ModelConfig c = tiny_config();
  c.rope.theta = 500000.0f;
  c.rope.factor = 8.0f;
  c.rope.low_freq_factor = 1.0f;
  c.rope.high_freq_factor = 4.0f;
  c.rope.original_max_positions = 8192;
  c.tie_embeddings = false;
  const std::string text = hf_config_json(c, DType::kBF16);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(j["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(j["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["tie_word_embeddings"], false);
  ModelConfig back = model_config_from_json(text, ModelConfig{}, "config.json");
  back.preset = c.preset;
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_THROW(hf_config_json(c, DType::kE4M3), UserError);
}

TEST_F(CheckpointTest, DamagedFilesAreClearErrors) {
  TestModel a;
  randomize(*a.model, 3);
  const std::string dir = path("ckpt");
  save_checkpoint(dir, *a.model, sample_state());
  const std::string good = path("good");
  fs::copy(dir, good);
  auto restore = [&] {
    fs::remove_all(dir);
    fs::copy(good, dir);
  };
  TestModel b;
  randomize(*b.model, 4);
  const Tensor before = Tensor::copy_of(b.arena().master_all, Device::cpu());

  // Truncated.
  fs::resize_file(dir + "/model.safetensors", fs::file_size(dir + "/model.safetensors") - 10);
  std::string msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "model.safetensors");
  EXPECT_HAS(msg, "truncated");
  restore();

  // One flipped bit.
  {
    std::fstream f(dir + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4000);
    char c = 0;
    f.read(&c, 1);
    f.seekp(4000);
    c ^= 0x10;
    f.write(&c, 1);
  }
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "optimizer.safetensors");
  EXPECT_HAS(msg, "checksum mismatch");
  // Weights only do not read the optimizer file.
  EXPECT_NO_THROW(load_checkpoint(dir, *b.model, false));
  restore();
  copy_tensor(b.arena().master_all, before);

  // A NUL byte inside the header, consistent checksums (the JSON parser would stop there and
  // read no further).
  {
    std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header_len = 0;
    f.read(reinterpret_cast<char*>(&header_len), 8);
    f.seekp(static_cast<std::streamoff>(8 + header_len - 1));
    f.put('\0');
  }
  reseal(dir, "model.safetensors");
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "model.safetensors");
  EXPECT_HAS(msg, "NUL byte");
  restore();

  // Missing file.
  fs::remove(dir + "/optimizer.safetensors");
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "optimizer.safetensors");
  EXPECT_HAS(msg, "missing");
  restore();

  // Missing tensor, consistent checksums.
  {
    data::SafeTensorsFile f = data::read_safetensors(dir + "/model.safetensors");
    f.tensors.erase("model.layers.1.mlp.up_proj.weight");
    data::write_safetensors(dir + "/model.safetensors", f);
    reseal(dir, "model.safetensors");
  }
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "model.layers.1.mlp.up_proj.weight");
  EXPECT_HAS(msg, "missing");
  restore();

  // Shape mismatch.
  {
    data::SafeTensorsFile f = data::read_safetensors(dir + "/optimizer.safetensors");
    data::SafeTensor& t = f.tensors.at("model.norm.weight.exp_avg");
    t.shape = {64, 2};
    data::write_safetensors(dir + "/optimizer.safetensors", f);
    reseal(dir, "optimizer.safetensors");
  }
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "model.norm.weight.exp_avg");
  EXPECT_HAS(msg, "[64, 2]");
  EXPECT_HAS(msg, "[128]");
  restore();

  // An extra tensor.
  {
    data::SafeTensorsFile f = data::read_safetensors(dir + "/model.safetensors");
    f.tensors["model.layers.2.input_layernorm.weight"] = f.tensors.at("model.norm.weight");
    data::write_safetensors(dir + "/model.safetensors", f);
    reseal(dir, "model.safetensors");
  }
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "model.layers.2.input_layernorm.weight");
  restore();

  // trainer.json damaged or missing.
  write_file(dir + "/trainer.json", "{\"format\": \"lowbit-checkpoint\", ");
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "trainer.json");
  EXPECT_HAS(msg, "not valid JSON");
  fs::remove(dir + "/trainer.json");
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "--init-from");  // config.json is there: looks like a Hugging Face model
  fs::create_directory(dir + "/trainer.json");
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "not a regular file");
  fs::remove(dir + "/trainer.json");
  restore();
  {
    nlohmann::json t = nlohmann::json::parse(read_file(dir + "/trainer.json"));
    t["format_version"] = 99;
    write_file(dir + "/trainer.json", t.dump());
  }
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "newer lowbit");
  restore();
  // Fields of the wrong type or value get the reader's messages (not JSON type errors).
  for (const auto& [key, value, want] :
       {std::tuple<const char*, nlohmann::json, const char*>{"format", 5,
                                                             "not a lowbit checkpoint"},
        {"format_version", "1", "\"format_version\" is missing or not a positive integer"},
        {"recipe", "bogus", "names no recipe of this build"},
        {"recipe", 7, "\"recipe\" is missing or not a string"}}) {
    SCOPED_TRACE(key);
    nlohmann::json t = nlohmann::json::parse(read_file(dir + "/trainer.json"));
    t[key] = value;
    write_file(dir + "/trainer.json", t.dump());
    msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
    EXPECT_HAS(msg, want);
    EXPECT_EQ(msg.find("json.exception"), std::string::npos) << msg;
    restore();
  }

  // Missing directory, with and without what an interrupted save leaves.
  msg = user_error([&] { load_checkpoint(path("nope"), *b.model, true); });
  EXPECT_HAS(msg, "does not exist");
  fs::rename(dir, dir + ".old-12345");
  msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "ckpt.old-12345");
  fs::rename(dir + ".old-12345", dir);

  // The failed loads left the model as it was.
  EXPECT_TRUE(same_bytes(b.arena().master_all, before));
  // And the intact checkpoint loads.
  EXPECT_NO_THROW(load_checkpoint(dir, *b.model, true));
  EXPECT_TRUE(same_bytes(b.arena().master_all, a.arena().master_all));
}

TEST_F(CheckpointTest, OtherModelConfigIsRefused) {
  TestModel a;
  randomize(*a.model, 5);
  const std::string dir = path("ckpt");
  save_checkpoint(dir, *a.model, sample_state());
  ModelConfig c = tiny_config();
  c.n_layers = 3;
  c.ffn_hidden = 384;
  TestModel b(c);
  const std::string msg = user_error([&] { load_checkpoint(dir, *b.model, true); });
  EXPECT_HAS(msg, "n_layers 2 in the checkpoint, 3 in the model");
  EXPECT_HAS(msg, "ffn_hidden");
  EXPECT_HAS(msg, "config.json");
  EXPECT_EQ(read_checkpoint(dir).model_config.to_json(), a.model->config().to_json());

  // A longer context loads, with a note.
  c = tiny_config();
  c.max_seq_len = 32;
  TestModel l(c);
  const CheckpointState st = load_checkpoint(dir, *l.model, true);
  ASSERT_EQ(st.notes.size(), 1u);
  EXPECT_HAS(st.notes[0], "max_seq_len");
}

TEST_F(CheckpointTest, AnotherRecipeResumesWithNotes) {
  TestModel a(tiny_config(), Recipe::kBF16);
  randomize(*a.model, 6);
  const std::string dir = path("ckpt");
  save_checkpoint(dir, *a.model, sample_state());
  TestModel b(tiny_config(), Recipe::kFP8);
  const CheckpointState st = load_checkpoint(dir, *b.model, true);
  EXPECT_EQ(st.recipe, "bf16");
  ASSERT_GE(st.notes.size(), 2u);
  EXPECT_HAS(st.notes[0], "recipe bf16");
  EXPECT_HAS(st.notes[1], "fp8 forward scaling state");
  EXPECT_TRUE(same_bytes(a.arena().master_all, b.arena().master_all));
  EXPECT_TRUE(same_bytes(a.arena().v_all, b.arena().v_all));

  // And back: an fp8 checkpoint into a bf16 model ignores the scaling state.
  randomize(*b.model, 7);
  save_checkpoint(dir, *b.model, sample_state());
  const CheckpointState st2 = load_checkpoint(dir, *a.model, true);
  EXPECT_EQ(st2.recipe, "fp8");
  EXPECT_TRUE(same_bytes(a.arena().m_all, b.arena().m_all));
}

TEST_F(CheckpointTest, FailedSaveKeepsThePreviousCheckpoint) {
  TestModel a;
  randomize(*a.model, 8);
  const std::string dir = path("ckpt");
  CheckpointState st = sample_state();
  st.step = 1;
  save_checkpoint(dir, *a.model, st);
  const Tensor first = Tensor::copy_of(a.arena().master_all, Device::cpu());

  randomize(*a.model, 9);
  st.step = 2;
  for (const char* stage :
       {"model.safetensors", "optimizer.safetensors", "config.json", "trainer.json", "swap"}) {
    set_checkpoint_failure_hook([&](std::string_view s) {
      if (s == stage) throw std::runtime_error(fmt::format("injected failure at {}", s));
    });
    const std::string msg = user_error([&] { save_checkpoint(dir, *a.model, st); });
    EXPECT_HAS(msg, "injected failure");
    EXPECT_HAS(msg, "previous one there is unchanged");
    set_checkpoint_failure_hook({});
    EXPECT_EQ(leftovers({"ckpt"}), std::vector<std::string>{}) << stage;
    TestModel b;
    EXPECT_EQ(load_checkpoint(dir, *b.model, true).step, 1) << stage;
    EXPECT_TRUE(same_bytes(b.arena().master_all, first)) << stage;
  }
  // A failure of a fresh save leaves nothing behind.
  set_checkpoint_failure_hook([](std::string_view s) {
    if (s == "trainer.json") throw std::runtime_error("injected");
  });
  const std::string msg = user_error([&] { save_checkpoint(path("fresh"), *a.model, st); });
  EXPECT_HAS(msg, "nothing was written");
  set_checkpoint_failure_hook({});
  EXPECT_EQ(leftovers({"ckpt"}), std::vector<std::string>{});

  // Without failures the new checkpoint replaces the old one and no temporary remains.
  save_checkpoint(dir + "/", *a.model, st);
  EXPECT_EQ(leftovers({"ckpt"}), std::vector<std::string>{});
  TestModel b;
  EXPECT_EQ(load_checkpoint(dir, *b.model, true).step, 2);
  EXPECT_TRUE(same_bytes(b.arena().master_all, a.arena().master_all));
}

// A parent that cannot hold a directory (a regular file stands in its place: this fails for
// every user, root included) gives a clear error and leaves nothing behind; an existing
// checkpoint elsewhere is untouched. (Failures after the temporary directory exists are covered
// by the failure hook at every stage.)
TEST_F(CheckpointTest, UncreatableParentFailsCleanly) {
  TestModel a;
  randomize(*a.model, 10);
  const std::string dir = path("ckpt");
  save_checkpoint(dir, *a.model, sample_state());
  write_file(path("blocker"), "not a directory");
  const std::string msg =
      user_error([&] { save_checkpoint(path("blocker") + "/ckpt", *a.model, sample_state()); });
  EXPECT_HAS(msg, "blocker");
  EXPECT_EQ(read_file(path("blocker")), "not a directory");
  EXPECT_EQ(leftovers({"ckpt", "blocker"}), std::vector<std::string>{});
  TestModel b;
  EXPECT_NO_THROW(load_checkpoint(dir, *b.model, true));
}

TEST_F(CheckpointTest, RefusesToReplaceOtherDirectories) {
  TestModel a;
  const std::string dir = path("results");
  fs::create_directories(dir);
  write_file(dir + "/notes.txt", "mine");
  const std::string msg = user_error([&] { save_checkpoint(dir, *a.model, sample_state()); });
  EXPECT_HAS(msg, "notes.txt");
  EXPECT_EQ(read_file(dir + "/notes.txt"), "mine");
  write_file(path("file"), "x");
  EXPECT_THROW(save_checkpoint(path("file"), *a.model, sample_state()), UserError);
  CheckpointState bad = sample_state();
  bad.data_state_json = "{not json";
  EXPECT_HAS(user_error([&] { save_checkpoint(path("c"), *a.model, bad); }), "data loader state");
}

TEST_F(CheckpointTest, InitFromCheckpointIsWeightsOnly) {
  TestModel a;
  randomize(*a.model, 11);
  const std::string dir = path("ckpt");
  save_checkpoint(dir, *a.model, sample_state());
  TestModel b;
  randomize(*b.model, 12);
  const std::string what = init_weights_from(dir, *b.model);
  EXPECT_HAS(what, "step 1234");
  EXPECT_TRUE(same_bytes(a.arena().master_all, b.arena().master_all));
  EXPECT_TRUE(same_bytes(a.arena().compute_all, b.arena().compute_all));
  const Tensor zeros = Tensor::zeros({b.arena().size()}, DType::kF32, Device::cpu());
  EXPECT_TRUE(same_bytes(b.arena().m_all, zeros));
  EXPECT_TRUE(same_bytes(b.arena().v_all, zeros));
  EXPECT_HAS(user_error([&] { init_weights_from(path("none"), *b.model); }), "no such directory");
  fs::create_directories(path("empty"));
  EXPECT_HAS(user_error([&] { init_weights_from(path("empty"), *b.model); }), "neither");
}

// ---- Hugging Face directories ---------------------------------------------------------------

TEST_F(CheckpointTest, HfExportLoadsBack) {
  TestModel a;
  randomize(*a.model, 13);
  const std::string dir = path("hf");
  save_hf_model(dir, *a.model, DType::kBF16);
  EXPECT_EQ(nlohmann::json::parse(read_file(dir + "/config.json"))["torch_dtype"], "bfloat16");
  TestModel b;
  randomize(*b.model, 14);
  EXPECT_HAS(init_weights_from(dir, *b.model), "Hugging Face");
  // The master weights are the bf16-rounded ones, and so is the compute copy.
  const ParamArena& pa = a.arena();
  for (const ParamInfo& p : pa.params()) {
    for (int64_t i = 0; i < p.shape.numel(); ++i) {
      const float want = bf16_to_f32(f32_to_bf16_rn(pa.master_all.ptr<float>()[p.offset + i]));
      ASSERT_EQ(f32_bits(b.arena().master_all.ptr<float>()[p.offset + i]), f32_bits(want))
          << p.name << "[" << i << "]";
    }
  }
  EXPECT_TRUE(same_bytes(a.arena().compute_all, b.arena().compute_all));

  // F32 export is exact.
  save_hf_model(dir, *a.model, DType::kF32);
  load_hf_weights(dir, *b.model);
  EXPECT_TRUE(same_bytes(a.arena().master_all, b.arena().master_all));

  // The checkpoint reader holds a safetensors file to the format: bytes after the last tensor
  // (here four appended) are damage, not ignored.
  {
    std::ofstream f(dir + "/model.safetensors", std::ios::binary | std::ios::app);
    f.write("abcd", 4);
  }
  EXPECT_HAS(user_error([&] { load_hf_weights(dir, *b.model); }), "after the last tensor");
}

TEST_F(CheckpointTest, HfShardedDirectoryLoads) {
  TestModel a;
  randomize(*a.model, 15);
  const std::string dir = path("hf");
  fs::create_directories(dir);
  write_file(dir + "/config.json", hf_config_json(a.model->config(), DType::kBF16));
  // Two shards: BF16 and F16 (values exactly representable in both), plus the extras HF
  // checkpoints carry.
  const ParamArena& pa = a.arena();
  float* master = pa.master_all.ptr<float>();
  data::SafeTensorsFile s1, s2;
  nlohmann::json wm;
  int k = 0;
  for (const ParamInfo& p : pa.params()) {
    data::SafeTensor t;
    t.shape.assign(p.shape.d, p.shape.d + p.shape.ndim);
    const bool first = k++ % 2 == 0;
    t.dtype = first ? "BF16" : "F16";
    for (int64_t i = 0; i < p.shape.numel(); ++i) {
      // Multiples of 2^-7 in [-0.5, 0.5] are exact in both formats; F16 tensors also start
      // with the smallest subnormal and -0.
      float v = static_cast<float>((i * 37 + k * 11) % 128 - 64) / 128.0f;
      uint16_t h = first ? f32_to_bf16_rn(v) : f16_bits_of_exact(v);
      if (!first && i == 0) {
        v = std::ldexp(1.0f, -24);
        h = 0x0001;
      } else if (!first && i == 1) {
        v = -0.0f;
        h = 0x8000;
      }
      master[p.offset + i] = v;
      t.data.push_back(static_cast<uint8_t>(h & 0xFF));
      t.data.push_back(static_cast<uint8_t>(h >> 8));
    }
    (first ? s1 : s2).tensors[p.name] = t;
    wm[p.name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  data::SafeTensor inv;
  inv.dtype = "F32";
  inv.shape = {32};
  inv.data.assign(128, 0);
  s1.tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = inv;
  s2.tensors["lm_head.weight"] = s1.tensors.count("model.embed_tokens.weight")
                                     ? s1.tensors["model.embed_tokens.weight"]
                                     : s2.tensors["model.embed_tokens.weight"];
  data::write_safetensors(dir + "/model-00001-of-00002.safetensors", s1);
  data::write_safetensors(dir + "/model-00002-of-00002.safetensors", s2);
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", wm}};
  write_file(dir + "/model.safetensors.index.json", index.dump());

  TestModel b;
  load_hf_weights(dir, *b.model);
  EXPECT_TRUE(same_bytes(a.arena().master_all, b.arena().master_all));

  // An unknown tensor (a bias) is refused with its name.
  s2.tensors["model.layers.0.self_attn.q_proj.bias"] = inv;
  data::write_safetensors(dir + "/model-00002-of-00002.safetensors", s2);
  std::string msg = user_error([&] { load_hf_weights(dir, *b.model); });
  EXPECT_HAS(msg, "q_proj.bias");
  // A missing shard.
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  msg = user_error([&] { load_hf_weights(dir, *b.model); });
  EXPECT_HAS(msg, "model-00002-of-00002.safetensors");
  EXPECT_HAS(msg, "missing");
  // Another model shape.
  ModelConfig c = tiny_config();
  c.d_model = 256;
  c.n_heads = 4;
  write_file(dir + "/config.json", hf_config_json(c));
  msg = user_error([&] { load_hf_weights(dir, *b.model); });
  EXPECT_HAS(msg, "d_model 256 in the Hugging Face config, 128 in the model");
  // A truncated single file.
  fs::remove(dir + "/model.safetensors.index.json");
  write_file(dir + "/config.json", hf_config_json(a.model->config()));
  save_hf_model(path("hf1"), *a.model, DType::kF32);
  fs::resize_file(path("hf1") + "/model.safetensors",
                  fs::file_size(path("hf1") + "/model.safetensors") / 2);
  msg = user_error([&] { load_hf_weights(path("hf1"), *b.model); });
  EXPECT_HAS(msg, "model.safetensors");
  EXPECT_HAS(msg, "truncated");
  EXPECT_TRUE(same_bytes(a.arena().master_all, b.arena().master_all));  // untouched
  // No weights at all.
  write_file(dir + "/pytorch_model.bin", "x");
  EXPECT_HAS(user_error([&] { load_hf_weights(dir, *b.model); }), "safe_serialization");
}

}  // namespace
}  // namespace lowbit
