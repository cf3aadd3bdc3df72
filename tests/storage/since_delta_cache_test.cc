// SinceDeltaCache (white-box): records and records known by their size only, under a budget.
#include "context/since_delta_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace ckpt {
namespace {

SinceDeltaCache::Key KeyOf(uint32_t chunk) { return {1, "m", 3, 0, 0, chunk}; }

SinceDeltaCache::Record RecordOf(size_t bytes) {
  return std::make_shared<const std::string>(bytes, 'r');
}

TEST(SinceDeltaCacheTest, KeepsRecordsOrTheirSizeAndReplacesEither) {
  SinceDeltaCache cache(1 << 20);
  EXPECT_EQ(cache.Get(KeyOf(0)).record_bytes, 0u);
  cache.Put(KeyOf(0), RecordOf(1000));
  SinceDeltaCache::Known known = cache.Get(KeyOf(0));
  ASSERT_NE(known.record, nullptr);
  EXPECT_EQ(known.record_bytes, 1000u);
  // A size does not replace a record (a pull with a shorter chain found it no smaller).
  cache.PutSizeOnly(KeyOf(0), 1000);
  EXPECT_NE(cache.Get(KeyOf(0)).record, nullptr);
  cache.PutSizeOnly(KeyOf(1), 5000);
  known = cache.Get(KeyOf(1));
  EXPECT_EQ(known.record, nullptr);
  EXPECT_EQ(known.record_bytes, 5000u);
  EXPECT_LT(cache.size_bytes(), 2000u);  // a size is charged far less than its record
  cache.PutSizeOnly(KeyOf(1), 4000);
  EXPECT_EQ(cache.Get(KeyOf(1)).record_bytes, 4000u);
  cache.Put(KeyOf(1), RecordOf(700));
  EXPECT_EQ(cache.Get(KeyOf(1)).record_bytes, 700u);
  EXPECT_EQ(cache.size_bytes(), 1700u);
  // Another model's, version's or chunk's record is another key.
  EXPECT_EQ(cache.Get({1, "n", 3, 0, 0, 0}).record_bytes, 0u);
  EXPECT_EQ(cache.Get({1, "m", 3, 2, 0, 0}).record_bytes, 0u);
  EXPECT_EQ(cache.Get(KeyOf(2)).record_bytes, 0u);
}

TEST(SinceDeltaCacheTest, SizesOnlyAreBoundedByTheBudgetToo) {
  SinceDeltaCache cache(4096);
  for (uint32_t chunk = 0; chunk < 1000; ++chunk) cache.PutSizeOnly(KeyOf(chunk), 1 << 20);
  EXPECT_LE(cache.size_bytes(), 4096u);
  EXPECT_EQ(cache.Get(KeyOf(999)).record_bytes, 1u << 20);  // the most recent are kept
  EXPECT_EQ(cache.Get(KeyOf(0)).record_bytes, 0u);
  // A record larger than the budget is not kept, and leaves what was known.
  cache.Put(KeyOf(999), RecordOf(5000));
  EXPECT_EQ(cache.Get(KeyOf(999)).record_bytes, 1u << 20);
}

}  // namespace
}  // namespace ckpt
