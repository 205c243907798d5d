// KernelTrace: CUPTI's activity API loaded with dlopen (see kernel_trace.h).
#include "bench/kernel_trace.h"

#include <cupti_activity.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <type_traits>

#include "lowbit/core/error.h"

namespace lowbit::bench {

namespace {

// The few CUPTI entry points used, resolved from the library found at run time.
struct Cupti {
  void* lib = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                    CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
  CUptiResult (*callback_name)(CUpti_CallbackDomain, uint32_t, const char**) = nullptr;
};

Cupti& cupti() {
  static Cupti c = [] {
    Cupti r;
    for (const char* name :
         {"libcupti.so.13", "libcupti.so", "/usr/local/cuda/lib64/libcupti.so.13",
          "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13"}) {
      r.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (r.lib != nullptr) break;
    }
    if (r.lib == nullptr) return r;
    auto sym = [&](auto& fn, const char* s) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(r.lib, s));
    };
    sym(r.register_callbacks, "cuptiActivityRegisterCallbacks");
    sym(r.enable, "cuptiActivityEnable");
    sym(r.disable, "cuptiActivityDisable");
    sym(r.flush_all, "cuptiActivityFlushAll");
    sym(r.next_record, "cuptiActivityGetNextRecord");
    sym(r.result_string, "cuptiGetResultString");
    sym(r.callback_name, "cuptiGetCallbackName");
    return r;
  }();
  return c;
}

std::string result_text(CUptiResult e) {
  const char* s = nullptr;
  if (cupti().result_string != nullptr) cupti().result_string(e, &s);
  return s != nullptr ? s : "CUPTI error " + std::to_string(int(e));
}

void check(CUptiResult e, const char* what) {
  if (e != CUPTI_SUCCESS) {
    throw UserError(fmt::format("kernel trace: {} failed: {}", what, result_text(e)));
  }
}

// Records land here from CUPTI's buffer callbacks (which may run on a CUPTI thread).
struct Sink {
  std::mutex mu;
  std::vector<KernelRecord> records;
  std::vector<ApiRecord> api;
  std::map<std::string, std::string> demangled;  // mangled → readable
  std::map<uint32_t, std::string> api_names;     // runtime callback id → name
};

Sink& sink() {
  static Sink s;
  return s;
}

constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // Activity buffers must be 8-byte aligned.
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

std::string readable(Sink& s, const char* mangled) {
  if (mangled == nullptr) return "?";
  auto it = s.demangled.find(mangled);
  if (it != s.demangled.end()) return it->second;
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  s.demangled.emplace(mangled, name);
  return name;
}

// "cudaMemcpy" for the runtime callback id (CUPTI's name without its "_v3020"-style suffix).
std::string api_name(Sink& s, uint32_t cbid) {
  auto it = s.api_names.find(cbid);
  if (it != s.api_names.end()) return it->second;
  const char* n = nullptr;
  if (cupti().callback_name != nullptr) {
    cupti().callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &n);
  }
  std::string name = n != nullptr ? n : "runtime call " + std::to_string(cbid);
  const size_t v = name.rfind("_v");
  if (v != std::string::npos && v + 2 < name.size() &&
      name.find_first_not_of("0123456789", v + 2) == std::string::npos) {
    name.resize(v);
  }
  s.api_names.emplace(cbid, name);
  return name;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Sink& s = sink();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    CUpti_Activity* rec = nullptr;
    while (cupti().next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        s.api.push_back({api_name(s, a->cbid), a->start, a->end});
        continue;
      }
      if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
          rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
        continue;
      }
      // start, end and name sit at the same offsets in every CUpti_ActivityKernel version.
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      s.records.push_back({readable(s, k->name), k->start, k->end});
    }
  }
  std::free(buffer);
}

bool g_active = false;

}  // namespace

std::unique_ptr<KernelTrace> KernelTrace::start() {
  Cupti& c = cupti();
  LOWBIT_USER_CHECK(
      c.lib != nullptr,
      "kernel trace: CUPTI (libcupti.so.13) was not found; install the CUDA toolkit's "
      "CUPTI or put its directory on LD_LIBRARY_PATH");
  LOWBIT_USER_CHECK(c.register_callbacks && c.enable && c.disable && c.flush_all && c.next_record,
                    "kernel trace: the CUPTI library found lacks the activity API");
  LOWBIT_USER_CHECK(!g_active, "kernel trace: one trace at a time");
  {
    std::lock_guard<std::mutex> lock(sink().mu);
    sink().records.clear();
    sink().api.clear();
  }
  check(c.register_callbacks(buffer_requested, buffer_completed), "registering buffers");
  check(c.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records");
  check(c.enable(CUPTI_ACTIVITY_KIND_RUNTIME), "enabling runtime-call records");
  g_active = true;
  std::unique_ptr<KernelTrace> t(new KernelTrace());
  t->running_ = true;
  return t;
}

std::vector<KernelRecord> KernelTrace::stop() {
  if (!running_) return {};
  running_ = false;
  g_active = false;
  check(cupti().flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flushing");
  check(cupti().disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disabling kernel records");
  check(cupti().disable(CUPTI_ACTIVITY_KIND_RUNTIME), "disabling runtime-call records");
  std::lock_guard<std::mutex> lock(sink().mu);
  std::vector<KernelRecord> out = std::move(sink().records);
  sink().records.clear();
  api_ = std::move(sink().api);
  sink().api.clear();
  std::sort(api_.begin(), api_.end(),
            [](const ApiRecord& a, const ApiRecord& b) { return a.start_ns < b.start_ns; });
  std::sort(out.begin(), out.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

KernelTrace::~KernelTrace() {
  if (running_) {
    try {
      stop();
    } catch (...) {  // a destructor reports nothing
    }
  }
}

KernelSummary summarize_kernels(const std::vector<KernelRecord>& records,
                                const std::vector<ApiRecord>& api) {
  KernelSummary s;
  if (records.empty()) return s;
  std::map<std::string, KernelSummaryRow> by_name;
  uint64_t first = records.front().start_ns, last = 0, covered_to = 0;
  double busy_ns = 0, sum_ns = 0;
  s.idle = {{2.0}, {10.0}, {100.0}, {std::numeric_limits<double>::infinity()}};
  const std::string* last_ender = nullptr;  // the kernel that ends at covered_to
  // records are sorted by start: the union of intervals in one sweep; a start after covered_to
  // is an idle gap.
  for (const KernelRecord& r : records) {
    const uint64_t end = std::max(r.end_ns, r.start_ns);
    KernelSummaryRow& row = by_name[r.name];
    row.name = r.name;
    ++row.launches;
    row.total_ms += double(end - r.start_ns) * 1e-6;
    sum_ns += double(end - r.start_ns);
    if (last_ender != nullptr && r.start_ns > covered_to) {
      const double us = double(r.start_ns - covered_to) * 1e-3;
      for (IdleBucket& b : s.idle) {
        if (us <= b.max_us) {
          ++b.gaps;
          b.total_ms += us * 1e-3;
          break;
        }
      }
      s.longest_gaps.push_back({us, *last_ender, r.name, covered_to, r.start_ns, {}});
      std::sort(s.longest_gaps.begin(), s.longest_gaps.end(),
                [](const IdleGap& a, const IdleGap& b) { return a.us > b.us; });
      if (s.longest_gaps.size() > size_t(KernelSummary::kLongestGaps)) s.longest_gaps.pop_back();
    }
    const uint64_t from = std::max(r.start_ns, covered_to);
    if (end > from) busy_ns += double(end - from);
    if (last_ender == nullptr || end >= covered_to) last_ender = &r.name;
    covered_to = std::max(covered_to, end);
    last = std::max(last, end);
    first = std::min(first, r.start_ns);
  }
  for (auto& [name, row] : by_name) s.rows.push_back(row);
  std::sort(s.rows.begin(), s.rows.end(), [](const KernelSummaryRow& a, const KernelSummaryRow& b) {
    return a.total_ms > b.total_ms;
  });
  s.kernel_ms = sum_ns * 1e-6;
  s.busy_ms = busy_ns * 1e-6;
  s.span_ms = double(last - first) * 1e-6;
  s.kernels = static_cast<int64_t>(records.size());
  // What the host was doing during each of the longest gaps: the runtime calls overlapping it,
  // summed by name (api is sorted by start; calls start before the gap ends).
  for (IdleGap& g : s.longest_gaps) {
    std::map<std::string, std::pair<double, int>> in_gap;  // name → (overlap ns, calls)
    for (const ApiRecord& a : api) {
      if (a.start_ns >= g.to_ns) break;
      const uint64_t from = std::max(a.start_ns, g.from_ns), to = std::min(a.end_ns, g.to_ns);
      if (to <= from) continue;
      auto& [ns, calls] = in_gap[a.name];
      ns += double(to - from);
      ++calls;
    }
    std::vector<std::pair<double, std::string>> by_time;
    for (const auto& [name, v] : in_gap) {
      by_time.push_back({v.first, fmt::format("{} {:.1f} us ×{}", name, v.first * 1e-3, v.second)});
    }
    std::sort(by_time.begin(), by_time.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    for (auto& [ns, text] : by_time) g.host.push_back(std::move(text));
  }
  return s;
}

std::string format_kernel_summary(const KernelSummary& s, int per, const std::string& title) {
  const double n = std::max(per, 1);
  std::string out = fmt::format(
      "# {}\n# per step: {:.0f} kernels, kernel time {:.3f} ms, GPU busy {:.3f} ms of a {:.3f} ms "
      "span ({:.1f}% busy)\n",
      title, double(s.kernels) / n, s.kernel_ms / n, s.busy_ms / n, s.span_ms / n,
      s.span_ms > 0 ? 100.0 * s.busy_ms / s.span_ms : 0.0);
  out += fmt::format("# {:>10} {:>9} {:>7}  {}\n", "ms/step", "launches", "share", "kernel");
  for (const KernelSummaryRow& r : s.rows) {
    std::string name = r.name.size() > 160 ? r.name.substr(0, 157) + "..." : r.name;
    out += fmt::format("{:>12.3f} {:>9.1f} {:>6.1f}%  {}\n", r.total_ms / n, double(r.launches) / n,
                       s.kernel_ms > 0 ? 100.0 * r.total_ms / s.kernel_ms : 0.0, name);
  }
  if (!s.idle.empty()) {
    out += "# idle time by gap length (per step): ";
    for (size_t i = 0; i < s.idle.size(); ++i) {
      const IdleBucket& b = s.idle[i];
      const std::string label = i == 0 ? fmt::format("<= {:g} us", b.max_us)
                                : std::isinf(b.max_us)
                                    ? fmt::format("> {:g} us", s.idle[i - 1].max_us)
                                    : fmt::format("{:g}-{:g} us", s.idle[i - 1].max_us, b.max_us);
      out += fmt::format("{}{} {:.1f} gaps {:.3f} ms", i ? ", " : "", label, double(b.gaps) / n,
                         b.total_ms / n);
    }
    out += "\n";
  }
  auto shorten = [](const std::string& k) { return k.size() > 70 ? k.substr(0, 67) + "..." : k; };
  for (const IdleGap& g : s.longest_gaps) {
    out += fmt::format("# gap {:>9.1f} us after {} | before {}\n", g.us, shorten(g.before),
                       shorten(g.after));
    if (!g.host.empty()) {
      const size_t shown = std::min<size_t>(g.host.size(), 6);
      std::string calls;
      for (size_t i = 0; i < shown; ++i) calls += (i ? ", " : "") + g.host[i];
      out += fmt::format("#   host in the gap: {}\n", calls);
    }
  }
  return out;
}

}  // namespace lowbit::bench
