// WorkerPool: with one thread, jobs run in order, each on its own copy of the bytes; the queue
// stays within its byte bound; a failed job stops the ones after it. With more threads, jobs
// run at the same time and Drain waits for all of them.
#include "write/worker_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
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

TEST(WorkerPool, RunsJobsInOrderOnCopiesOfTheirBytes) {
  WorkerPool worker(1, 1 << 20, 0);
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

TEST(WorkerPool, SubmitWaitsWhileTheQueueHoldsItsBound) {
  constexpr int kJobs = 20;
  constexpr size_t kJobBytes = 1000;
  WorkerPool worker(1, 2 * kJobBytes, 0);  // the running job and one more
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

TEST(WorkerPool, AFailedJobStopsTheOnesAfterIt) {
  WorkerPool worker(1, 1 << 20, 0);
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

TEST(WorkerPool, SmallJobsRunInlineOnlyWhenNothingIsQueued) {
  WorkerPool worker(1, 1 << 20, 100);
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

TEST(WorkerPool, AJobsExceptionIsRethrownToTheOwner) {
  WorkerPool worker(1, 1 << 20, 0);
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

// Two threads: the second job starts while the first still runs (the first waits for it, so
// with one thread this would never finish; the wait is bounded so that a failure is a failed
// expectation, not a hang). Both see their own bytes; Drain returns once both finished.
TEST(WorkerPool, JobsRunConcurrentlyOnSeveralThreads) {
  WorkerPool pool(2, 1 << 20, 0);
  std::mutex mu;
  std::condition_variable changed;
  bool second_started = false;
  bool first_saw_second = false;
  std::vector<std::string> seen(2);
  const std::string first = "first", second = "second";
  ASSERT_TRUE(pool.Submit(Bytes(first),
                          [&](std::span<const uint8_t> bytes) {
                            std::unique_lock lock(mu);
                            first_saw_second = changed.wait_for(lock, std::chrono::seconds(30),
                                                                [&] { return second_started; });
                            seen[0].assign(bytes.begin(), bytes.end());
                            return Status::Ok();
                          })
                  .ok());
  ASSERT_TRUE(pool.Submit(Bytes(second),
                          [&](std::span<const uint8_t> bytes) {
                            std::lock_guard lock(mu);
                            second_started = true;
                            seen[1].assign(bytes.begin(), bytes.end());
                            changed.notify_all();
                            return Status::Ok();
                          })
                  .ok());
  ASSERT_TRUE(pool.Drain().ok());
  EXPECT_TRUE(first_saw_second);
  EXPECT_EQ(seen[0], "first");
  EXPECT_EQ(seen[1], "second");
}

// Several threads: every job runs exactly once, never more at a time than there are threads,
// and after a failure no further job starts.
TEST(WorkerPool, SeveralThreadsRunEveryJobOnceAndStopAfterAFailure) {
  constexpr size_t kJobBytes = 100;
  WorkerPool pool(3, 4 * kJobBytes, 0);
  std::mutex mu;
  int running = 0, most_running = 0, ran = 0;
  const std::string bytes(kJobBytes, 'j');
  auto job = [&](std::span<const uint8_t>) {
    {
      std::lock_guard lock(mu);
      most_running = std::max(most_running, ++running);
    }
    std::this_thread::yield();
    std::lock_guard lock(mu);
    --running;
    ++ran;
    return Status::Ok();
  };
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(pool.Submit(Bytes(bytes), job).ok());
  ASSERT_TRUE(pool.Drain().ok());
  EXPECT_EQ(ran, 200);
  EXPECT_LE(most_running, 3);

  ASSERT_TRUE(
      pool.Submit(Bytes(bytes), [](std::span<const uint8_t>) { return Status::IoError("full"); })
          .ok());
  EXPECT_EQ(pool.Drain().code(), StatusCode::kIoError);
  const int before = ran;
  EXPECT_EQ(pool.Submit(Bytes(bytes), job).code(), StatusCode::kIoError);
  EXPECT_EQ(pool.Drain().code(), StatusCode::kIoError);
  EXPECT_EQ(ran, before);
}

}  // namespace
}  // namespace ckpt
