// `lowbit bench <what>`: performance measurements on the GPU (never part of the tests).
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "bench/quant_bench.h"
#include "cli/commands.h"
#include "lowbit/core/error.h"
#include "lowbit/core/sysinfo.h"

namespace lowbit::cli {

namespace {

std::vector<std::pair<int64_t, int64_t>> parse_shapes(const std::string& spec) {
  std::vector<std::pair<int64_t, int64_t>> out;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    const size_t x = item.find('x');
    int64_t m = 0, k = 0;
    try {
      LOWBIT_USER_CHECK(x != std::string::npos, "");
      m = std::stoll(item.substr(0, x));
      k = std::stoll(item.substr(x + 1));
    } catch (const std::exception&) {
      throw UserError(fmt::format("--shapes: '{}' is not MxK (e.g. 8192x8192)", item));
    }
    LOWBIT_USER_CHECK(m > 0 && k > 0, "--shapes: '{}' needs positive sizes", item);
    out.emplace_back(m, k);
    pos = end + 1;
  }
  LOWBIT_USER_CHECK(!out.empty(), "--shapes: no shape given");
  return out;
}

}  // namespace

void add_bench_command(CLI::App& app, CommandAction& action) {
  CLI::App* bench = app.add_subcommand("bench", "Measure throughput on the GPU (not a test)");
  bench->require_subcommand(1);

  struct QuantOpts {
    std::string shapes = "8192x8192,16384x768,16384x2048,16384x4096,16384x8192";
    int iters = 20;
    std::string json_out;
  };
  auto q = std::make_shared<QuantOpts>();
  CLI::App* quant = bench->add_subcommand(
      "quant", "GB/s of every quantization recipe against the device's copy bandwidth");
  quant->add_option("--shapes", q->shapes, "Comma-separated MxK source shapes")
      ->capture_default_str();
  quant->add_option("--iters", q->iters, "Timed iterations per measurement (median reported)")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  quant->add_option("--json-out", q->json_out, "Also write one JSON object per row to this file");
  quant->callback([q, &action] {
    action = [q] {
      bench::QuantBenchOptions opt;
      opt.shapes = parse_shapes(q->shapes);
      opt.iters = q->iters;
      const std::vector<GpuInfo> gpus = list_gpus();
      LOWBIT_USER_CHECK(!gpus.empty(), "bench quant needs a CUDA GPU; none was found");
      std::printf("lowbit bench quant on %s\n", gpus[0].name.c_str());
      const auto rows = bench::run_quant_bench(opt);
      if (!q->json_out.empty()) {
        std::ofstream f(q->json_out);
        LOWBIT_USER_CHECK(f.good(), "--json-out: cannot write {}", q->json_out);
        for (const auto& r : rows) {
          nlohmann::json j = {{"impl", "lowbit"}, {"device", gpus[0].name},
                              {"shape", r.shape}, {"recipe", r.recipe},
                              {"ms", r.ms},       {"bytes", r.bytes},
                              {"gbps", r.gbps},   {"frac_of_copy", r.frac_of_copy}};
          f << j.dump() << "\n";
        }
      }
      return 0;
    };
  });
}

}  // namespace lowbit::cli
