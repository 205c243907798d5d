// Learning-rate schedules: warmup, cosine / linear / constant decay, validation.
#include <gtest/gtest.h>

#include <cmath>

#include "lowbit/core/error.h"
#include "lowbit/train/schedule.h"

namespace lowbit {
namespace {

LrSchedule make(LrDecay d) {
  LrSchedule s;
  s.peak_lr = 1e-3;
  s.min_lr = 1e-4;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.decay = d;
  return s;
}

TEST(LrScheduleTest, WarmupIsLinearAndNeverZero) {
  const LrSchedule s = make(LrDecay::kCosine);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(4), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1e-3);
  EXPECT_DOUBLE_EQ(s.lr_at(-3), s.lr_at(0));
  for (int64_t i = 1; i < 10; ++i) EXPECT_GT(s.lr_at(i), s.lr_at(i - 1));
}

TEST(LrScheduleTest, CosineDecaysToMin) {
  const LrSchedule s = make(LrDecay::kCosine);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-3);      // p = 0
  EXPECT_NEAR(s.lr_at(60), 5.5e-4, 1e-15);  // p = 0.5: halfway
  EXPECT_NEAR(s.lr_at(35), 1e-4 + 9e-4 * (1 + std::cos(M_PI * 0.25)) / 2, 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 1e-4);   // p = 1
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 1e-4);  // past the end
  for (int64_t i = 11; i <= 110; ++i) EXPECT_LE(s.lr_at(i), s.lr_at(i - 1)) << i;
}

TEST(LrScheduleTest, LinearAndConstant) {
  const LrSchedule l = make(LrDecay::kLinear);
  EXPECT_DOUBLE_EQ(l.lr_at(10), 1e-3);
  EXPECT_NEAR(l.lr_at(60), 5.5e-4, 1e-15);
  EXPECT_NEAR(l.lr_at(85), 1e-4 + 9e-4 * 0.25, 1e-15);
  EXPECT_DOUBLE_EQ(l.lr_at(500), 1e-4);
  const LrSchedule c = make(LrDecay::kConstant);
  EXPECT_DOUBLE_EQ(c.lr_at(4), 5e-4);
  EXPECT_DOUBLE_EQ(c.lr_at(10), 1e-3);
  EXPECT_DOUBLE_EQ(c.lr_at(500), 1e-3);
}

TEST(LrScheduleTest, EdgeCases) {
  LrSchedule s = make(LrDecay::kCosine);
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-3);
  s.warmup_steps = 200;  // warmup longer than the run: it never reaches the decay
  EXPECT_DOUBLE_EQ(s.lr_at(99), 5e-4);
  s.warmup_steps = 10;
  s.total_steps = 10;  // no decay span
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-4);
  s.total_steps = 0;
  EXPECT_NO_THROW(s.validate());
}

TEST(LrScheduleTest, ValidateAndNames) {
  LrSchedule s = make(LrDecay::kCosine);
  EXPECT_NO_THROW(s.validate());
  s.min_lr = 2e-3;
  EXPECT_THROW(s.validate(), UserError);
  s = make(LrDecay::kCosine);
  s.peak_lr = 0;
  EXPECT_THROW(s.validate(), UserError);
  s = make(LrDecay::kCosine);
  s.warmup_steps = -1;
  EXPECT_THROW(s.validate(), UserError);
  s = make(LrDecay::kCosine);
  s.peak_lr = NAN;
  EXPECT_THROW(s.validate(), UserError);
  for (LrDecay d : {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kConstant}) {
    EXPECT_EQ(lr_decay_from_name(lr_decay_name(d)), d);
  }
  try {
    lr_decay_from_name("exp");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("cosine, linear, constant"), std::string::npos);
  }
  EXPECT_EQ(make(LrDecay::kCosine).describe(),
            "cosine: warmup 10 steps to 0.001, decay to 0.0001 at step 110");
}

}  // namespace
}  // namespace lowbit
