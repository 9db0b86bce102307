// Tests for csrc/transfer/split_calibration: the measured UVA share, its cache and its keys.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "transfer/split_calibration.h"

namespace speedtorch {
namespace {

class SplitCalibrationTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_split_calibrations(); }
  void TearDown() override { clear_split_calibrations(); }
};

SplitKey key_for(int64_t footprint, int64_t count, int threads) {
  return split_key(0, TransferDirection::kGather, false, footprint, 512, count, threads, TransferConfig{});
}

TEST_F(SplitCalibrationTest, KeepsTheFastestShareAndReusesIt) {
  const SplitKey key = key_for(int64_t{5} << 30, 131072, 16);
  EXPECT_FALSE(calibrated_uva_share(key).has_value());
  std::vector<double> tried;
  // A made-up machine whose best split gives 15% of the rows to staging.
  const double share = calibrate_uva_share(key, [&](double s) {
    tried.push_back(s);
    return 1.0 + std::fabs(s - 0.85);
  });
  EXPECT_DOUBLE_EQ(share, 0.85);
  EXPECT_EQ(tried.size(), 3 * candidate_uva_shares().size());  // three rounds over every candidate
  EXPECT_DOUBLE_EQ(tried.front(), 1.0);                        // all-UVA first
  ASSERT_TRUE(calibrated_uva_share(key).has_value());
  EXPECT_DOUBLE_EQ(*calibrated_uva_share(key), 0.85);
  const std::vector<SplitCalibration> all = split_calibrations();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].key, key);
  EXPECT_EQ(all[0].milliseconds.size(), candidate_uva_shares().size());
}

TEST_F(SplitCalibrationTest, ASplitMustBeatAllUvaClearly) {
  // 2% faster with a staged share: within the link's spread, so all-UVA is kept.
  EXPECT_DOUBLE_EQ(calibrate_uva_share(key_for(int64_t{5} << 30, 131072, 16),
                                       [](double s) { return s == 0.9 ? 0.98 : 1.0; }),
                   1.0);
  // 5% faster: kept.
  EXPECT_DOUBLE_EQ(calibrate_uva_share(key_for(int64_t{5} << 30, 131072, 2),
                                       [](double s) { return s == 0.9 ? 0.95 : 1.0; }),
                   0.9);
}

TEST_F(SplitCalibrationTest, BestOfTheRoundsCounts) {
  // All-UVA is slow in round one only (a warm-up): its best time decides.
  int calls = 0;
  const double share = calibrate_uva_share(key_for(1 << 30, 65536, 2), [&](double s) {
    ++calls;
    if (s == 1.0) return calls == 1 ? 10.0 : 1.0;
    return 2.0;
  });
  EXPECT_DOUBLE_EQ(share, 1.0);
}

TEST_F(SplitCalibrationTest, KindsOfCallsAreKeptApart) {
  const SplitKey spread = key_for(int64_t{5} << 30, 131072, 16);
  const SplitKey local = key_for(int64_t{256} << 20, 131072, 16);
  const SplitKey two_threads = key_for(int64_t{5} << 30, 131072, 2);
  EXPECT_FALSE(spread == local);
  EXPECT_FALSE(spread == two_threads);
  // The same powers of two of footprint and rows are one kind.
  EXPECT_EQ(spread, key_for((int64_t{5} << 30) + 12345, 131072 + 1000, 16));
  TransferConfig budget;
  budget.max_sms = 16;
  EXPECT_FALSE(spread == split_key(0, TransferDirection::kGather, false, int64_t{5} << 30, 512, 131072, 16, budget));
  EXPECT_FALSE(spread ==
               split_key(0, TransferDirection::kScatter, false, int64_t{5} << 30, 512, 131072, 16, TransferConfig{}));
  calibrate_uva_share(spread, [](double s) { return 2.0 - s; });
  EXPECT_FALSE(calibrated_uva_share(local).has_value());
  EXPECT_FALSE(calibrated_uva_share(two_threads).has_value());
}

TEST_F(SplitCalibrationTest, AFailedMeasurementKeepsNothing) {
  const SplitKey key = key_for(int64_t{5} << 30, 131072, 16);
  EXPECT_THROW(calibrate_uva_share(key,
                                   [](double s) -> double {
                                     if (s < 0.9) throw std::runtime_error("staging failed");
                                     return 1.0;
                                   }),
               std::runtime_error);
  EXPECT_FALSE(calibrated_uva_share(key).has_value());
}

TEST_F(SplitCalibrationTest, RulesFixTheShareWhereStagingCannotPay) {
  TransferConfig c;
  EXPECT_FALSE(fixed_uva_share(c, 512, 131072).has_value());  // 64 MiB of 512-byte rows: measured
  EXPECT_DOUBLE_EQ(*fixed_uva_share(c, 512, 1024), 1.0);      // 512 KiB: all UVA
  EXPECT_DOUBLE_EQ(*fixed_uva_share(c, 4096, 131072), 1.0);   // long rows: all UVA
  c.uva_fraction = 0.3;
  EXPECT_DOUBLE_EQ(*fixed_uva_share(c, 512, 131072), 0.3);    // explicit
  const TransferPlan plan = plan_from_share(0.85, 1000);
  EXPECT_EQ(plan.uva_rows, 850);
  EXPECT_EQ(plan.staged_rows, 150);
}

// A made-up machine where UVA alone takes 1.0 ms and a staged share of 20% 0.9 ms: the calibration keeps 0.8.
SplitKey calibrated_at_0_8() {
  const SplitKey key = key_for(int64_t{5} << 30, 131072, 16);
  calibrate_uva_share(key, [](double s) { return s == 0.8 ? 0.9 : 1.0; });
  return key;
}

TEST_F(SplitCalibrationTest, GuardKeepsASplitThatStillWins) {
  const SplitKey key = calibrated_at_0_8();
  for (int call = 0; call < 20; ++call) EXPECT_DOUBLE_EQ(note_split_time(key, 0.8, 0.92), 0.8);
  EXPECT_DOUBLE_EQ(*calibrated_uva_share(key), 0.8);
}

TEST_F(SplitCalibrationTest, GuardGivesUvaRowsBackWhenTheSplitLoses) {
  const SplitKey key = calibrated_at_0_8();
  // Slower than UVA alone (1.0 ms), but no collapse: one candidate toward UVA, after three calls.
  EXPECT_DOUBLE_EQ(note_split_time(key, 0.8, 1.1), 0.8);
  EXPECT_DOUBLE_EQ(note_split_time(key, 0.8, 1.1), 0.8);
  EXPECT_DOUBLE_EQ(note_split_time(key, 0.8, 1.1), 0.85);
  EXPECT_DOUBLE_EQ(*calibrated_uva_share(key), 0.85);
  // A call planned before the move reports the old share: ignored.
  EXPECT_DOUBLE_EQ(note_split_time(key, 0.8, 5.0), 0.85);
  // The new share is judged on its own calls, and keeps moving while it loses.
  for (int call = 0; call < 3; ++call) note_split_time(key, 0.85, 1.05);
  EXPECT_DOUBLE_EQ(*calibrated_uva_share(key), 0.9);
  const std::vector<SplitCalibration> all = split_calibrations();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_DOUBLE_EQ(all[0].calibrated_share, 0.8);
  EXPECT_DOUBLE_EQ(all[0].uva_share, 0.9);
  EXPECT_TRUE(all[0].recent_ms.empty());
}

TEST_F(SplitCalibrationTest, GuardGoesStraightToUvaAloneAfterACollapse) {
  // Issue 30 item 4: 24 ms a call where UVA alone took ~1.6 ms.
  const SplitKey key = calibrated_at_0_8();
  for (int call = 0; call < 2; ++call) EXPECT_DOUBLE_EQ(note_split_time(key, 0.8, 24.0), 0.8);
  EXPECT_DOUBLE_EQ(note_split_time(key, 0.8, 24.0), 1.0);
  EXPECT_DOUBLE_EQ(*calibrated_uva_share(key), 1.0);
  // UVA alone has nothing left to guard; the split stays off until the kind is measured again.
  EXPECT_DOUBLE_EQ(note_split_time(key, 1.0, 24.0), 1.0);
  clear_split_calibrations();
  EXPECT_FALSE(calibrated_uva_share(key).has_value());
}

TEST_F(SplitCalibrationTest, GuardIgnoresOccasionalSlowCalls) {
  const SplitKey key = calibrated_at_0_8();
  for (double ms : {0.9, 24.0, 0.9, 0.9, 24.0, 0.9, 0.9}) EXPECT_DOUBLE_EQ(note_split_time(key, 0.8, ms), 0.8);
}

TEST_F(SplitCalibrationTest, GuardIgnoresKindsNotMeasured) {
  const SplitKey key = key_for(int64_t{5} << 30, 131072, 16);
  EXPECT_DOUBLE_EQ(note_split_time(key, 0.8, 24.0), 1.0);
  EXPECT_FALSE(calibrated_uva_share(key).has_value());
}

}  // namespace
}  // namespace speedtorch
