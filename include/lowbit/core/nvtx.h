// NVTX ranges: named spans on the CPU and GPU timeline of Nsight Systems, so a profile of a
// training step reads like the model (step › forward › block 3 › attention …). NVTX v3 is
// header-only; without a profiler attached each range costs a few nanoseconds.
#pragma once

#include <nvtx3/nvToolsExt.h>

#include <string>

namespace lowbit {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  explicit NvtxRange(const std::string& name) { nvtxRangePushA(name.c_str()); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace lowbit
