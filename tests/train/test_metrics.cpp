// metrics.jsonl (records, resume truncation), the progress display and the formatters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "lowbit/core/error.h"
#include "lowbit/train/metrics.h"

namespace lowbit {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<nlohmann::json> records(const std::string& p) {
  std::vector<nlohmann::json> out;
  std::istringstream in(read_file(p));
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lowbit_metrics_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  fs::path dir_;
};

TEST_F(MetricsTest, WritesOneFlushedObjectPerLine) {
  const std::string p = path("metrics.jsonl");
  MetricsWriter w(p, 0);
  w.write(MetricFields{{"step", 1},
                       {"loss", 3.5},
                       {"lr", 1e-3f},
                       {"skipped", false},
                       {"recipe", "fp8"},
                       {"bad", std::nan("")},
                       {"mem", RawJson{R"({"weights": 12})"}}});
  w.write(R"({"step": 2,
              "loss": 3.25})");
  // Flushed: readable before the writer closes.
  const std::string text = read_file(p);
  EXPECT_EQ(text,
            "{\"step\":1,\"loss\":3.5,\"lr\":0.001,\"skipped\":false,"
            "\"recipe\":\"fp8\",\"bad\":null,\"mem\":{\"weights\":12}}\n"
            "{\"step\":2,\"loss\":3.25}\n");
  EXPECT_THROW(w.write("[1, 2]"), UserError);
  EXPECT_THROW(w.write("{oops"), UserError);
  EXPECT_THROW(w.write(MetricFields{{"x", RawJson{"{"}}}), UserError);
  EXPECT_EQ(records(p).size(), 2u);
}

TEST_F(MetricsTest, ResumeDropsRecordsAfterTheCheckpoint) {
  const std::string p = path("metrics.jsonl");
  {
    std::ofstream f(p);
    f << "{\"event\":\"start\"}\n";
    for (int s = 1; s <= 8; ++s) f << "{\"step\":" << s << ",\"loss\":" << 10 - s << "}\n";
    f << "{\"step\":9,\"lo";  // cut short by a crash
  }
  {
    MetricsWriter w(p, 5);  // resumed from the checkpoint taken after step 5
    EXPECT_EQ(w.removed_records(), 4);
    w.write(MetricFields{{"step", 6}, {"loss", 1.0}});
  }
  std::vector<nlohmann::json> r = records(p);
  ASSERT_EQ(r.size(), 7u);
  EXPECT_EQ(r[0]["event"], "start");
  for (int s = 1; s <= 6; ++s) EXPECT_EQ(r[s]["step"], s);
  EXPECT_EQ(r[6]["loss"], 1.0);

  // Reopening at the end removes nothing and rewrites nothing.
  const auto mtime = fs::last_write_time(p);
  {
    MetricsWriter w(p, 6);
    EXPECT_EQ(w.removed_records(), 0);
  }
  EXPECT_EQ(fs::last_write_time(p), mtime);
  // A new run in the same directory starts over (records without a step stay).
  {
    MetricsWriter w(p, 0);
    EXPECT_EQ(w.removed_records(), 6);
  }
  EXPECT_EQ(records(p).size(), 1u);
  EXPECT_THROW(MetricsWriter(path("no/such/dir/metrics.jsonl"), 0), UserError);
}

TEST(FormatTest, BytesDurationsCounts) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(int64_t(1288490189)), "1.2 GiB");
  EXPECT_EQ(format_bytes(int64_t(300) << 20), "300 MiB");
  EXPECT_EQ(format_duration(45.2), "45s");
  EXPECT_EQ(format_duration(133), "2m13s");
  EXPECT_EQ(format_duration(3720), "1h02m");
  EXPECT_EQ(format_duration(3 * 86400 + 4 * 3600), "3d04h");
  EXPECT_EQ(format_duration(-1), "-");
  EXPECT_EQ(format_count(950), "950");
  EXPECT_EQ(format_count(12345), "12.3k");
  EXPECT_EQ(format_count(4.561e6), "4.56M");
  EXPECT_EQ(format_count(1.2e9), "1.20G");
}

TEST(FormatTest, MemStats) {
  MemStats s;
  auto set = [&](MemCategory c, int64_t cur, int64_t peak) {
    s.by_category[static_cast<int>(c)] = {cur, peak};
  };
  const int64_t G = int64_t(1) << 30;
  set(MemCategory::kWeights, G * 12 / 10, G * 13 / 10);
  set(MemCategory::kGradients, G * 12 / 10, G * 12 / 10);
  set(MemCategory::kActivations, 0, int64_t(3) << 30);
  s.total = {G * 24 / 10, G * 55 / 10};
  EXPECT_EQ(format_mem_stats(s),
            "weights 1.2 GiB (peak 1.3) · gradients 1.2 GiB (peak 1.2) · activations 0.0 GiB "
            "(peak 3.0) · total 2.4 GiB (peak 5.5)");
  EXPECT_EQ(format_mem_stats(MemStats{}), "total 0 B (peak 0)");
}

// Everything a ProgressBar printed to a temporary file.
std::string captured(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  return out;
}

TEST(ProgressBarTest, PlainModePrintsTableRowsOnly) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(100, 0, f, ProgressBar::Mode::kPlain);
    EXPECT_FALSE(bar.is_tty());
    ProgressBar::Line l;
    for (int s = 1; s <= 20; ++s) {
      l.step = s;
      l.loss = 5.0 - s * 0.1;
      l.lr = 1e-3;
      l.tokens_per_s = 12345;
      l.mfu = s == 20 ? 0.312 : -1;
      l.val_loss = s == 20 ? 3.5 : -1;
      bar.update(l, s % 10 == 0);
    }
    bar.finish();
  }
  const std::string out = captured(f);
  std::fclose(f);
  EXPECT_EQ(out.find('\r'), std::string::npos);
  std::istringstream in(out);
  std::string header, row1, row2, extra;
  std::getline(in, header);
  std::getline(in, row1);
  std::getline(in, row2);
  EXPECT_FALSE(std::getline(in, extra));
  EXPECT_EQ(header, ProgressBar::header_text());
  EXPECT_NE(row1.find("4.0000"), std::string::npos) << row1;
  EXPECT_NE(row1.find("12.3k"), std::string::npos) << row1;
  EXPECT_NE(row2.find("3.5000"), std::string::npos) << row2;
  EXPECT_NE(row2.find("31.2%"), std::string::npos) << row2;
}

TEST(ProgressBarTest, TtyModeRedrawsOneLine) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressBar bar(10, 2, f, ProgressBar::Mode::kTty);
    bar.set_min_redraw_seconds(0);
    ProgressBar::Line l;
    l.loss = 2.5;
    l.lr = 3e-4;
    l.tokens_per_s = 2e6;
    l.mfu = 0.4;
    for (int s = 3; s <= 10; ++s) {
      l.step = s;
      bar.update(l, s == 5);
    }
  }  // the destructor ends the line
  const std::string out = captured(f);
  std::fclose(f);
  EXPECT_NE(out.find("\r\x1b[2Kstep 3/10 ["), std::string::npos) << out;
  EXPECT_NE(out.find("step 10/10 [====================]"), std::string::npos) << out;
  EXPECT_NE(out.find("loss 2.5000 | lr 3.00e-04 | 2.00M tok/s | MFU 40.0% | ETA"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(ProgressBar::header_text() + "\n"), std::string::npos);
  EXPECT_EQ(out.back(), '\n');
}

TEST(ProgressBarTest, EtaFromMeasuredSteps) {
  ProgressBar bar(100, 0, stdout, ProgressBar::Mode::kPlain);
  ProgressBar::Line l;
  l.step = 50;
  // 40 steps timed in 80 s: 2 s per step, 50 steps left.
  EXPECT_NE(bar.status_text(l, 80, 40).find("ETA 1m40s"), std::string::npos);
  EXPECT_NE(bar.status_text(l, 0, 0).find("ETA -"), std::string::npos);
  EXPECT_NE(bar.row_text(l, 80, 40).find("1m20s"), std::string::npos);  // elapsed
}

}  // namespace
}  // namespace lowbit
