// The S3 client and chunk store against Ceph's S3 gateway (radosgw) on the one-node cluster:
// objects, ranges, listings, batch deletes, multipart uploads, the conditional writes the commit
// protocol rests on, and injected faults at every kind of failure the client retries.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/s3/s3_chunk_store.h"
#include "backends/s3/s3_client.h"
#include "ceph_cluster.h"
#include "store_fixture.h"
#include "store_open.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::CephCluster;

constexpr char kBucket[] = "ckptd-client-tests";

// Faults by request: the `attempts` first attempts of requests whose method and key match get
// `fault`.
class ScriptedFaults : public S3FaultInjector {
 public:
  void Set(std::string method, std::string key_prefix, S3Fault fault, int attempts) {
    std::lock_guard lock(mu_);
    rule_ = {std::move(method), std::move(key_prefix), fault, attempts};
    injected_ = 0;
  }
  void Clear() { Set("", "\x01", S3Fault::kNone, 0); }
  int injected() {
    std::lock_guard lock(mu_);
    return injected_;
  }

  S3Fault Next(std::string_view method, std::string_view key, int attempt) override {
    std::lock_guard lock(mu_);
    if (method != rule_.method || !key.starts_with(rule_.key_prefix) || attempt >= rule_.attempts) {
      return S3Fault::kNone;
    }
    ++injected_;
    return rule_.fault;
  }

 private:
  struct Rule {
    std::string method;
    std::string key_prefix = "\x01";
    S3Fault fault = S3Fault::kNone;
    int attempts = 0;
  };
  std::mutex mu_;
  Rule rule_;
  int injected_ = 0;
};

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPT_REQUIRE_S3_GATEWAY();
    ASSERT_TRUE(CephCluster::Get().CreateBucket(kBucket));
    options_.endpoint = CephCluster::Get().Gateway();
    options_.bucket = kBucket;
    options_.prefix =
        std::string("t-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    options_.access_key = CephCluster::kS3AccessKey;
    options_.secret_key = CephCluster::kS3SecretKey;
    options_.attempts = 4;
    faults_ = std::make_shared<ScriptedFaults>();
    client_ = std::make_unique<S3Client>(options_, faults_);
  }

  S3Options options_;
  std::shared_ptr<ScriptedFaults> faults_;
  std::unique_ptr<S3Client> client_;
};

TEST_F(S3ClientTest, ObjectsRoundTripWithRangesListingsAndBatchDeletes) {
  std::string bytes(70000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + 7);
  auto etag = client_->Put("dir/a b+c", bytes);
  ASSERT_TRUE(etag.ok()) << etag.status().ToString();
  auto whole = client_->Get("dir/a b+c");
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->body, bytes);
  EXPECT_EQ(whole->etag, *etag);
  auto range = client_->Get("dir/a b+c", 1000, 500);
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  EXPECT_EQ(range->body, bytes.substr(1000, 500));
  EXPECT_EQ(client_->Get("dir/missing").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(client_->Delete("dir/missing").ok()) << "deleting nothing is fine";

  // Listings page through continuation tokens and group by a delimiter.
  std::vector<std::string> keys;
  for (int i = 0; i < 25; ++i) keys.push_back("many/" + std::to_string(100 + i));
  for (const std::string& key : keys) ASSERT_TRUE(client_->Put(key, key).ok());
  std::vector<std::string> paged;
  std::string token;
  int pages = 0;
  do {
    auto page = client_->ListPage("many/", "", 10, token);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    for (const auto& object : page->objects) paged.push_back(object.key);
    token = page->truncated ? page->next_continuation_token : "";
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(paged, keys);
  EXPECT_EQ(pages, 3);
  auto grouped = client_->ListPage("", "", 0, "", "/");
  ASSERT_TRUE(grouped.ok()) << grouped.status().ToString();
  EXPECT_EQ(grouped->common_prefixes, (std::vector<std::string>{"dir/", "many/"}));

  ASSERT_TRUE(client_->DeleteMany(keys).ok());
  auto left = client_->ListAll("many/");
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
}

TEST_F(S3ClientTest, LargeObjectsGoAsMultipartUploads) {
  S3Options options = options_;
  options.part_bytes = 5 << 20;  // S3's smallest part
  S3Client client(options);
  std::string bytes(11 << 20, '\0');
  for (size_t i = 0; i < bytes.size(); i += 4096) bytes[i] = static_cast<char>(i >> 12);
  const uint64_t before = client.requests();
  ASSERT_TRUE(client.Put("big", bytes).ok());
  EXPECT_EQ(client.requests() - before, 5u) << "begin, 3 parts, complete";
  auto read = client.Get("big");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(read->body == bytes);
}

// What the commit protocol rests on, on this server: a create loses to an existing object, a
// swap to a changed one, and the probe finds how the server wants If-Match.
TEST_F(S3ClientTest, ConditionalWritesHoldAndTheProbeAcceptsTheServer) {
  ASSERT_TRUE(client_->Probe().ok());
  S3Condition create;
  create.if_none_match = true;
  auto first = client_->Put("c", "one", create);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(client_->Put("c", "two", create).status().code(), StatusCode::kFailedPrecondition);
  S3Condition swap;
  swap.if_match = *first;
  auto second = client_->Put("c", "three", swap);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(client_->Put("c", "four", swap).status().code(), StatusCode::kFailedPrecondition)
      << "the ETag it matched is gone";
  EXPECT_EQ(client_->Get("c")->body, "three");

  // Two writers racing to create one key: exactly one wins, every time.
  for (int round = 0; round < 20; ++round) {
    const std::string key = "race/" + std::to_string(round);
    std::atomic<int> won{0};
    std::vector<std::thread> writers;
    for (int w = 0; w < 2; ++w) {
      writers.emplace_back([&, w] {
        if (client_->Put(key, "writer " + std::to_string(w), create).ok()) ++won;
      });
    }
    for (auto& t : writers) t.join();
    EXPECT_EQ(won.load(), 1) << key;
  }
}

TEST_F(S3ClientTest, TransientFaultsAreRetriedWithinTheBudget) {
  ASSERT_TRUE(client_->Put("f/base", "base").ok());
  struct Case {
    const char* method;
    S3Fault fault;
    const char* name;
  };
  const std::vector<Case> cases = {
      {"PUT", S3Fault::kSlowDown, "503 SlowDown"},
      {"PUT", S3Fault::kInternalError, "500"},
      {"PUT", S3Fault::kTimeout, "timeout"},
      {"PUT", S3Fault::kReset, "reset"},
      {"PUT", S3Fault::kLostAnswer, "lost answer"},
      {"GET", S3Fault::kSlowDown, "503 SlowDown"},
      {"GET", S3Fault::kInternalError, "500"},
      {"GET", S3Fault::kTimeout, "timeout"},
      {"GET", S3Fault::kReset, "reset"},
      {"GET", S3Fault::kShortBody, "short body"},
      {"GET", S3Fault::kLostAnswer, "lost answer"},
      {"DELETE", S3Fault::kSlowDown, "503"},
      {"DELETE", S3Fault::kReset, "reset"},
      {"DELETE", S3Fault::kLostAnswer, "lost"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.method) + " " + c.name);
    faults_->Set(c.method, "f/", c.fault, options_.attempts - 1);  // the last attempt passes
    Status s;
    if (std::string(c.method) == "PUT") {
      s = client_->Put("f/put", "value").status();
    } else if (std::string(c.method) == "GET") {
      auto read = client_->Get("f/base");
      s = read.status();
      if (read.ok()) {
        EXPECT_EQ(read->body, "base");
      }
    } else {
      s = client_->Delete("f/put");
    }
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(faults_->injected(), static_cast<int>(options_.attempts) - 1);
  }
  // Past the budget: Unavailable, naming the store and the last error.
  faults_->Set("GET", "f/", S3Fault::kSlowDown, 100);
  auto exhausted = client_->Get("f/base");
  EXPECT_EQ(exhausted.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(exhausted.status().message().find("unavailable"), std::string::npos);
  EXPECT_NE(exhausted.status().message().find("SlowDown"), std::string::npos)
      << exhausted.status().ToString();
  // A lost race is no transient fault: 412 at once.
  faults_->Set("PUT", "f/", S3Fault::kPreconditionLost, 1);
  EXPECT_EQ(client_->Put("f/put", "x").status().code(), StatusCode::kFailedPrecondition);
  faults_->Clear();
  EXPECT_TRUE(client_->Get("f/base").ok()) << "the client recovers when the store does";
}

TEST_F(S3ClientTest, BadCredentialsAndMissingBucketsSayWhatWithoutTheSecret) {
  S3Options wrong = options_;
  wrong.secret_key = "not-the-secret-key";
  S3Client denied(wrong);
  auto r = denied.Get("x");
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  EXPECT_EQ(r.status().message().find(wrong.secret_key), std::string::npos);
  S3Options missing = options_;
  missing.bucket = "no-such-bucket-here";
  S3Client nowhere(missing);
  auto probed = nowhere.Probe();
  EXPECT_EQ(probed.code(), StatusCode::kFailedPrecondition) << probed.ToString();
  EXPECT_NE(probed.message().find("'no-such-bucket-here' does not exist"), std::string::npos)
      << probed.ToString();
}

TEST_F(S3ClientTest, TheChunkStoreWritesManyAtOnceAndReadsThemBack) {
  auto store = NewS3ChunkStore(client_.get());
  std::vector<std::unique_ptr<ChunkStore::PendingPut>> writes;
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) {
    names.push_back("chunks/" + std::to_string(i % 4) + "/m/" + std::to_string(i));
    writes.push_back(store->PutAsync(names.back(), std::string(1000 + i, static_cast<char>(i))));
  }
  for (auto& w : writes) ASSERT_TRUE(w->Wait().ok());
  auto all = store->GetAll(names);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  for (int i = 0; i < 40; ++i) EXPECT_EQ((*all)[i], std::string(1000 + i, static_cast<char>(i)));
  auto listed = store->List("chunks/1/m/");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 10u);
  ASSERT_TRUE(store->DeleteAll(names).ok());
  EXPECT_EQ(store->Get(names[0]).status().code(), StatusCode::kNotFound);
}

// Fails every attempt of one request of the ones that follow Arm (the `index`-th, counted by
// their first attempts) with `fault`.
class OneRequestFaults : public S3FaultInjector {
 public:
  void Arm(int index, S3Fault fault) {
    std::lock_guard lock(mu_);
    index_ = index;
    fault_ = fault;
    seen_ = 0;
    hit_ = false;
  }
  void Disarm() { Arm(-1, S3Fault::kNone); }
  bool hit() {
    std::lock_guard lock(mu_);
    return hit_;
  }
  S3Fault Next(std::string_view, std::string_view, int attempt) override {
    std::lock_guard lock(mu_);
    if (index_ < 0) return S3Fault::kNone;
    if (attempt == 0) ++seen_;
    if (seen_ - 1 != index_) return S3Fault::kNone;
    hit_ = true;
    return fault_;
  }

 private:
  std::mutex mu_;
  int index_ = -1;
  S3Fault fault_ = S3Fault::kNone;
  int seen_ = 0;
  bool hit_ = false;
};

// A store on S3 whose requests fail, one at a time, at every request a push makes (chunk writes,
// the commit, lease and log reads), with each kind of fault: a push either is acknowledged and
// restores exactly, or fails with a clear status; a version that exists restores to what was
// pushed; the latest never goes backwards; and the next push succeeds without a restart.
TEST(S3StoreFaultTest, AFaultAtAnyRequestOfAPushLosesNothingAcknowledged) {
  CKPT_REQUIRE_S3_GATEWAY();
  ASSERT_TRUE(CephCluster::Get().CreateBucket(kBucket));
  testing::TempDir dir;
  StoreOptions options;
  options.data_dir = dir.str();
  options.chunk_bytes = 16384;
  options.min_free_bytes = 0;
  S3Options s3;
  s3.endpoint = CephCluster::Get().Gateway();
  s3.bucket = kBucket;
  s3.prefix = "t-store-faults";
  s3.access_key = CephCluster::kS3AccessKey;
  s3.secret_key = CephCluster::kS3SecretKey;
  s3.attempts = 2;
  s3.advertise_url = "http://127.0.0.1:1";
  s3.pack_bytes = 1;  // a pack per record: a push makes a request per record, each a fault point
  options.s3 = s3;
  auto faults = std::make_shared<OneRequestFaults>();
  auto opened = OpenStoreOn(options, nullptr, faults);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<CheckpointStore> store = std::move(opened).value();

  testing::DriftingModel drift(5, 20000);
  auto push = [&](uint64_t version, const std::string& body) -> Result<VersionInfo> {
    CKPT_ASSIGN_OR_RETURN(auto session, store->BeginPush("m", version, body.size()));
    CKPT_RETURN_IF_ERROR(session->Write(testing::Bytes(body)));
    return session->Commit();
  };
  auto restore = [&](uint64_t version) -> Result<std::string> {
    CKPT_ASSIGN_OR_RETURN(auto stream, store->OpenRestore("m", version));
    return testing::ReadAll(*stream);
  };
  std::map<uint64_t, std::string> pushed;
  uint64_t version = 1;
  pushed[version] = drift.Next();
  ASSERT_TRUE(push(version, pushed[version]).ok());

  const std::vector<S3Fault> kinds = {
      S3Fault::kSlowDown,  S3Fault::kTimeout,          S3Fault::kLostAnswer,
      S3Fault::kShortBody, S3Fault::kPreconditionLost, S3Fault::kInternalError,
      S3Fault::kReset};
  int points = 0;
  uint64_t latest = version;
  for (int index = 0;; ++index) {
    const S3Fault fault = kinds[index % kinds.size()];
    SCOPED_TRACE("request " + std::to_string(index) + ", fault " +
                 std::to_string(static_cast<int>(fault)));
    const std::string body = drift.Next();
    ++version;
    faults->Arm(index, fault);
    auto result = push(version, body);
    const bool hit = faults->hit();
    faults->Disarm();
    if (!hit) {
      ASSERT_TRUE(result.ok()) << result.status().ToString();
      pushed[version] = body;
      latest = version;
      break;  // past the push's last request
    }
    ++points;
    if (result.ok()) {
      pushed[version] = body;
      latest = version;
    } else {
      // A lost race is refused as such (412 cannot come from a plain chunk write of a real
      // store; injected there, it is answered like one).
      EXPECT_TRUE(result.status().code() == StatusCode::kUnavailable ||
                  result.status().code() == StatusCode::kIoError ||
                  (fault == S3Fault::kPreconditionLost &&
                   result.status().code() == StatusCode::kFailedPrecondition))
          << result.status().ToString();
      EXPECT_EQ(result.status().message().find(s3.secret_key), std::string::npos);
    }
    // Whatever the outcome, the store recovers: the next push is acknowledged.
    const std::string next = drift.Next();
    ++version;
    auto recovered = push(version, next);
    ASSERT_TRUE(recovered.ok()) << recovered.status().ToString();
    pushed[version] = next;
    // A version the failed push left behind (its commit landed, its answer did not) is the
    // pushed body; the latest is the last acknowledged one.
    auto info = store->GetModel("m");
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->latest_version, version);
    latest = version;
    if (!result.ok()) {
      auto left = restore(version - 1);
      if (left.ok()) {
        EXPECT_TRUE(left.value() == body) << "version " << version - 1;
      }
    }
  }
  std::cout << "faults injected at " << points << " requests of a push\n";
  EXPECT_GE(points, 5) << "a push makes at least this many requests";
  for (const auto& [v, body] : pushed) {
    auto restored = restore(v);
    ASSERT_TRUE(restored.ok()) << "version " << v << ": " << restored.status().ToString();
    EXPECT_TRUE(*restored == body) << "version " << v;
  }
  EXPECT_EQ(latest, version);
}

// A writer killed (SIGKILL) at its commit: just before the commit's log entry is sent, or right
// after the store applied it and before the writer learned so. Either way nothing acknowledged is
// lost and nothing is half visible: the version is absent (its chunks orphans that garbage
// collection removes) or whole; the next writer takes the model over once the lease lapses.
class S3StoreCrashTest : public ::testing::TestWithParam<bool> {};

// Kills its process at the first commit (a PUT of a log entry) after Arm(): before it is sent,
// or (`after_applied`) once the store answered it.
class KillAtCommit : public S3FaultInjector {
 public:
  explicit KillAtCommit(bool after_applied) : after_applied_(after_applied) {}
  void Arm() { armed_ = true; }
  S3Fault Next(std::string_view method, std::string_view key, int) override {
    if (!after_applied_ && IsCommit(method, key)) raise(SIGKILL);
    return S3Fault::kNone;
  }
  void Answered(std::string_view method, std::string_view key, long status) override {
    if (after_applied_ && IsCommit(method, key) && status == 200) raise(SIGKILL);
  }

 private:
  bool IsCommit(std::string_view method, std::string_view key) const {
    return armed_ && method == "PUT" && key.find("/log/") != std::string_view::npos;
  }
  const bool after_applied_;
  std::atomic<bool> armed_{false};
};

TEST_P(S3StoreCrashTest, AWriterKilledAtItsCommitLosesNothingAndLeavesNothingHalfVisible) {
  CKPT_REQUIRE_S3_GATEWAY();
  ASSERT_TRUE(CephCluster::Get().CreateBucket(kBucket));
  const bool after_applied = GetParam();
  testing::TempDir dir;
  StoreOptions options;
  options.data_dir = dir.str() + "/first";
  options.chunk_bytes = 16384;
  options.min_free_bytes = 0;
  S3Options s3;
  s3.endpoint = CephCluster::Get().Gateway();
  s3.bucket = kBucket;
  s3.prefix = after_applied ? "t-killed-after-commit" : "t-killed-before-commit";
  s3.access_key = CephCluster::kS3AccessKey;
  s3.secret_key = CephCluster::kS3SecretKey;
  s3.lease = std::chrono::milliseconds(1500);
  options.s3 = s3;
  auto push = [](CheckpointStore& store, uint64_t version, const std::string& body,
                 KillAtCommit* kill = nullptr) -> Result<VersionInfo> {
    CKPT_ASSIGN_OR_RETURN(auto session, store.BeginPush("m", version, body.size()));
    CKPT_RETURN_IF_ERROR(session->Write(testing::Bytes(body)));
    if (kill != nullptr) kill->Arm();
    return session->Commit();
  };
  testing::DriftingModel drift(8, 20000);
  const std::string v1 = drift.Next(), v2 = drift.Next(), v3 = drift.Next();
  {
    auto store = CheckpointStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE(push(**store, 1, v1).ok());
  }

  // The writer: a process of its own with a data directory of its own, killed at its commit.
  const pid_t writer = fork();
  ASSERT_GE(writer, 0);
  if (writer == 0) {
    StoreOptions own = options;
    own.data_dir = dir.str() + "/writer";
    auto kill = std::make_shared<KillAtCommit>(after_applied);
    auto store = OpenStoreOn(own, nullptr, kill);
    if (!store.ok()) _exit(2);
    (void)push(**store, 2, v2, kill.get());
    _exit(3);  // the commit returned: the kill point was never reached
  }
  int status = 0;
  ASSERT_EQ(waitpid(writer, &status, 0), writer);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "writer status " << status;

  auto reopened = CheckpointStore::Open(options);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  CheckpointStore& store = **reopened;
  // The next push is accepted once the killed writer's lease lapsed.
  const auto killed = std::chrono::steady_clock::now();
  auto pushed = push(store, 3, v3);
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       !pushed.ok() && pushed.status().code() == StatusCode::kUnavailable &&
       std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pushed = push(store, 3, v3);
  }
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  std::cout << "pushed after the kill in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count()
            << " s (lease " << s3.lease.count() / 1000.0 << " s)\n";

  std::map<uint64_t, std::string> expected = {{1, v1}, {3, v3}};
  if (after_applied) expected[2] = v2;  // its commit landed: the version is whole
  auto versions = store.ListVersions("m");
  ASSERT_TRUE(versions.ok()) << versions.status().ToString();
  std::vector<uint64_t> listed;
  for (const VersionInfo& v : *versions) listed.push_back(v.version);
  EXPECT_EQ(listed.size(), expected.size());
  for (const auto& [version, body] : expected) {
    auto stream = store.OpenRestore("m", version);
    ASSERT_TRUE(stream.ok()) << "version " << version << ": " << stream.status().ToString();
    auto restored = testing::ReadAll(**stream);
    ASSERT_TRUE(restored.ok()) << "version " << version << ": " << restored.status().ToString();
    EXPECT_TRUE(*restored == body) << "version " << version;
  }
  if (!after_applied) {
    EXPECT_EQ(store.GetVersion("m", 2).status().code(), StatusCode::kNotFound);
  }
  // The killed writer's chunks that no commit refers to are orphans; garbage collection removes
  // them and the store scrubs clean.
  auto scrub = store.Scrub("m");
  ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
  if (!after_applied) {
    EXPECT_GT(scrub->orphaned_chunks, 0u);
  }
  auto gc = store.CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->orphan_chunks_removed, scrub->orphaned_chunks);
  scrub = store.Scrub("m");
  ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
  EXPECT_TRUE(scrub->clean()) << scrub->orphaned_chunks << " orphaned chunks, "
                              << scrub->damaged_versions.size() << " damaged versions";
}

// Counts the requests for chunk objects (records of their own and packs), by method.
class ChunkRequestCounter : public S3FaultInjector {
 public:
  S3Fault Next(std::string_view method, std::string_view key, int) override {
    if (key.find("chunks/") != std::string_view::npos) {
      std::lock_guard lock(mu_);
      ++counts_[std::string(method)];
    }
    return S3Fault::kNone;
  }
  uint64_t Take(const std::string& method) {
    std::lock_guard lock(mu_);
    return std::exchange(counts_[method], 0);
  }

 private:
  std::mutex mu_;
  std::map<std::string, uint64_t> counts_;
};

// Packs: a push of many chunk records writes a few objects, a restore reads a few ranges, and a
// bucket written an object per record (pack_bytes = 0) stays readable, scrubbable and
// collectable by daemons that pack, the two layouts side by side.
TEST(S3PackTest, PushesWriteFewObjectsAndBucketsOfSingleRecordsStayReadable) {
  CKPT_REQUIRE_S3_GATEWAY();
  ASSERT_TRUE(CephCluster::Get().CreateBucket(kBucket));
  testing::TempDir dir;
  StoreOptions options;
  options.data_dir = dir.str() + "/writer";
  options.chunk_bytes = 4096;
  options.min_free_bytes = 0;
  S3Options s3;
  s3.endpoint = CephCluster::Get().Gateway();
  s3.bucket = kBucket;
  s3.prefix = "t-packs";
  s3.access_key = CephCluster::kS3AccessKey;
  s3.secret_key = CephCluster::kS3SecretKey;
  s3.lease = std::chrono::milliseconds(2000);
  s3.advertise_url = "http://127.0.0.1:1";
  s3.pack_bytes = 0;
  options.s3 = s3;
  auto push = [](CheckpointStore& store, uint64_t version, const std::string& body) {
    auto session = store.BeginPush("m", version, body.size());
    ASSERT_TRUE(session.ok()) << session.status().ToString();
    ASSERT_TRUE((*session)->Write(testing::Bytes(body)).ok());
    auto committed = (*session)->Commit();
    ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  };
  auto restores = [](CheckpointStore& store, uint64_t version, const std::string& body) {
    auto stream = store.OpenRestore("m", version);
    ASSERT_TRUE(stream.ok()) << "version " << version << ": " << stream.status().ToString();
    auto restored = testing::ReadAll(**stream);
    ASSERT_TRUE(restored.ok()) << "version " << version << ": " << restored.status().ToString();
    EXPECT_TRUE(*restored == body) << "version " << version;
  };
  testing::DriftingModel drift(21, 20000);  // 20 chunks of weights and 5 small tensors
  std::map<uint64_t, std::string> bodies;
  for (uint64_t v = 1; v <= 6; ++v) bodies[v] = drift.Next();

  auto counter = std::make_shared<ChunkRequestCounter>();
  // Pushes versions [first, last] through a store of `options`: the chunk object PUTs of the
  // last push.
  auto pushes = [&](uint64_t first, uint64_t last) -> uint64_t {
    auto opened = OpenStoreOn(options, nullptr, counter);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    if (!opened.ok()) return 0;
    for (uint64_t v = first; v <= last; ++v) {
      counter->Take("PUT");
      push(**opened, v, bodies[v]);
    }
    return counter->Take("PUT");
  };
  const uint64_t single_puts = pushes(1, 3);
  options.s3->pack_bytes = S3Options().pack_bytes;
  const uint64_t packed_puts = pushes(4, 6);
  std::cout << "chunk object PUTs of a push: " << single_puts << " an object per record, "
            << packed_puts << " packed\n";
  EXPECT_GE(single_puts, 20u) << "a record per object";
  EXPECT_LE(packed_puts, 2u) << "the push's records in one pack (and a rearrangement's)";

  // Another daemon reads both layouts; a restore of the packed latest reads a few ranges.
  StoreOptions reader_options = options;
  reader_options.data_dir = dir.str() + "/reader";
  auto reader = OpenStoreOn(reader_options, nullptr, counter);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_TRUE((*reader)->GetModel("m").ok());
  counter->Take("GET");
  restores(**reader, 6, bodies[6]);
  const uint64_t restore_gets = counter->Take("GET");
  std::cout << "chunk object GETs of a restore of the latest: " << restore_gets << "\n";
  EXPECT_LE(restore_gets, 3u);
  for (const auto& [v, body] : bodies) restores(**reader, v, body);
  reader->reset();

  // The writer scrubs both layouts clean, and retention across them keeps what it keeps.
  auto store = OpenStoreOn(options, nullptr, counter);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto scrub = (*store)->Scrub("m");
  ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
  EXPECT_TRUE(scrub->clean()) << scrub->orphaned_chunks << " orphaned chunks";
  EXPECT_GE(scrub->chunks_checked, 6u * 25u / 2) << "records of both layouts";
  for (uint64_t v = 1; v <= 4; ++v) ASSERT_TRUE((*store)->DeleteVersion("m", v).ok());
  auto gc = (*store)->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  for (uint64_t v = 5; v <= 6; ++v) restores(**store, v, bodies[v]);
  scrub = (*store)->Scrub("m");
  ASSERT_TRUE(scrub.ok()) << scrub.status().ToString();
  EXPECT_TRUE(scrub->clean()) << scrub->orphaned_chunks << " orphaned chunks";
}

std::string KillPointName(const ::testing::TestParamInfo<bool>& point) {
  return point.param ? "AfterTheStoreAppliedIt" : "BeforeItWasSent";
}
INSTANTIATE_TEST_SUITE_P(S3KilledAt, S3StoreCrashTest, ::testing::Bool(), KillPointName);

}  // namespace
}  // namespace ckpt
