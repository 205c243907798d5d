// `lowbit info`: the GPUs, CUDA libraries and build of this machine, and where each recipe runs.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "lowbit/core/sysinfo.h"
#include "lowbit/recipe.h"

namespace lowbit::cli {
namespace {

using Json = nlohmann::ordered_json;  // keys in the order written

struct InfoOptions {
  bool json = false;
};

// What `lowbit info` reports, gathered once and rendered as a table or as JSON.
struct InfoReport {
  BuildInfo build;
  std::vector<GpuInfo> gpus;
  std::vector<bool> kernels_built;  // per GPU
  std::string no_gpu_reason;        // set when gpus is empty
  LibraryVersions libs;
};

InfoReport gather() {
  InfoReport r;
  r.build = build_info();
  r.gpus = list_gpus();
  for (const GpuInfo& g : r.gpus)
    r.kernels_built.push_back(kernels_built_for(g, r.build.cuda_archs));
  if (r.gpus.empty()) r.no_gpu_reason = gpu_unavailable_reason();
  r.libs = library_versions();
  return r;
}

std::string gib(int64_t bytes) {
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
}

std::string sm_str(const GpuInfo& g) { return fmt::format("{}.{}", g.sm_major, g.sm_minor); }

// The CUDA_ARCHS entry that would build kernels for this GPU.
std::string arch_to_add(const GpuInfo& g) {
  return fmt::format("{}{}-real", g.sm(), g.sm() >= 90 ? "a" : "");
}

// A note when the driver is older than the runtime this binary carries (the usual reason a
// present GPU is not seen), else "".
std::string driver_note(const LibraryVersions& lv) {
  if (lv.cuda_driver_code == 0 || lv.cuda_driver_code >= lv.cuda_runtime_code) return "";
  return fmt::format(
      "the driver supports CUDA {} but this binary needs {}: update the NVIDIA driver",
      lv.cuda_driver, lv.cuda_runtime);
}

// --- JSON ----------------------------------------------------------------------------------

Json library_json(const LibraryInfo& l) {
  Json j = {{"found", l.found}};
  if (l.found) {
    j["version"] = l.version;
    j["version_code"] = l.version_code;
    j["path"] = l.path;
  } else {
    j["detail"] = l.detail;
  }
  return j;
}

Json support_json(const RecipeSupport& s) {
  return {{"support", support_level_name(s.level)}, {"reason", s.reason}};
}

Json to_json(const InfoReport& r) {
  Json j;
  j["version"] = r.build.version;
  j["build"] = {{"cuda_toolkit", r.build.cuda_toolkit}, {"cuda_archs", r.build.cuda_archs}};
  j["gpus"] = Json::array();
  for (size_t i = 0; i < r.gpus.size(); ++i) {
    const GpuInfo& g = r.gpus[i];
    j["gpus"].push_back({{"index", g.index},
                         {"name", g.name},
                         {"sm", sm_str(g)},
                         {"total_mem_bytes", g.total_mem_bytes},
                         {"sm_count", g.sm_count},
                         {"kernels_built", static_cast<bool>(r.kernels_built[i])}});
  }
  j["path"] = r.gpus.empty() ? "cpu" : "gpu";
  if (r.gpus.empty()) j["no_gpu_reason"] = r.no_gpu_reason;
  const LibraryVersions& lv = r.libs;
  j["libraries"] = {
      {"cuda_runtime", {{"version", lv.cuda_runtime}, {"version_code", lv.cuda_runtime_code}}},
      {"cuda_driver", {{"version", lv.cuda_driver}, {"version_code", lv.cuda_driver_code}}},
      {"cublaslt", library_json(lv.cublaslt)},
      {"cudnn", library_json(lv.cudnn)},
      {"nccl", library_json(lv.nccl)},
  };
  if (const std::string note = driver_note(lv); !note.empty()) j["driver_note"] = note;
  j["recipes"] = Json::array();
  for (Recipe rc : kAllRecipes) {
    Json jr = {{"name", recipe_name(rc)},
               {"summary", recipe_summary(rc)},
               {"cpu", support_json(recipe_support(rc, nullptr))}};
    jr["gpus"] = Json::array();
    for (const GpuInfo& g : r.gpus) {
      Json jg = support_json(recipe_support(rc, &g, lv.cublaslt.version_code));
      jg["index"] = g.index;
      jr["gpus"].push_back(std::move(jg));
    }
    j["recipes"].push_back(std::move(jr));
  }
  return j;
}

// --- table ---------------------------------------------------------------------------------

void print_library(const char* name, const LibraryInfo& l) {
  if (l.found) {
    fmt::print("  {:<13} {:<10} {}\n", name, l.version, l.path.empty() ? "(path unknown)" : l.path);
  } else {
    fmt::print("  {:<13} {:<10} {}\n", name, "not found", l.detail);
  }
}

void print_recipes(const std::string& title, const GpuInfo* gpu, int64_t cublaslt_version) {
  fmt::print("\nRecipes on {}\n", title);
  for (Recipe rc : kAllRecipes) {
    const RecipeSupport s = recipe_support(rc, gpu, cublaslt_version);
    fmt::print("  {:<12} {:<12} {}\n", recipe_name(rc), support_level_name(s.level), s.reason);
  }
}

void print_table(const InfoReport& r) {
  const std::string archs = fmt::format("{}", fmt::join(r.build.cuda_archs, ";"));
  fmt::print("lowbit {}, built with CUDA {} for {}\n", r.build.version, r.build.cuda_toolkit,
             archs.empty() ? "(no CUDA architectures recorded)" : archs);

  fmt::print("\nGPUs\n");
  if (r.gpus.empty()) {
    fmt::print("  no GPU found ({}): lowbit will take the CPU path\n", r.no_gpu_reason);
  } else {
    size_t name_w = 4;
    for (const GpuInfo& g : r.gpus) name_w = std::max(name_w, g.name.size());
    fmt::print("  {:<3} {:<{}}  {:<5} {:>10} {:>5}  {}\n", "#", "name", name_w, "SM", "memory",
               "SMs", "kernels");
    for (size_t i = 0; i < r.gpus.size(); ++i) {
      const GpuInfo& g = r.gpus[i];
      const std::string kernels =
          r.kernels_built[i]
              ? std::string("built")
              : fmt::format("not built: add {} to CUDA_ARCHS and rebuild", arch_to_add(g));
      fmt::print("  {:<3} {:<{}}  {:<5} {:>10} {:>5}  {}\n", g.index, g.name, name_w, sm_str(g),
                 gib(g.total_mem_bytes), g.sm_count, kernels);
    }
  }

  const LibraryVersions& lv = r.libs;
  fmt::print("\nLibraries\n");
  fmt::print("  {:<13} {:<10} {}\n", "CUDA runtime", lv.cuda_runtime, "linked statically");
  fmt::print("  {:<13} {}\n", "CUDA driver", lv.cuda_driver);
  print_library("cuBLASLt", lv.cublaslt);
  print_library("cuDNN", lv.cudnn);
  print_library("NCCL", lv.nccl);
  if (const std::string note = driver_note(lv); !note.empty()) fmt::print("  note: {}\n", note);

  print_recipes("the CPU", nullptr, 0);
  // GPUs of one model share one answer: print it once per model.
  std::map<std::pair<int, std::string>, std::vector<const GpuInfo*>> models;
  for (const GpuInfo& g : r.gpus) models[{g.sm(), g.name}].push_back(&g);
  for (const auto& [key, gpus] : models) {
    std::vector<int> indices;
    for (const GpuInfo* g : gpus) indices.push_back(g->index);
    const std::string title = fmt::format("GPU{} {} ({}, sm_{})", gpus.size() > 1 ? "s" : "",
                                          fmt::join(indices, ","), key.second, key.first);
    print_recipes(title, gpus.front(), lv.cublaslt.version_code);
  }
}

int run_info(const InfoOptions& opts) {
  const InfoReport report = gather();
  if (opts.json) {
    fmt::print("{}\n", to_json(report).dump(2));
  } else {
    print_table(report);
  }
  return 0;
}

}  // namespace

void add_info_command(CLI::App& app, CommandAction& action) {
  auto opts = std::make_shared<InfoOptions>();
  CLI::App* sub = app.add_subcommand(
      "info",
      "Show GPUs, CUDA libraries, and where each recipe runs (native, emulated, unavailable)");
  sub->add_flag("--json", opts->json, "Print JSON instead of tables");
  sub->callback([&action, opts] { action = [opts] { return run_info(*opts); }; });
}

}  // namespace lowbit::cli
