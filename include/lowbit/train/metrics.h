// Run metrics: one JSON object per line in `metrics.jsonl`, flushed per line, consistent across
// a resume. The progress display and memory formatting are in progress.h.
#pragma once

#include <concepts>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "lowbit/train/progress.h"

namespace lowbit {

// A JSON value given as text (a nested object or array), written as it is after validation.
struct RawJson {
  std::string text;
};

// One metric: a number, an integer, a flag, a string or raw JSON. Non-finite numbers are
// written as null.
class MetricValue {
 public:
  using Storage = std::variant<double, int64_t, bool, std::string, RawJson>;
  MetricValue(double v) : v_(v) {}
  // Written as the shortest decimal that reads back as the same float (1e-3f → 0.001).
  MetricValue(float v) : v_(widen(v)) {}
  template <std::integral T>
  requires(!std::same_as<T, bool>) MetricValue(T v) : v_(static_cast<int64_t>(v)) {}
  MetricValue(bool v) : v_(v) {}
  MetricValue(const char* v) : v_(std::string(v)) {}
  MetricValue(std::string v) : v_(std::move(v)) {}
  MetricValue(RawJson v) : v_(std::move(v)) {}
  const Storage& value() const { return v_; }

 private:
  static double widen(float v);
  Storage v_;
};

// Fields of one record, in output order.
using MetricFields = std::vector<std::pair<std::string, MetricValue>>;

class MetricsWriter {
 public:
  // Opens `path` (a metrics.jsonl file; its directory must exist) for appending, creating it if
  // needed. A run resumed from a checkpoint of `resume_step` steps continues the file: records
  // whose "step" is greater than resume_step (written after that checkpoint by the interrupted
  // run, and about to be written again) are removed first, as is a last line left unfinished by
  // a crash. A new run passes 0, which keeps only records without a step. Throws UserError
  // when the file cannot be read or written.
  MetricsWriter(const std::string& path, int64_t resume_step);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends one record: a JSON object as text (re-serialised on one line) or a field list.
  // Throws UserError for text that is not a JSON object.
  void write(const std::string& json_object);
  void write(const MetricFields& fields);

  const std::string& path() const { return path_; }
  // Records removed when the file was opened.
  int64_t removed_records() const { return removed_; }

 private:
  void append_line(const std::string& line);
  std::string path_;
  std::FILE* f_ = nullptr;
  int64_t removed_ = 0;
};

}  // namespace lowbit
