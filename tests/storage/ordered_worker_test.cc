// OrderedWorker: jobs run in order on one thread, each on its own copy of the bytes; the queue
// stays within its byte bound; a failed job stops the ones after it.
#include "ordered_worker.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ckpt {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(OrderedWorker, RunsJobsInOrderOnCopiesOfTheirBytes) {
  OrderedWorker worker(1 << 20, 0);
  std::vector<std::string> seen;  // written by the jobs only, read after Drain
  std::string buffer;
  for (int i = 0; i < 100; ++i) {
    buffer = "chunk " + std::to_string(i);
    ASSERT_TRUE(worker
                    .Submit(Bytes(buffer),
                            [&seen](std::span<const uint8_t> bytes) {
                              seen.emplace_back(bytes.begin(), bytes.end());
                              return Status::Ok();
                            })
                    .ok());
    buffer.assign(buffer.size(), 'x');  // the caller reuses its buffer at once
  }
  ASSERT_TRUE(worker.Drain().ok());
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], "chunk " + std::to_string(i));
}

TEST(OrderedWorker, SubmitWaitsWhileTheQueueHoldsItsBound) {
  constexpr int kJobs = 20;
  constexpr size_t kJobBytes = 1000;
  OrderedWorker worker(2 * kJobBytes, 0);  // the running job and one more
  std::mutex mu;
  std::condition_variable submitted_changed;
  int submitted = 0;
  std::vector<int> submitted_when_started(kJobs, -1);
  const std::string bytes(kJobBytes, 'b');
  for (int i = 0; i < kJobs; ++i) {
    ASSERT_TRUE(worker
                    .Submit(Bytes(bytes),
                            [&, i](std::span<const uint8_t>) {
                              // Let the submitter get as far ahead as the bound allows, then
                              // record how far it got.
                              std::unique_lock lock(mu);
                              submitted_changed.wait(
                                  lock, [&] { return submitted >= std::min(i + 2, kJobs); });
                              submitted_when_started[i] = submitted;
                              return Status::Ok();
                            })
                    .ok());
    std::lock_guard lock(mu);
    ++submitted;
    submitted_changed.notify_all();
  }
  ASSERT_TRUE(worker.Drain().ok());
  for (int i = 0; i < kJobs; ++i) {
    EXPECT_EQ(submitted_when_started[i], std::min(i + 2, kJobs)) << "job " << i;
  }
}

TEST(OrderedWorker, AFailedJobStopsTheOnesAfterIt) {
  OrderedWorker worker(1 << 20, 0);
  int ran = 0;
  const std::string bytes = "x";
  auto job = [&ran](std::span<const uint8_t>) {
    ++ran;
    return ran == 3 ? Status::IoError("disk full") : Status::Ok();
  };
  Status status;
  for (int i = 0; i < 50 && status.ok(); ++i) status = worker.Submit(Bytes(bytes), job);
  const Status drained = worker.Drain();
  EXPECT_EQ(drained.code(), StatusCode::kIoError);
  EXPECT_NE(drained.message().find("disk full"), std::string::npos);
  EXPECT_EQ(ran, 3);
  EXPECT_EQ(worker.Submit(Bytes(bytes), job).code(), StatusCode::kIoError);
  EXPECT_EQ(ran, 3);
}

TEST(OrderedWorker, SmallJobsRunInlineOnlyWhenNothingIsQueued) {
  OrderedWorker worker(1 << 20, 100);
  const std::string small(10, 's'), large(1000, 'l');
  std::vector<std::pair<std::string, std::thread::id>> ran;  // job, thread
  auto job = [&ran](std::span<const uint8_t> bytes) {
    ran.emplace_back(std::string(bytes.begin(), bytes.end()).substr(0, 1),
                     std::this_thread::get_id());
    return Status::Ok();
  };
  ASSERT_TRUE(worker.Submit(Bytes(small), job).ok());
  ASSERT_EQ(ran.size(), 1u);  // ran before Submit returned
  EXPECT_EQ(ran[0].second, std::this_thread::get_id());

  // A large job holds the worker until released; a small one submitted meanwhile must wait
  // for it rather than run inline out of order.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ASSERT_TRUE(worker
                  .Submit(Bytes(large),
                          [&, released](std::span<const uint8_t> bytes) {
                            released.wait();
                            return job(bytes);
                          })
                  .ok());
  ASSERT_TRUE(worker.Submit(Bytes(small), job).ok());
  release.set_value();
  ASSERT_TRUE(worker.Drain().ok());
  ASSERT_EQ(ran.size(), 3u);
  EXPECT_EQ(ran[1].first, "l");
  EXPECT_EQ(ran[2].first, "s");
  EXPECT_NE(ran[1].second, std::this_thread::get_id());
  EXPECT_NE(ran[2].second, std::this_thread::get_id());
}

TEST(OrderedWorker, AJobsExceptionIsRethrownToTheOwner) {
  OrderedWorker worker(1 << 20, 0);
  const std::string bytes = "x";
  int ran = 0;
  auto job = [&ran](std::span<const uint8_t>) -> Status {
    if (++ran == 2) throw std::runtime_error("bug");
    return Status::Ok();
  };
  ASSERT_TRUE(worker.Submit(Bytes(bytes), job).ok());
  ASSERT_TRUE(worker.Submit(Bytes(bytes), job).ok());
  EXPECT_THROW((void)worker.Drain(), std::runtime_error);
  EXPECT_THROW((void)worker.Submit(Bytes(bytes), job), std::runtime_error);
  EXPECT_EQ(ran, 2);
}

}  // namespace
}  // namespace ckpt
