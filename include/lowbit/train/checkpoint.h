// Checkpoints and Hugging Face interop.
//
// A checkpoint is a directory:
//   model.safetensors      FP32 master weights under their Hugging Face LLaMA names
//                          (metadata format "pt"): transformers loads it with config.json
//   optimizer.safetensors  AdamW moments "<name>.exp_avg", "<name>.exp_avg_sq" (F32), and the
//                          delayed-scaling state of the fp8 recipe, if any:
//                          "fp8.{forward,backward}.{amax_history,scale,scale_inv}"
//   config.json            the Hugging Face LLaMA config (LlamaForCausalLM, torch_dtype float32)
//   trainer.json           step, tokens, data-loader state, RNG, recipe and precision plan, model
//                          and training configs, lowbit version, and the size and CRC-64 of every
//                          other file
// It is written under DIR.tmp-<pid>, every file and the directory fsynced, then renamed onto DIR
// (an existing DIR is first moved to DIR.old-<pid> and removed once the new one is in place), so
// DIR always holds one complete checkpoint. Loading verifies sizes and checksums, tensor names
// and shapes, and the model config, and reports every mismatch as a UserError naming the file
// and what to do. Checkpoints are precision-agnostic: any recipe may resume any checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lowbit/core/dtype.h"
#include "lowbit/model.h"

namespace lowbit {

inline constexpr const char* kCheckpointModelFile = "model.safetensors";
inline constexpr const char* kCheckpointOptimizerFile = "optimizer.safetensors";
inline constexpr const char* kCheckpointConfigFile = "config.json";
inline constexpr const char* kCheckpointTrainerFile = "trainer.json";
// trainer.json "format_version" written by this build; newer versions are refused.
inline constexpr int kCheckpointFormatVersion = 1;

// The training state stored beside the tensors.
struct CheckpointState {
  int64_t step = 0;    // optimizer steps done
  int64_t tokens = 0;  // training tokens seen
  // The data loader's position and the run's options: JSON text, opaque to the checkpoint
  // (empty: none; loading gives back the same JSON, re-serialised).
  std::string data_state_json;
  std::string train_config_json;
  uint64_t rng_seed = 0;
  uint64_t rng_offset = 0;

  // Set by load_checkpoint (save_checkpoint ignores them).
  std::string recipe;          // the recipe the checkpoint was trained with
  std::string lowbit_version;  // of the build that wrote it
  // What did not carry over exactly, one sentence each: another recipe, fp8 scaling state
  // left fresh, another max_seq_len. Empty when the checkpoint matches the model.
  std::vector<std::string> notes;
};

// Writes `model` (master weights, AdamW moments, delayed-scaling state) and `state` as the
// checkpoint directory `dir` (see above). The parent directory is created if needed. An
// existing `dir` must be a lowbit checkpoint (or empty): anything else is refused rather than
// replaced. On failure the previous checkpoint at `dir` is left intact and no temporary
// directory remains. Throws UserError.
void save_checkpoint(const std::string& dir, const LlamaModel& model, const CheckpointState& state);
// What save_checkpoint checks of `dir` before it writes (absent, or a checkpoint directory
// holding nothing else), for a trainer to fail before its run rather than at its first save.
void check_checkpoint_target(const std::string& dir);

// A checkpoint's trainer.json, read and checked once by read_checkpoint(): what a caller needs
// before it builds the model (its config and recipe, the step, the trainer's settings), and the
// recorded sizes and checksums that load_checkpoint() verifies, so that it need not read the
// file again.
struct CheckpointInfo {
  std::string dir;           // the checkpoint directory (without a trailing '/')
  std::string trainer_path;  // dir/trainer.json, for messages
  ModelConfig model_config;
  // step, tokens, data_state_json, train_config_json, RNG, recipe and lowbit_version (no notes).
  CheckpointState state;
  struct Parsed;  // trainer.json as parsed (checkpoint.cpp)
  std::shared_ptr<const Parsed> parsed;
};
// Reads and checks trainer.json of checkpoint `dir` (format, version, step, RNG, recipe, model
// config, file records); UserError naming the file and what to do when it is missing or damaged.
CheckpointInfo read_checkpoint(const std::string& dir);

// Loads the checkpoint `info` describes into `model`, whose config must match the checkpoint's
// (max_seq_len may differ): master weights always; AdamW moments and delayed-scaling state when
// load_optimizer (otherwise the moments are reset to zero and the scaling state is kept). The
// BF16 compute copy is refreshed (model.sync_compute_weights()). Returns the stored state,
// with `notes` on what differs. Every check (sizes, checksums, config, tensor names, shapes and
// dtypes) runs before the model is touched, so a damaged or mismatched checkpoint leaves it as
// it was; tensors are then read one at a time (no second copy of the model in host memory).
CheckpointState load_checkpoint(const CheckpointInfo& info, LlamaModel& model, bool load_optimizer);
// read_checkpoint(dir), then the load above.
CheckpointState load_checkpoint(const std::string& dir, LlamaModel& model, bool load_optimizer);

// Whether `dir` holds a trainer.json (a lowbit checkpoint, as opposed to a Hugging Face model).
bool is_checkpoint_dir(const std::string& dir);

// `--init-from`: weights only (the moments reset to zero, step 0) from a lowbit checkpoint or a
// Hugging Face model directory. Returns a one-line description of what was loaded.
std::string init_weights_from(const std::string& path, LlamaModel& model);

// ---- Hugging Face model directories ---------------------------------------------------------
// The LLaMA config.json text of `cfg` (architectures LlamaForCausalLM, model_type llama, the
// shape fields, rms_norm_eps, rope_theta, rope_scaling for llama3 scaling, tie_word_embeddings),
// with torch_dtype "float32" or "bfloat16".
std::string hf_config_json(const ModelConfig& cfg, DType weight_dtype = DType::kF32);
// The model config of Hugging Face directory `dir` (its config.json), fields absent there taken
// from `base`.
ModelConfig hf_model_config(const std::string& dir, const ModelConfig& base);
// Loads the weights of Hugging Face LLaMA directory `dir` — config.json plus model.safetensors,
// or shards listed in model.safetensors.index.json; F32, BF16 or F16 tensors — into the master
// weights of `model` (whose config must match config.json), resets the moments to zero and
// refreshes the compute copy. Rotary inv_freq buffers and a tied lm_head.weight are skipped.
// Every header is checked before the model is touched.
void load_hf_weights(const std::string& dir, LlamaModel& model);
// Writes `model`'s master weights as a Hugging Face directory (config.json, model.safetensors
// in F32 or BF16), atomically like a checkpoint.
void save_hf_model(const std::string& dir, const LlamaModel& model,
                   DType weight_dtype = DType::kF32);

// ---- checksums --------------------------------------------------------------------------------
// CRC-64/XZ (ECMA-182 polynomial, reflected, init and final xor all ones); `crc` continues a
// previous value (0 to start). crc64("123456789") == 0x995DC9BBDF1939FA.
uint64_t crc64(const void* data, size_t bytes, uint64_t crc = 0);
// CRC-64 of a whole file; throws UserError when it cannot be read.
uint64_t crc64_file(const std::string& path);

// ---- fault injection (tests) ------------------------------------------------------------------
// A function called at each stage of save_checkpoint: "model.safetensors",
// "optimizer.safetensors", "config.json", "trainer.json" (after each file is written), "swap"
// (after an existing checkpoint is moved aside, before the new one is renamed in). Throwing
// from it simulates a failure there. Pass an empty function to remove it.
void set_checkpoint_failure_hook(std::function<void(std::string_view stage)> hook);

}  // namespace lowbit
