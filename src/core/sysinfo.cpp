#include "lowbit/core/sysinfo.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <glob.h>
#include <link.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "lowbit/core/cuda_check.h"
#include "lowbit/core/device.h"

// Set by CMake for this file only (see CMakeLists.txt); defaults keep other builds compiling.
#ifndef LOWBIT_VERSION_STR
#define LOWBIT_VERSION_STR "unknown"
#endif
#ifndef LOWBIT_CUDA_ARCHS_STR
#define LOWBIT_CUDA_ARCHS_STR ""
#endif

namespace lowbit {

std::string cuda_version_str(int code) {
  return fmt::format("{}.{}", code / 1000, (code % 1000) / 10);
}

std::vector<GpuInfo> list_gpus() {
  std::vector<GpuInfo> gpus;
  const int n = cuda_device_count();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    LOWBIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    GpuInfo g;
    g.index = i;
    g.name = prop.name;
    g.sm_major = prop.major;
    g.sm_minor = prop.minor;
    g.total_mem_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    g.sm_count = prop.multiProcessorCount;
    gpus.push_back(std::move(g));
  }
  return gpus;
}

std::string gpu_unavailable_reason() {
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    cudaGetLastError();
    return "no NVIDIA driver is installed";
  }
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err));
  }
  return n > 0 ? std::string() : std::string("the CUDA runtime reports 0 devices");
}

// --- libraries --------------------------------------------------------------------------------

namespace {

// "major.minor.patch" from codes of the form major*10000 + minor*100 + patch.
std::string version_5digit(int64_t v) {
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

// The path of an already loaded shared object whose file name contains `stem`, or "".
std::string loaded_object_path(const char* stem) {
  struct Search {
    const char* stem;
    std::string path;
  } search{stem, {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        if (info->dlpi_name != nullptr && std::strstr(info->dlpi_name, s->stem) != nullptr) {
          s->path = info->dlpi_name;
          return 1;
        }
        return 0;
      },
      &search);
  return search.path;
}

std::string handle_path(void* handle, const std::string& fallback) {
  link_map* lm = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) == 0 && lm != nullptr && lm->l_name != nullptr &&
      lm->l_name[0] != '\0') {
    return lm->l_name;
  }
  return fallback;
}

// Site-packages style directories where pip wheels put CUDA libraries. `subdirs` are relative
// to such a directory (e.g. "nvidia/cudnn/lib"). Globbing a handful of patterns is cheap.
std::vector<std::string> python_lib_dirs(const std::vector<std::string>& subdirs) {
  std::vector<std::string> roots = {
      "/usr/lib/python3*/site-packages",         "/usr/lib/python3*/dist-packages",
      "/usr/local/lib/python3*/site-packages",   "/usr/local/lib/python3*/dist-packages",
      "/opt/*/.venv/lib/python3*/site-packages",
  };
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv != nullptr && venv[0] != '\0') {
    roots.push_back(std::string(venv) + "/lib/python3*/site-packages");
  }
  std::vector<std::string> dirs;
  for (const std::string& root : roots) {
    for (const std::string& sub : subdirs) {
      const std::string pattern = root + "/" + sub;
      glob_t g{};
      if (glob(pattern.c_str(), GLOB_ONLYDIR | GLOB_NOSORT, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) dirs.emplace_back(g.gl_pathv[i]);
      }
      globfree(&g);
    }
  }
  return dirs;
}

struct Loaded {
  void* handle = nullptr;
  std::string path;
};

// Tries bare names first (RUNPATH, LD_LIBRARY_PATH, the loader cache), then each directory.
// On failure `tried` lists what was tried and the last loader error that was not "no such file".
Loaded dlopen_first(const std::vector<std::string>& names, const std::vector<std::string>& dirs,
                    std::string* tried) {
  std::vector<std::string> candidates = names;
  for (const std::string& d : dirs) {
    for (const std::string& n : names) candidates.push_back(d + "/" + n);
  }
  std::string last_error;
  for (const std::string& c : candidates) {
    dlerror();
    if (void* h = dlopen(c.c_str(), RTLD_LAZY | RTLD_LOCAL)) return {h, handle_path(h, c)};
    const char* e = dlerror();
    if (e != nullptr && std::strstr(e, "No such file") == nullptr) last_error = e;
  }
  *tried = "tried " + fmt::format("{}", fmt::join(names, ", "));
  if (!dirs.empty()) *tried += fmt::format(" in the loader path and {}", fmt::join(dirs, ", "));
  if (!last_error.empty()) *tried += "; last error: " + last_error;
  return {};
}

// Whether `path` (after symlinks) is cuDNN 9's libcudnn.so.9.
bool is_cudnn9_shim(const std::string& path) {
  char resolved[PATH_MAX];
  const std::string real = realpath(path.c_str(), resolved) != nullptr ? resolved : path;
  return real.find("libcudnn.so.9") != std::string::npos;
}

LibraryInfo find_cudnn() {
  LibraryInfo info;
  std::vector<std::string> dirs = {"/usr/local/cuda/lib64"};
  for (const std::string& d : python_lib_dirs({"nvidia/cudnn/lib", "nvidia/cu13/lib"})) {
    dirs.push_back(d);
  }
  const Loaded lib = dlopen_first({"libcudnn.so.9", "libcudnn.so"}, dirs, &info.detail);
  if (lib.handle == nullptr) return info;
  info.path = lib.path;
  // cuDNN 9's libcudnn.so.9 is a shim that forwards cudnnGetVersion to libcudnn_graph.so.9 and
  // aborts the process when that cannot be loaded; so ask the graph library beside it directly.
  void* impl = lib.handle;
  const std::string dir = lib.path.substr(0, lib.path.find_last_of('/') + 1);
  if (void* graph = dlopen((dir + "libcudnn_graph.so.9").c_str(), RTLD_LAZY | RTLD_LOCAL)) {
    impl = graph;
  } else if (is_cudnn9_shim(lib.path)) {
    info.detail =
        "found " + lib.path + " but not libcudnn_graph.so.9 beside it (incomplete cuDNN 9)";
    return info;
  }
  using GetVersion = size_t (*)();
  auto get_version = reinterpret_cast<GetVersion>(dlsym(impl, "cudnnGetVersion"));
  if (get_version == nullptr) {
    info.detail = "loaded " + lib.path + " but it has no cudnnGetVersion";
    return info;
  }
  info.found = true;
  info.detail.clear();
  info.version_code = static_cast<int64_t>(get_version());
  // cuDNN 9 encodes major*10000 + minor*100 + patch; cuDNN 8 major*1000 + minor*100 + patch.
  const int64_t v = info.version_code;
  info.version =
      v >= 90000 ? version_5digit(v) : fmt::format("{}.{}.{}", v / 1000, (v / 100) % 10, v % 100);
  return info;
}

LibraryInfo find_nccl() {
  LibraryInfo info;
  std::vector<std::string> dirs = {"/usr/local/cuda/lib64"};
  for (const std::string& d : python_lib_dirs({"nvidia/nccl/lib", "nvidia/cu13/lib"})) {
    dirs.push_back(d);
  }
  const Loaded lib = dlopen_first({"libnccl.so.2", "libnccl.so"}, dirs, &info.detail);
  if (lib.handle == nullptr) return info;
  info.path = lib.path;
  using GetVersion = int (*)(int*);  // ncclResult_t ncclGetVersion(int*), 0 = ncclSuccess
  auto get_version = reinterpret_cast<GetVersion>(dlsym(lib.handle, "ncclGetVersion"));
  int v = 0;
  if (get_version == nullptr || get_version(&v) != 0) {
    info.detail = "loaded " + lib.path + " but ncclGetVersion is missing or failed";
    return info;
  }
  info.found = true;
  info.detail.clear();
  info.version_code = v;
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older major*1000 + minor*100 + patch.
  info.version =
      v >= 20900 ? version_5digit(v) : fmt::format("{}.{}.{}", v / 1000, (v / 100) % 10, v % 100);
  return info;
}

LibraryVersions query_library_versions() {
  LibraryVersions lv;
  if (cudaRuntimeGetVersion(&lv.cuda_runtime_code) != cudaSuccess) {
    cudaGetLastError();
    lv.cuda_runtime_code = 0;
  }
  lv.cuda_runtime = cuda_version_str(lv.cuda_runtime_code);
  if (cudaDriverGetVersion(&lv.cuda_driver_code) != cudaSuccess) {
    cudaGetLastError();
    lv.cuda_driver_code = 0;
  }
  lv.cuda_driver = lv.cuda_driver_code == 0 ? "no driver" : cuda_version_str(lv.cuda_driver_code);

  // cuBLASLt is linked: the loader has already resolved it (from the host's CUDA).
  lv.cublaslt.found = true;
  lv.cublaslt.version_code = static_cast<int64_t>(cublasLtGetVersion());
  lv.cublaslt.version = version_5digit(lv.cublaslt.version_code);
  lv.cublaslt.path = loaded_object_path("libcublasLt.so");

  lv.cudnn = find_cudnn();
  lv.nccl = find_nccl();
  return lv;
}

std::vector<std::string> split_archs(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find_first_of(";, ", start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

const LibraryVersions& library_versions() {
  static const LibraryVersions lv = query_library_versions();
  return lv;
}

const BuildInfo& build_info() {
  static const BuildInfo bi = [] {
    BuildInfo b;
    b.version = LOWBIT_VERSION_STR;
    b.cuda_toolkit_code = CUDART_VERSION;
    b.cuda_toolkit = cuda_version_str(CUDART_VERSION);
    b.cuda_archs = split_archs(LOWBIT_CUDA_ARCHS_STR);
    return b;
  }();
  return bi;
}

bool kernels_built_for(const GpuInfo& gpu, const std::vector<std::string>& cuda_archs) {
  for (const std::string& arch : cuda_archs) {
    // CMake syntax: <N>[a|f][-real|-virtual]; a bare <N> builds both the cubin and the PTX.
    // "all", "all-major" and "native" cover the GPU by construction.
    if (arch == "all" || arch == "all-major" || arch == "native") return true;
    size_t i = 0;
    int n = 0;
    while (i < arch.size() && arch[i] >= '0' && arch[i] <= '9') n = n * 10 + (arch[i++] - '0');
    if (i == 0) continue;
    char variant = 0;  // 'a' (this exact SM), 'f' (this family) or 0
    if (i < arch.size() && (arch[i] == 'a' || arch[i] == 'f')) variant = arch[i++];
    const std::string kind = arch.substr(i);
    const bool real = kind.empty() || kind == "-real";
    const bool ptx = kind.empty() || kind == "-virtual";
    const int sm = gpu.sm();
    const bool exact = sm == n;
    const bool family = gpu.sm_major == n / 10 && gpu.sm_minor >= n % 10;
    if (variant == 'a' && exact) return true;
    if (variant == 'f' && family) return true;
    if (variant == 0 && real && family) return true;
    if (variant == 0 && ptx && sm >= n) return true;  // PTX is JIT-compiled for newer GPUs
  }
  return false;
}

}  // namespace lowbit
