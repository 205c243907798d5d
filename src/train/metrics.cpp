// metrics.jsonl writer (include/lowbit/train/metrics.h).
#include "lowbit/train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "data/data_util.h"
#include "lowbit/core/error.h"

namespace lowbit {

namespace {

std::string errno_text() { return std::strerror(errno); }

// The record's "step" when it has an integral one.
std::optional<int64_t> record_step(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  auto it = j.find("step");
  if (it == j.end() || !it->is_number()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  return static_cast<int64_t>(std::floor(it->get<double>()));
}

nlohmann::ordered_json to_json(const MetricValue& v) {
  return std::visit(
      [](const auto& x) -> nlohmann::ordered_json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, double>) {
          return std::isfinite(x) ? nlohmann::ordered_json(x) : nlohmann::ordered_json(nullptr);
        } else if constexpr (std::is_same_v<T, RawJson>) {
          try {
            return nlohmann::ordered_json::parse(x.text);
          } catch (const nlohmann::json::exception& e) {
            throw UserError(fmt::format("metrics: a raw JSON value is not valid JSON ({}): {}",
                                        e.what(), x.text.substr(0, 200)));
          }
        } else {
          return nlohmann::ordered_json(x);
        }
      },
      v.value());
}

}  // namespace

double MetricValue::widen(float v) {
  return std::isfinite(v) ? std::stod(fmt::format("{}", v)) : static_cast<double>(v);
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t resume_step) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::string kept;
    kept.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      const bool complete = nl != std::string::npos;
      if (!complete) nl = text.size();
      const std::string line = text.substr(pos, nl - pos);
      pos = nl + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) {
        // A last line without its newline is a record cut short by a crash: drop it. Other
        // unreadable lines are not ours to judge and stay.
        if (!complete) {
          ++removed_;
          continue;
        }
      } else if (std::optional<int64_t> s = record_step(j); s && *s > resume_step) {
        ++removed_;
        continue;
      }
      kept += line;
      kept += '\n';
    }
    // Rewritten atomically: a crash leaves the old file or the trimmed one, never a torn one.
    if (kept.size() != text.size()) data::detail::write_file_atomic(path, kept);
  }
  f_ = std::fopen(path.c_str(), "ab");
  LOWBIT_USER_CHECK(f_ != nullptr,
                    "{}: cannot open the metrics file for appending: {} (does the run directory "
                    "exist and is it writable?)",
                    path, errno_text());
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::append_line(const std::string& line) {
  const bool ok = std::fwrite(line.data(), 1, line.size(), f_) == line.size() &&
                  std::fputc('\n', f_) != EOF && std::fflush(f_) == 0;
  LOWBIT_USER_CHECK(ok, "{}: writing a metrics record failed: {} (disk full?)", path_,
                    errno_text());
}

void MetricsWriter::write(const std::string& json_object) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(json_object);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: a metrics record is not valid JSON ({}): {}", path_, e.what(),
                                json_object.substr(0, 200)));
  }
  LOWBIT_USER_CHECK(j.is_object(), "{}: a metrics record must be a JSON object, got: {}", path_,
                    json_object.substr(0, 200));
  append_line(j.dump());
}

void MetricsWriter::write(const MetricFields& fields) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [key, value] : fields) j[key] = to_json(value);
  append_line(j.dump());
}

}  // namespace lowbit
