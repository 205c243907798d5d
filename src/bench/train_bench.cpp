// `lowbit bench train`: tokens/s, MFU and peak memory of whole optimizer steps per recipe, on
// random tokens (the data pipeline is not timed).
#include "bench/train_bench.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <random>

#include "bench/kernel_trace.h"
#include "data/data_util.h"
#include "lowbit/core/sysinfo.h"
#include "lowbit/train/step.h"

namespace lowbit::bench {

namespace {

double peak_bf16_flops(const std::string& gpu) {
  if (gpu.find("H100") != std::string::npos || gpu.find("H200") != std::string::npos) {
    return gpu.find("PCIe") != std::string::npos ? 756e12 : 989.4e12;
  }
  if (gpu.find("B200") != std::string::npos) return 2250e12;
  return 0;
}

}  // namespace

std::vector<TrainBenchCase> train_bench_cases(const std::string& presets_csv) {
  std::vector<TrainBenchCase> out;
  size_t i = 0;
  while (i <= presets_csv.size()) {
    size_t j = presets_csv.find(',', i);
    if (j == std::string::npos) j = presets_csv.size();
    const std::string p = presets_csv.substr(i, j - i);
    if (p == "124m") {
      out.push_back({"124m", 16, 1024, 32000});
    } else if (p == "350m") {
      out.push_back({"350m", 16, 1024, 32000});
    } else if (p == "1b") {
      out.push_back({"1b", 8, 2048, 128256});
    } else if (p == "tiny") {
      out.push_back({"tiny", 8, 128, 4096});
    } else if (!p.empty()) {
      throw UserError(fmt::format("bench train: unknown preset '{}' (tiny, 124m, 350m, 1b)", p));
    }
    i = j + 1;
  }
  return out;
}

std::vector<TrainBenchRow> run_train_bench(const TrainBenchOptions& opt) {
  std::vector<TrainBenchRow> rows;
  std::string trace_text;  // kernel-trace sections, written once at the end
  Context ctx = Context::create_default();
  LOWBIT_USER_CHECK(opt.kernel_trace_path.empty() || ctx.on_gpu(),
                    "--kernel-trace needs a GPU: there are no kernels to trace on the CPU");
  const std::vector<GpuInfo> gpus = list_gpus();
  const double peak = ctx.on_gpu() && !gpus.empty() ? peak_bf16_flops(gpus[0].name) : 0.0;
  for (const TrainBenchCase& c : opt.cases) {
    double bf16_tok = -1;
    int64_t bf16_mem = -1;
    for (const std::string& rname : opt.recipes) {
      TrainBenchRow row;
      row.preset = c.preset;
      row.recipe = rname;
      row.batch = c.batch;
      row.seq_len = c.seq_len;
      try {
        const Recipe r = recipe_from_name(rname);
        ModelConfig mc = model_preset(c.preset);
        mc.vocab_size = c.vocab;
        mc.max_seq_len = std::max(mc.max_seq_len, c.seq_len);
        ctx.synchronize();
        mem_reset_peaks(ctx.device());
        LlamaModel model(mc, resolve_precision(r, mc), ctx);
        model.init_weights(1);
        StepRunner runner(model, ctx);
        // Random tokens: [B, T] inputs and their next tokens.
        std::mt19937 rng(7);
        Tensor tokens = Tensor::empty({c.batch, c.seq_len}, DType::kI32, Device::cpu());
        Tensor targets = Tensor::empty({c.batch, c.seq_len}, DType::kI32, Device::cpu());
        for (int64_t i = 0; i < tokens.numel(); ++i) {
          tokens.ptr<int32_t>()[i] = static_cast<int32_t>(rng() % uint32_t(c.vocab));
          targets.ptr<int32_t>()[i] = static_cast<int32_t>(rng() % uint32_t(c.vocab));
        }
        Tensor dtok = Tensor::copy_of(tokens, ctx.device(), MemCategory::kActivations);
        Tensor dtgt = Tensor::copy_of(targets, ctx.device(), MemCategory::kActivations);
        const std::vector<MicroBatch> micro{{dtok, dtgt, tokens.numel()}};
        AdamWConfig ac;
        ac.lr = 1e-4f;
        ForwardOptions fo;
        fo.activation_checkpointing = opt.activation_checkpointing;
        fo.recompute_quantized_inputs = !opt.keep_quantized_inputs;
        fo.recompute_quantized_weights = !opt.keep_quantized_weights;
        fo.set_recompute_from_name(opt.recompute_block_outputs);
        for (int s = 0; s < opt.warmup_steps; ++s) {
          ac.step = s + 1;
          const StepOutcome o = runner.step(micro, c.batch, c.seq_len, ac, 1.0f, fo);
          if (s == 0) row.loss_first = o.loss;
        }
        ctx.synchronize();
        std::unique_ptr<KernelTrace> trace;
        if (!opt.kernel_trace_path.empty() && ctx.on_gpu()) trace = KernelTrace::start();
        const auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < opt.steps; ++s) {
          ac.step = opt.warmup_steps + s + 1;
          row.loss_last = runner.step(micro, c.batch, c.seq_len, ac, 1.0f, fo).loss;
        }
        ctx.synchronize();
        const double sec =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (trace) {
          const std::vector<KernelRecord> kernels = trace->stop();
          const KernelSummary ks = summarize_kernels(kernels, trace->api());
          trace.reset();
          // Busy share of the wall time (the host's timer spans what the GPU's does).
          row.gpu_busy = ks.busy_ms / (sec * 1e3);
          trace_text += format_kernel_summary(
              ks, opt.steps,
              fmt::format("{} {} {}x{}: {} timed steps, wall {:.3f} ms per step", c.preset, rname,
                          c.batch, c.seq_len, opt.steps, sec * 1e3 / opt.steps));
          trace_text += "\n";
        }
        row.step_ms = sec * 1e3 / opt.steps;
        row.tokens_per_s = double(c.batch) * c.seq_len * opt.steps / sec;
        if (peak > 0) row.mfu = mc.train_flops_per_token(c.seq_len) * row.tokens_per_s / peak;
        const MemStats ms = mem_stats(ctx.device());
        row.peak_mem_bytes = ms.total.peak_bytes;
        for (int k = 0; k < kNumMemCategories; ++k) {
          row.peak_by_category.emplace_back(
              std::string(mem_category_name(static_cast<MemCategory>(k))),
              ms.by_category[k].peak_bytes);
        }
        if (r == Recipe::kBF16) {
          bf16_tok = row.tokens_per_s;
          bf16_mem = row.peak_mem_bytes;
        }
        if (bf16_tok > 0) row.speed_vs_bf16 = row.tokens_per_s / bf16_tok;
        if (bf16_mem > 0) row.mem_vs_bf16 = double(row.peak_mem_bytes) / double(bf16_mem);
      } catch (const std::exception& e) {
        row.error = e.what();
      }
      rows.push_back(row);
    }
  }
  if (!opt.kernel_trace_path.empty()) {
    data::detail::write_file_atomic(opt.kernel_trace_path, trace_text);
  }
  return rows;
}

}  // namespace lowbit::bench
