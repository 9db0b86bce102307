// Tests for csrc/transfer/transfer_policy: which path gets which rows.
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "transfer/transfer_policy.h"

namespace speedtorch {
namespace {

constexpr int64_t kGB = int64_t{1} << 30;

TEST(TransferPolicy, SmallTablesAndTransfersUseUvaOnly) {
  const TransferConfig c;
  EXPECT_EQ(plan_transfer(c, 256 << 20, 512, 131072, 16).staged_rows, 0);  // within UVA reach
  EXPECT_EQ(plan_transfer(c, 5 * kGB, 512, 1000, 16).staged_rows, 0);      // 512 KB transfer
  EXPECT_EQ(plan_transfer(c, 5 * kGB, 4096, 131072, 16).staged_rows, 0);   // long rows
}

TEST(TransferPolicy, SpreadTablesSplitByRates) {
  const TransferConfig c;
  const TransferPlan many = plan_transfer(c, 5 * kGB, 512, 131072, 16);
  const TransferPlan two = plan_transfer(c, 5 * kGB, 512, 131072, 2);
  EXPECT_EQ(many.uva_rows + many.staged_rows, 131072);
  EXPECT_GT(many.staged_rows, 0);
  EXPECT_EQ(two.staged_rows, 0);  // two threads add too little: UVA alone
  const double staged = std::min(c.staged_max_gbps, 16 * c.staged_gbps_per_thread);
  EXPECT_NEAR(static_cast<double>(many.uva_rows) / 131072, c.uva_spread_gbps / (c.uva_spread_gbps + staged), 1e-3);
}

TEST(TransferPolicy, ExplicitFractionWins) {
  TransferConfig c;
  c.uva_fraction = 0.0;
  EXPECT_EQ(plan_transfer(c, 1024, 512, 100, 1).uva_rows, 0);
  c.uva_fraction = 1.0;
  EXPECT_EQ(plan_transfer(c, 5 * kGB, 512, 100, 16).staged_rows, 0);
  c.uva_fraction = 0.25;
  EXPECT_EQ(plan_transfer(c, 5 * kGB, 512, 100, 16).uva_rows, 25);
}

// A row longer than the configured chunk used to be copied into it anyway, past its end (issue 13).
TEST(TransferPolicy, StagingChunkHoldsAtLeastOneRow) {
  TransferConfig c;
  c.staging_chunk_bytes = 4096;
  EXPECT_EQ(staging_chunk_bytes_for(c, 512), 4096);
  EXPECT_EQ(staging_chunk_bytes_for(c, 4096), 4096);
  EXPECT_GE(staging_chunk_bytes_for(c, 2048 * 4), 2048 * 4);  // a 2048-wide float32 row
}

TEST(TransferPolicy, ConfigIsValidatedAndRoundTrips) {
  const TransferConfig saved = transfer_config();
  TransferConfig c = saved;
  c.uva_fraction = 1.5;
  EXPECT_THROW(set_transfer_config(c), c10::Error);
  c = saved;
  c.staging_chunk_bytes = 100;
  EXPECT_THROW(set_transfer_config(c), c10::Error);
  c = saved;
  c.uva_fraction = 0.4;
  set_transfer_config(c);
  EXPECT_EQ(transfer_config().uva_fraction, 0.4);
  set_transfer_config(saved);
}

// A table's own settings: in force on the calling thread while the scope lives, nested scopes apply over the outer
// ones, other threads and the process's settings never see them.
TEST(TransferPolicy, ScopesApplyOverridesOnTheirThreadOnly) {
  const TransferConfig process = process_transfer_config();
  {
    const TransferConfigScope outer({{"uva_fraction", 0.25}, {"staging_chunk_bytes", 65536}}, "test");
    EXPECT_EQ(transfer_config().uva_fraction, 0.25);
    EXPECT_EQ(transfer_config().staging_chunk_bytes, 65536);
    {
      const TransferConfigScope inner({{"uva_fraction", 0.5}}, "test");
      EXPECT_EQ(transfer_config().uva_fraction, 0.5);
      EXPECT_EQ(transfer_config().staging_chunk_bytes, 65536);  // the outer scope's
      const TransferConfigScope none({}, "test");                // no overrides: changes nothing
      EXPECT_EQ(transfer_config().uva_fraction, 0.5);
    }
    EXPECT_EQ(transfer_config().uva_fraction, 0.25);
    double seen_elsewhere = 0;
    std::thread([&] { seen_elsewhere = transfer_config().uva_fraction; }).join();
    EXPECT_EQ(seen_elsewhere, process.uva_fraction);
    EXPECT_EQ(process_transfer_config().uva_fraction, process.uva_fraction);
  }
  EXPECT_EQ(transfer_config().uva_fraction, process.uva_fraction);
  EXPECT_EQ(transfer_config().staging_chunk_bytes, process.staging_chunk_bytes);
}

// A thread's own settings (Python's transfer_config_override): in force on that thread over the process's (also
// over the process's later changes), removable in any order, never seen by another thread (issue 31: two blocks in
// two threads that saved and restored the process's value left it changed).
TEST(TransferPolicy, ThreadOverridesHoldOnTheirThreadWhateverTheExitOrder) {
  const TransferConfig process = process_transfer_config();
  const int64_t first = push_thread_transfer_overrides({{"max_sms", 4}}, "test");
  const int64_t second = push_thread_transfer_overrides({{"max_sms", 8}, {"uva_fraction", 0.5}}, "test");
  EXPECT_EQ(transfer_config().max_sms, 8);  // the later entry applies over the earlier one
  int64_t seen_elsewhere = -1;
  std::thread([&] { seen_elsewhere = transfer_config().max_sms; }).join();
  EXPECT_EQ(seen_elsewhere, process.max_sms);
  EXPECT_EQ(process_transfer_config().max_sms, process.max_sms);
  pop_thread_transfer_overrides(first, "test");  // out of order: the second entry stays whole
  EXPECT_EQ(transfer_config().max_sms, 8);
  EXPECT_EQ(transfer_config().uva_fraction, 0.5);
  {
    const TransferConfigScope table({{"uva_fraction", 0.25}}, "test");  // a table's own settings apply over them
    EXPECT_EQ(transfer_config().uva_fraction, 0.25);
    EXPECT_EQ(transfer_config().max_sms, 8);
  }
  TransferConfig changed = process;
  changed.staging_chunk_bytes = 65536;
  set_transfer_config(changed);  // the process's change reaches the thread where it sets nothing
  EXPECT_EQ(transfer_config().staging_chunk_bytes, 65536);
  set_transfer_config(process);
  bool refused_elsewhere = false;
  std::thread([&] {
    try {
      pop_thread_transfer_overrides(second, "Caller");
    } catch (const c10::Error& e) {
      refused_elsewhere = std::string(e.what_without_backtrace()).find("Caller: this thread holds no transfer "
                                                                       "settings with id") != std::string::npos;
    }
  }).join();
  EXPECT_TRUE(refused_elsewhere);
  pop_thread_transfer_overrides(second, "test");
  EXPECT_EQ(transfer_config().max_sms, process.max_sms);
  EXPECT_EQ(transfer_config().uva_fraction, process.uva_fraction);
  EXPECT_THROW(pop_thread_transfer_overrides(second, "test"), c10::Error);  // removed already
  EXPECT_THROW(push_thread_transfer_overrides({{"max_sms", -1}}, "test"), c10::Error);
  EXPECT_THROW(push_thread_transfer_overrides({{"no_such", 1}}, "test"), c10::Error);
  EXPECT_EQ(transfer_config().max_sms, process.max_sms);  // a refused push leaves nothing behind
}

TEST(TransferPolicy, OverridesAreValidatedByName) {
  EXPECT_THROW(TransferConfigScope({{"uva_fraction", 3.0}}, "test"), c10::Error);
  try {
    with_overrides(TransferConfig{}, {{"no_such", 1.0}}, "Caller");
    FAIL() << "an unknown name was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("Caller: unknown transfer option 'no_such'; known options: "
                                                           "uva_fraction, "),
              std::string::npos)
        << e.what_without_backtrace();
  }
  TransferConfig c;
  set_transfer_option(c, "uva_blocks_per_sm", 3, "test");
  EXPECT_EQ(c.uva_blocks_per_sm, 3);
  EXPECT_EQ(get_transfer_option(c, "uva_blocks_per_sm", "test"), 3.0);
  EXPECT_EQ(transfer_option_names().front(), "uva_fraction");
}

// The one table of settings: every name once, and its environment variable is SPEEDTORCH_ + the name upper-cased.
TEST(TransferPolicy, OptionTableNamesEachSettingOnceWithItsEnvironmentVariable) {
  std::vector<std::string> names;
  for_each_transfer_option([&](const char* name, const char* env, auto) {
    std::string expected_env = std::string("SPEEDTORCH_") + name;
    std::transform(expected_env.begin(), expected_env.end(), expected_env.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
    EXPECT_EQ(std::string(env), expected_env);
    names.emplace_back(name);
  });
  EXPECT_EQ(names.size(), 17u);
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end());
}

// Writing each field through the table changes exactly that field (no entry points at another's member): set one
// field at a time to 1 over an all-zero config and read every field back.
TEST(TransferPolicy, OptionTableFieldsAreDistinct) {
  int count = 0;
  for_each_transfer_option([&](const char*, const char*, auto) { ++count; });
  for (int target = 0; target < count; ++target) {
    TransferConfig c;
    for_each_transfer_option([&](const char*, const char*, auto field) {
      c.*field = std::remove_reference_t<decltype(c.*field)>{};
    });
    int index = 0;
    for_each_transfer_option([&](const char*, const char*, auto field) {
      if (index++ == target) c.*field = static_cast<std::remove_reference_t<decltype(c.*field)>>(1);
    });
    index = 0;
    for_each_transfer_option([&](const char* name, const char*, auto field) {
      const bool set = c.*field != std::remove_reference_t<decltype(c.*field)>{};
      EXPECT_EQ(set, index == target) << name << " after setting option " << target;
      ++index;
    });
  }
}

}  // namespace
}  // namespace speedtorch
