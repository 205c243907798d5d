// What this machine offers: GPUs, the CUDA libraries lowbit finds at run time, and what this
// binary was built for. Nothing here throws on a machine without a GPU or driver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lowbit {

struct GpuInfo {
  int index = 0;  // CUDA ordinal
  std::string name;
  int sm_major = 0, sm_minor = 0;  // compute capability, e.g. 9.0
  int64_t total_mem_bytes = 0;
  int sm_count = 0;

  int sm() const { return sm_major * 10 + sm_minor; }  // 90 for sm_90
};

// Every usable GPU; empty when there is no GPU or no (recent enough) driver.
std::vector<GpuInfo> list_gpus();

// Why no GPU can be used ("cudaErrorNoDevice: no CUDA-capable device is detected"), or "" when
// the CUDA runtime sees at least one.
std::string gpu_unavailable_reason();

// A library found (or not) at run time.
struct LibraryInfo {
  bool found = false;
  int64_t version_code = 0;  // as the library reports it (cuBLASLt 130100, NCCL 22703, ...)
  std::string version;       // "13.1.0"
  std::string path;          // the file it was loaded from, when known
  std::string detail;        // when not found: the names and paths tried, and the last error
};

struct LibraryVersions {
  int cuda_runtime_code = 0;  // cudaRuntimeGetVersion: 13000 for 13.0
  std::string cuda_runtime;
  int cuda_driver_code = 0;  // cudaDriverGetVersion; 0 when no driver is installed
  std::string cuda_driver;   // "13.0", or "no driver"
  LibraryInfo cublaslt;      // linked; resolved from the host's CUDA at run time
  LibraryInfo cudnn;         // loaded with dlopen, optional
  LibraryInfo nccl;          // loaded with dlopen, optional
};

// Queried once, then cached.
const LibraryVersions& library_versions();

// What this binary was built with.
struct BuildInfo {
  std::string version;                  // lowbit's own, "0.1.0"
  int cuda_toolkit_code = 0;            // CUDART_VERSION at build time
  std::string cuda_toolkit;             // "13.0"
  std::vector<std::string> cuda_archs;  // CMake syntax: "90a-real", "100a-real", ...
};

const BuildInfo& build_info();

// Whether the CUDA kernels of this binary can run on `gpu` (a cubin or PTX for its SM was
// built in); false means rebuild with that architecture added to CUDA_ARCHS.
bool kernels_built_for(const GpuInfo& gpu, const std::vector<std::string>& cuda_archs);

// 13000 -> "13.0", 12090 -> "12.9"; 0 -> "0.0".
std::string cuda_version_str(int code);

}  // namespace lowbit
