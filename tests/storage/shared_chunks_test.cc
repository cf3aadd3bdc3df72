// What the shared backends (RADOS, S3) build their chunk writes on (backends/shared_chunks.h):
// a model's write queue orders the writes of one name.
#include "backends/shared_chunks.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ckpt {
namespace {

// Writes that log when they start and when they are waited for.
class WriteLog {
 public:
  std::function<std::unique_ptr<ChunkStore::PendingPut>()> Start(const std::string& what,
                                                                 Status outcome = Status::Ok()) {
    return [this, what, outcome]() -> std::unique_ptr<ChunkStore::PendingPut> {
      events.push_back("start " + what);
      return std::make_unique<Pending>(this, what, outcome);
    };
  }
  std::vector<std::string> events;

 private:
  struct Pending : ChunkStore::PendingPut {
    Pending(WriteLog* owner, std::string name, Status result)
        : log(owner), what(std::move(name)), outcome(std::move(result)) {}
    Status Wait() override {
      log->events.push_back("wait " + what);
      return outcome;
    }
    WriteLog* log;
    std::string what;
    Status outcome;
  };
};

TEST(ChunkWriteQueue, AWriteOfANameInFlightEndsBeforeTheNameIsWrittenAgain) {
  ChunkWriteQueue queue(16);
  WriteLog log;
  ASSERT_TRUE(queue.Add("a", log.Start("a1")).ok());
  ASSERT_TRUE(queue.Add("b", log.Start("b1")).ok());
  ASSERT_TRUE(queue.Add("a", log.Start("a2")).ok());
  ASSERT_TRUE(queue.WaitAll().ok());
  EXPECT_EQ(log.events, (std::vector<std::string>{"start a1", "start b1", "wait a1", "start a2",
                                                  "wait b1", "wait a2"}));
}

TEST(ChunkWriteQueue, AFailedEarlierWriteOfTheNameIsReportedAndTheNextNotStarted) {
  ChunkWriteQueue queue(16);
  WriteLog log;
  ASSERT_TRUE(queue.Add("a", log.Start("a1", Status::Unavailable("store down"))).ok());
  EXPECT_EQ(queue.Add("a", log.Start("a2")).code(), StatusCode::kUnavailable);
  ASSERT_TRUE(queue.WaitAll().ok());
  EXPECT_EQ(log.events, (std::vector<std::string>{"start a1", "wait a1"}));
}

TEST(ChunkWriteQueue, BeyondTheLimitTheOldestWriteIsWaitedFor) {
  ChunkWriteQueue queue(2);
  WriteLog log;
  ASSERT_TRUE(queue.Add("a", log.Start("a")).ok());
  ASSERT_TRUE(queue.Add("b", log.Start("b")).ok());
  ASSERT_TRUE(queue.Add("c", log.Start("c")).ok());
  EXPECT_EQ(log.events, (std::vector<std::string>{"start a", "start b", "start c", "wait a"}));
  ASSERT_TRUE(queue.WaitAll().ok());
}

}  // namespace
}  // namespace ckpt
