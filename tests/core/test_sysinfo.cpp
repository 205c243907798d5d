// System information: runs on hosts with and without a GPU, so it checks shapes, not values.
#include "lowbit/core/sysinfo.h"

#include <string>

#include <gtest/gtest.h>

#include "lowbit/core/device.h"

namespace lowbit {
namespace {

GpuInfo gpu_sm(int major, int minor) {
  GpuInfo g;
  g.sm_major = major;
  g.sm_minor = minor;
  return g;
}

TEST(SysInfo, CudaVersionString) {
  EXPECT_EQ(cuda_version_str(13000), "13.0");
  EXPECT_EQ(cuda_version_str(12090), "12.9");
  EXPECT_EQ(cuda_version_str(0), "0.0");
}

TEST(SysInfo, KernelsBuiltFor) {
  // Arch-specific cubins run on that SM only.
  EXPECT_TRUE(kernels_built_for(gpu_sm(9, 0), {"90a-real"}));
  EXPECT_FALSE(kernels_built_for(gpu_sm(10, 0), {"90a-real"}));
  EXPECT_FALSE(kernels_built_for(gpu_sm(8, 9), {"90a-real"}));
  EXPECT_TRUE(kernels_built_for(gpu_sm(10, 0), {"90a-real", "100a-real"}));
  EXPECT_FALSE(kernels_built_for(gpu_sm(10, 3), {"100a-real"}));
  // Family cubins run on later minors of the same major.
  EXPECT_TRUE(kernels_built_for(gpu_sm(10, 3), {"100f-real"}));
  EXPECT_FALSE(kernels_built_for(gpu_sm(12, 0), {"100f-real"}));
  // Plain cubins likewise; plain PTX is JIT-compiled for any later GPU.
  EXPECT_TRUE(kernels_built_for(gpu_sm(8, 6), {"80-real"}));
  EXPECT_FALSE(kernels_built_for(gpu_sm(9, 0), {"80-real"}));
  EXPECT_TRUE(kernels_built_for(gpu_sm(9, 0), {"80"}));
  EXPECT_TRUE(kernels_built_for(gpu_sm(12, 0), {"80-virtual"}));
  EXPECT_FALSE(kernels_built_for(gpu_sm(7, 5), {"80"}));
  EXPECT_TRUE(kernels_built_for(gpu_sm(12, 0), {"all"}));
  EXPECT_FALSE(kernels_built_for(gpu_sm(9, 0), {}));
}

TEST(SysInfo, BuildInfoRecorded) {
  const BuildInfo& b = build_info();
  EXPECT_NE(b.version, "unknown");
  EXPECT_FALSE(b.cuda_archs.empty());
  EXPECT_GE(b.cuda_toolkit_code, 12000);
}

// Every listed GPU is described (on a machine without one the list is empty).
TEST(SysInfo, EveryListedGpuIsDescribed) {
  const std::vector<GpuInfo> gpus = list_gpus();
  for (const GpuInfo& g : gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GT(g.total_mem_bytes, 0);
    EXPECT_GT(g.sm_count, 0);
  }
  EXPECT_EQ(gpu_unavailable_reason().empty(), !gpus.empty());
}

TEST(SysInfo, LibrariesReportedOrExplained) {
  const LibraryVersions& lv = library_versions();
  EXPECT_GE(lv.cuda_runtime_code, 12000);
  EXPECT_EQ(lv.cuda_driver_code == 0, lv.cuda_driver == "no driver");

  EXPECT_TRUE(lv.cublaslt.found);
  EXPECT_GE(lv.cublaslt.version_code, 120000);
  EXPECT_NE(lv.cublaslt.path.find("cublasLt"), std::string::npos) << lv.cublaslt.path;

  for (const auto& [lib, stem] :
       {std::pair{&lv.cudnn, "libcudnn.so"}, std::pair{&lv.nccl, "libnccl.so"}}) {
    if (lib->found) {
      EXPECT_FALSE(lib->version.empty());
      EXPECT_GT(lib->version_code, 0);
      EXPECT_NE(lib->path.find(stem), std::string::npos) << lib->path;
    } else {
      EXPECT_NE(lib->detail.find(stem), std::string::npos) << lib->detail;
    }
  }
}

}  // namespace
}  // namespace lowbit
