// Faults of the file system under the store: writes, syncs, reads and renames that fail (no
// space, I/O errors) at many points of pushes, deletes, garbage collection and restores, and a
// free-space reserve. Each case asserts the status the operation returns, that its message
// names no file, that nothing acknowledged changed and nothing partial is visible, and that
// the store takes writes again once the fault is gone, without reopening.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/storage/checkpoint_store.h"
#include "faulty_file_system.h"
#include "store_fixture.h"
#include "store_open.h"
#include "test_support.h"

namespace ckpt::testing {
namespace {

using Op = FaultyFileSystem::Op;
using State = StoreHealthReport::State;

// What the failing call reports.
enum class FaultKind {
  kNoSpace,  // ENOSPC: writes resume once space is back
  kFatal,    // EIO: the store turns read-only until it is reopened (a restart)
};

// One place a fault is injected.
struct FaultPoint {
  Op op;
  uint64_t after_calls;
  FaultKind kind;
  const char* file_contains = "";
};

std::string PointName(const FaultPoint& p) {
  const char* op = p.op == Op::kWrite  ? "Write"
                   : p.op == Op::kSync ? "Sync"
                   : p.op == Op::kRead ? "Read"
                                       : "Rename";
  std::string file = p.file_contains;
  for (char& c : file) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  const char* kind = p.kind == FaultKind::kNoSpace ? "NoSpace" : "Eio";
  return std::string(op) + std::to_string(p.after_calls) + kind + file;
}

void PrintTo(const FaultPoint& p, std::ostream* os) { *os << PointName(p); }

FaultyFileSystem::Fault FaultAt(const FaultPoint& p) {
  FaultyFileSystem::Fault f;
  f.op = p.op;
  f.after_calls = p.after_calls;
  f.no_space = p.kind == FaultKind::kNoSpace;
  f.file_contains = p.file_contains;
  return f;
}

// The status a write that met the fault returns: 507's NoSpace for a full volume, an I/O
// error or "suspended" (503) for a failed write.
void ExpectFaultStatus(const Status& s, const FaultPoint& p) {
  if (p.kind == FaultKind::kNoSpace) {
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToLogString();
    EXPECT_EQ(s.subcode(), StatusSubcode::kNoSpace) << s.ToLogString();
  } else {
    EXPECT_TRUE(s.code() == StatusCode::kIoError || s.code() == StatusCode::kUnavailable)
        << s.ToLogString();
  }
}

std::vector<FaultPoint> Points(std::initializer_list<Op> ops, uint64_t calls,
                               const char* file = "") {
  std::vector<FaultPoint> points;
  for (Op op : ops) {
    for (uint64_t n = 0; n < calls; ++n) {
      for (FaultKind kind : {FaultKind::kNoSpace, FaultKind::kFatal}) {
        points.push_back({op, n, kind, file});
      }
    }
  }
  return points;
}

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::tie(fs_, env_) = FaultyFileSystem::NewEnv();
    Open();
  }

  StoreOptions Options(uint64_t min_free_bytes = 0) const {
    StoreOptions options;
    options.data_dir = dir_.str();
    options.chunk_bytes = chunk_bytes_;
    options.min_free_bytes = min_free_bytes;
    return options;
  }

  void Open(uint64_t min_free_bytes = 0) {
    store_.reset();
    auto opened = OpenStoreOn(Options(min_free_bytes), env_);
    ASSERT_TRUE(opened.ok()) << opened.status().ToLogString();
    store_ = std::move(opened).value();
  }

  Result<VersionInfo> Push(uint64_t version, const std::string& body,
                           std::optional<uint64_t> announced = std::nullopt) {
    CKPT_ASSIGN_OR_RETURN(auto session,
                          store_->BeginPush("m", version, announced ? announced : body.size()));
    for (size_t off = 0; off < body.size(); off += 4096) {
      CKPT_RETURN_IF_ERROR(session->Write(Bytes(std::string_view(body).substr(off, 4096))));
    }
    return session->Commit();
  }

  // A version of another model small enough that its commit does not seal its records into
  // files: they stay in the memtable, for a flush to write.
  void PushUnsealed() {
    const std::string body = DriftingModel(9, 4000).Next();
    auto session = store_->BeginPush("small", 1, body.size());
    ASSERT_TRUE(session.ok()) << session.status().ToLogString();
    ASSERT_TRUE((*session)->Write(Bytes(body)).ok());
    auto info = (*session)->Commit();
    ASSERT_TRUE(info.ok()) << info.status().ToLogString();
  }

  void PushAcknowledged(uint64_t version) {
    const std::string body = drift_.Next();
    auto info = Push(version, body);
    ASSERT_TRUE(info.ok()) << info.status().ToLogString();
    acknowledged_[version] = body;
  }

  Result<std::string> Restore(uint64_t version) {
    CKPT_ASSIGN_OR_RETURN(auto stream, store_->OpenRestore("m", version));
    std::string out;
    for (;;) {
      CKPT_ASSIGN_OR_RETURN(auto piece, stream->Next());
      if (piece.empty()) break;
      out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
    }
    return out;
  }

  // A client's message names no file or directory of the server.
  void ExpectNoServerPaths(const Status& s) {
    for (const std::string& leak :
         {dir_.str(), std::string(".sst"), std::string(".blob"), std::string(".log"),
          std::string("MANIFEST"), std::string("/")}) {
      EXPECT_EQ(s.message().find(leak), std::string::npos) << s.message();
    }
  }

  // Every acknowledged version is listed and restores to its pushed bytes; `maybe` (a version
  // whose push or deletion failed in its final sync, an outcome the store cannot know: the
  // record may have reached the log) may be there too, complete.
  void ExpectAcknowledgedIntact(std::optional<uint64_t> maybe = std::nullopt,
                                const std::string& maybe_body = {}) {
    auto versions = store_->ListVersions("m");
    ASSERT_TRUE(versions.ok()) << versions.status().ToLogString();
    std::map<uint64_t, std::string> expected = acknowledged_;
    for (const VersionInfo& v : *versions) {
      if (maybe && v.version == *maybe) expected[v.version] = maybe_body;
    }
    ASSERT_EQ(versions->size(), expected.size());
    for (const auto& [version, body] : expected) {
      auto restored = Restore(version);
      ASSERT_TRUE(restored.ok()) << "version " << version << ": "
                                 << restored.status().ToLogString();
      EXPECT_EQ(Sha256Hex(*restored), Sha256Hex(body)) << "version " << version;
    }
  }

  // Polls the store's health (which resumes the engine) until it takes writes again.
  void WaitWritable() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    StoreHealthReport health = store_->Health();
    while (health.state != State::kWritable && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      health = store_->Health();
    }
    ASSERT_EQ(health.state, State::kWritable) << health.reason;
  }

  // The fault is gone: the store takes writes again without reopening (after a fatal I/O error:
  // it serves reads read-only, and takes writes again once reopened), keeps every
  // acknowledged version, and reopens clean.
  void ExpectRecovery(std::optional<uint64_t> maybe = std::nullopt,
                      const std::string& maybe_body = {}, bool fatal = false) {
    fs_->Clear();
    if (fatal && store_->Health().state == State::kReadOnly) {
      const StoreHealthReport health = store_->Health();
      EXPECT_NE(health.reason.find("read-only"), std::string::npos) << health.reason;
      const Status refused = store_->DeleteVersion("m", acknowledged_.begin()->first);
      EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToLogString();
      ExpectNoServerPaths(refused);
      ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact(maybe, maybe_body));
      ASSERT_NO_FATAL_FAILURE(Open());
    }
    ASSERT_NO_FATAL_FAILURE(WaitWritable());
    ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact(maybe, maybe_body));
    ASSERT_NO_FATAL_FAILURE(PushAcknowledged(next_version_++));
    ASSERT_NO_FATAL_FAILURE(Open());
    ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact(maybe, maybe_body));
    auto scrub = store_->Scrub("m");
    ASSERT_TRUE(scrub.ok()) << scrub.status().ToLogString();
    EXPECT_TRUE(scrub->clean()) << ::testing::PrintToString(scrub->problems) << " orphaned chunks "
                                << scrub->orphaned_chunks << " orphaned manifests "
                                << scrub->orphaned_manifests;
  }

  // What a pass armed with the fault at `point` returned: the fault's status, naming no file.
  // Points in the log (".log") count the pass's commits: one past its last commit finds the
  // pass done, which must then have succeeded.
  template <typename T>
  void ExpectPassOutcome(const Result<T>& result, const FaultPoint& point) {
    if (*point.file_contains == '\0') {
      ASSERT_GT(fs_->failed(), 0u) << "the fault never fired";
    }
    if (fs_->failed() == 0) {
      ASSERT_TRUE(result.ok()) << result.status().ToLogString();
    }
    if (!result.ok()) {
      ExpectFaultStatus(result.status(), point);
      ExpectNoServerPaths(result.status());
    }
  }

  // As things stand, without reopening (which removes leftovers): no manifest that no version
  // needs, no chunk that no manifest owns.
  void ExpectNothingOrphaned() {
    auto scrub = store_->Scrub("m");
    ASSERT_TRUE(scrub.ok()) << scrub.status().ToLogString();
    EXPECT_EQ(scrub->orphaned_manifests, 0u);
    EXPECT_EQ(scrub->orphaned_chunks, 0u);
  }

  // A push that meets the fault at `point` fails cleanly (or succeeds), every acknowledged
  // version stays intact, and the store recovers.
  void PushWithFault(const FaultPoint& point) {
    for (uint64_t v = 1; v <= 3; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
    const std::string body = drift_.Next();
    fs_->Arm(FaultAt(point));
    auto pushed = Push(4, body);
    ASSERT_GT(fs_->failed(), 0u) << "the fault never fired";
    if (pushed.ok()) {
      acknowledged_[4] = body;
    } else {
      ExpectFaultStatus(pushed.status(), point);
      ExpectNoServerPaths(pushed.status());
    }
    // While the fault lasts: reads work and nothing partial is listed. A commit whose sync
    // failed may have reached the log: after recovery it is there complete, or not at all.
    ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact(4, body));
    ASSERT_NO_FATAL_FAILURE(ExpectRecovery(4, body, point.kind == FaultKind::kFatal));
  }

  // A deletion that meets the fault at `point` leaves the version whole or gone, and the store
  // recovers.
  void DeleteWithFault(const FaultPoint& point) {
    for (uint64_t v = 1; v <= 3; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
    fs_->Arm(FaultAt(point));
    const Status deleted = store_->DeleteVersion("m", 2);
    ASSERT_GT(fs_->failed(), 0u) << "the fault never fired";
    const std::string body2 = acknowledged_[2];
    if (deleted.ok()) {
      acknowledged_.erase(2);
    } else {
      ExpectFaultStatus(deleted, point);
      ExpectNoServerPaths(deleted);
      acknowledged_.erase(2);  // refused: still there, or gone if the batch reached the log
    }
    ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact(2, body2));
    ASSERT_NO_FATAL_FAILURE(ExpectRecovery(2, body2, point.kind == FaultKind::kFatal));
    // Retrying the deletion is safe either way.
    const Status retried = store_->DeleteVersion("m", 2);
    EXPECT_TRUE(retried.ok() || retried.code() == StatusCode::kNotFound) << retried.ToLogString();
    ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact());
  }

  // A background pass that met the fault at `point`: its outcome as the fault says, every
  // acknowledged version intact, nothing orphaned, and the store recovered.
  template <typename Report>
  void ExpectPassSurvived(const Result<Report>& result, const FaultPoint& point) {
    ASSERT_NO_FATAL_FAILURE(ExpectPassOutcome(result, point));
    ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact());
    ASSERT_NO_FATAL_FAILURE(ExpectNothingOrphaned());
    ASSERT_NO_FATAL_FAILURE(ExpectRecovery({}, {}, point.kind == FaultKind::kFatal));
  }

  // Garbage collection (rebases) meeting the fault at `point` keeps the kept versions, and
  // frees their space once the store recovered.
  void CollectWithFault(const FaultPoint& point) {
    for (uint64_t v = 1; v <= 4; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
    for (uint64_t v : {1, 2}) {
      ASSERT_TRUE(store_->DeleteVersion("m", v).ok());
      acknowledged_.erase(v);
    }
    GcOptions full;
    full.compaction = GcOptions::Compaction::kFull;
    fs_->Arm(FaultAt(point));
    ASSERT_NO_FATAL_FAILURE(ExpectPassSurvived(store_->CollectGarbage("m", full), point));
    auto again = store_->CollectGarbage("m", full);
    ASSERT_TRUE(again.ok()) << again.status().ToLogString();
    auto scrub = store_->Scrub("m");
    ASSERT_TRUE(scrub.ok());
    EXPECT_EQ(scrub->orphaned_manifests, 0u);
  }

  // The rearrangement of the latest version meeting the fault at `point` switches in wholly or
  // not at all, and leaves nothing orphaned.
  void RearrangeWithFault(const FaultPoint& point) {
    for (uint64_t v = 1; v <= 3; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
    fs_->Arm(FaultAt(point));
    ASSERT_NO_FATAL_FAILURE(ExpectPassSurvived(store_->RearrangeLatest("m", nullptr), point));
    auto again = store_->RearrangeLatest("m", nullptr);
    ASSERT_TRUE(again.ok()) << again.status().ToLogString();
    ASSERT_NO_FATAL_FAILURE(ExpectNothingOrphaned());
  }

  TempDir dir_;
  std::shared_ptr<FaultyFileSystem> fs_;
  std::shared_ptr<rocksdb::Env> env_;
  std::unique_ptr<CheckpointStore> store_;
  uint64_t chunk_bytes_ = 16 << 10;  // several chunk records per tensor
  DriftingModel drift_{7, 40000};    // ~160 KB of weights: ten chunk records
  std::map<uint64_t, std::string> acknowledged_;
  uint64_t next_version_ = 100;
};

class PushFaultTest : public FaultInjectionTest,
                      public ::testing::WithParamInterface<FaultPoint> {};

TEST_P(PushFaultTest, FailsCleanlyKeepsEveryAcknowledgedVersionAndRecovers) {
  ASSERT_NO_FATAL_FAILURE(PushWithFault(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Points, PushFaultTest, ::testing::ValuesIn([] {
                           auto points = Points({Op::kWrite}, 8);
                           for (const FaultPoint& p : Points({Op::kSync}, 1)) points.push_back(p);
                           return points;
                         }()),
                         [](const auto& point) { return PointName(point.param); });

class DeleteFaultTest : public FaultInjectionTest,
                        public ::testing::WithParamInterface<FaultPoint> {};

TEST_P(DeleteFaultTest, LeavesTheVersionWholeOrGoneAndRecovers) {
  ASSERT_NO_FATAL_FAILURE(DeleteWithFault(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Points, DeleteFaultTest,
                         ::testing::ValuesIn(Points({Op::kWrite, Op::kSync}, 1)),
                         [](const auto& point) { return PointName(point.param); });

// Chunk records of 64 KiB and more skip the write-ahead log (the flush before the commit makes
// them durable): the same faults with records that large, and a push after each recovery
// (ExpectRecovery) whose records must survive the reopen.
class LargeRecordFaultTest : public FaultInjectionTest,
                             public ::testing::WithParamInterface<FaultPoint> {
 protected:
  LargeRecordFaultTest() {
    chunk_bytes_ = 256 << 10;
    drift_ = DriftingModel(7, 200000);  // ~800 KB of weights: four records of ~200 KB
  }
};

class LargeRecordPushFaultTest : public LargeRecordFaultTest {};
class LargeRecordDeleteFaultTest : public LargeRecordFaultTest {};
class LargeRecordGcFaultTest : public LargeRecordFaultTest {};
class LargeRecordRearrangeFaultTest : public LargeRecordFaultTest {};

TEST_P(LargeRecordPushFaultTest, FailsCleanlyKeepsEveryAcknowledgedVersionAndRecovers) {
  ASSERT_NO_FATAL_FAILURE(PushWithFault(GetParam()));
}

TEST_P(LargeRecordDeleteFaultTest, LeavesTheVersionWholeOrGoneAndRecovers) {
  ASSERT_NO_FATAL_FAILURE(DeleteWithFault(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Points, LargeRecordPushFaultTest, ::testing::ValuesIn([] {
                           auto points = Points({Op::kWrite}, 4);
                           for (const FaultPoint& p : Points({Op::kSync}, 2)) points.push_back(p);
                           return points;
                         }()),
                         [](const auto& point) { return PointName(point.param); });

INSTANTIATE_TEST_SUITE_P(Points, LargeRecordDeleteFaultTest,
                         ::testing::ValuesIn(Points({Op::kWrite, Op::kSync}, 1)),
                         [](const auto& point) { return PointName(point.param); });

TEST_P(LargeRecordGcFaultTest, KeepsTheKeptVersionsAndFreesOnceRecovered) {
  ASSERT_NO_FATAL_FAILURE(CollectWithFault(GetParam()));
}

TEST_P(LargeRecordRearrangeFaultTest, SwitchesWhollyOrNotAtAllAndLeavesNothingOrphaned) {
  ASSERT_NO_FATAL_FAILURE(RearrangeWithFault(GetParam()));
}

// The first writes and syncs of the pass (its records, their flush) and its commit's.
std::vector<FaultPoint> LargeRecordPassPoints() {
  auto points = Points({Op::kWrite, Op::kSync}, 2);
  for (const FaultPoint& p : Points({Op::kSync}, 1, ".log")) points.push_back(p);
  return points;
}

INSTANTIATE_TEST_SUITE_P(Points, LargeRecordGcFaultTest,
                         ::testing::ValuesIn(LargeRecordPassPoints()),
                         [](const auto& point) { return PointName(point.param); });

INSTANTIATE_TEST_SUITE_P(Points, LargeRecordRearrangeFaultTest,
                         ::testing::ValuesIn(LargeRecordPassPoints()),
                         [](const auto& point) { return PointName(point.param); });

class GcFaultTest : public FaultInjectionTest, public ::testing::WithParamInterface<FaultPoint> {};

TEST_P(GcFaultTest, KeepsTheKeptVersionsAndFreesOnceRecovered) {
  ASSERT_NO_FATAL_FAILURE(CollectWithFault(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Points, GcFaultTest, ::testing::ValuesIn([] {
                           auto points = Points({Op::kWrite}, 4);
                           for (const FaultPoint& p : Points({Op::kSync}, 1)) points.push_back(p);
                           // The commits (a rebase's, a removal's).
                           for (const FaultPoint& p : Points({Op::kSync}, 3, ".log")) {
                             points.push_back(p);
                           }
                           return points;
                         }()),
                         [](const auto& point) { return PointName(point.param); });

// The rearrangement of the latest version (keyframes for it, reverse deltas for the one
// before) is switched in with the removal of what it replaces: whichever write or sync fails,
// the versions restore as pushed and nothing is left that no version needs, before any reopen
// (a scrub beside the pass sees the same).
class RearrangeFaultTest : public FaultInjectionTest,
                           public ::testing::WithParamInterface<FaultPoint> {};

TEST_P(RearrangeFaultTest, SwitchesWhollyOrNotAtAllAndLeavesNothingOrphaned) {
  ASSERT_NO_FATAL_FAILURE(RearrangeWithFault(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Points, RearrangeFaultTest, ::testing::ValuesIn([] {
                           auto points = Points({Op::kWrite, Op::kSync}, 3);
                           for (const FaultPoint& p : Points({Op::kSync}, 3, ".log")) {
                             points.push_back(p);
                           }
                           return points;
                         }()),
                         [](const auto& point) { return PointName(point.param); });

class RetentionFaultTest : public FaultInjectionTest,
                           public ::testing::WithParamInterface<FaultPoint> {};

TEST_P(RetentionFaultTest, KeepsWhatItKeepsAndDeletesWholeVersionsOrNone) {
  for (uint64_t v = 1; v <= 4; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
  const FaultPoint& point = GetParam();
  RetentionRun run;
  RetentionPolicy keep_two;
  keep_two.keep_last = 2;
  run.policy = keep_two;
  fs_->Arm(FaultAt(point));
  auto report = store_->ApplyRetention("m", run);
  ASSERT_GT(fs_->failed(), 0u) << "the fault never fired";
  if (!report.ok()) {
    ExpectFaultStatus(report.status(), point);
    ExpectNoServerPaths(report.status());
  }
  // Versions 3 and 4 are kept whatever happened; 1 and 2 are there whole or gone.
  const std::map<uint64_t, std::string> old = {{1, acknowledged_[1]}, {2, acknowledged_[2]}};
  acknowledged_.erase(1);
  acknowledged_.erase(2);
  fs_->Clear();
  if (store_->Health().state == State::kReadOnly) {
    ASSERT_NO_FATAL_FAILURE(Open());
  }
  ASSERT_NO_FATAL_FAILURE(WaitWritable());
  auto versions = store_->ListVersions("m");
  ASSERT_TRUE(versions.ok());
  for (const VersionInfo& v : *versions) {
    if (old.count(v.version)) acknowledged_[v.version] = old.at(v.version);
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRecovery());
  auto again = store_->ApplyRetention("m", run);
  ASSERT_TRUE(again.ok()) << again.status().ToLogString();
}

INSTANTIATE_TEST_SUITE_P(Points, RetentionFaultTest,
                         ::testing::ValuesIn(Points({Op::kWrite, Op::kSync}, 1)),
                         [](const auto& point) { return PointName(point.param); });

// Pushes whose writes fail once a number of bytes went to disk (a volume filling mid-push).
class PushBytesFaultTest : public FaultInjectionTest,
                           public ::testing::WithParamInterface<std::tuple<uint64_t, bool>> {};

TEST_P(PushBytesFaultTest, FailsCleanlyAfterThatManyBytes) {
  for (uint64_t v = 1; v <= 2; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
  const auto [after_bytes, no_space] = GetParam();
  FaultyFileSystem::Fault fault;
  fault.op = Op::kWrite;
  fault.after_bytes = after_bytes;
  fault.no_space = no_space;
  fs_->Arm(fault);
  const std::string body = drift_.Next();
  auto pushed = Push(3, body);
  ASSERT_GT(fs_->failed(), 0u) << "the fault never fired";
  ASSERT_FALSE(pushed.ok());
  ExpectFaultStatus(pushed.status(),
                    {Op::kWrite, 0, no_space ? FaultKind::kNoSpace : FaultKind::kFatal});
  ExpectNoServerPaths(pushed.status());
  ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact());
  ASSERT_NO_FATAL_FAILURE(ExpectRecovery({}, {}, !no_space));
}

INSTANTIATE_TEST_SUITE_P(Bytes, PushBytesFaultTest,
                         ::testing::Combine(::testing::Values(uint64_t{20000}, uint64_t{50000},
                                                              uint64_t{80000}),
                                            ::testing::Bool()),
                         [](const auto& p) {
                           return "After" + std::to_string(std::get<0>(p.param)) + "Bytes" +
                                  (std::get<1>(p.param) ? "NoSpace" : "Eio");
                         });

class RestoreFaultTest : public FaultInjectionTest,
                         public ::testing::WithParamInterface<uint64_t> {};

TEST_P(RestoreFaultTest, FailsWithAnIoErrorNeverWrongBytes) {
  for (uint64_t v = 1; v <= 3; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
  ASSERT_TRUE(store_->Flush().ok());
  ASSERT_NO_FATAL_FAILURE(Open());  // empty caches: the restore reads the files
  FaultyFileSystem::Fault fault;
  fault.op = Op::kRead;
  fault.after_calls = GetParam();
  fault.no_space = false;
  fs_->Arm(fault);
  auto restored = Restore(2);
  ASSERT_GT(fs_->failed(), 0u) << "the fault never fired";
  if (restored.ok()) {
    EXPECT_EQ(Sha256Hex(*restored), Sha256Hex(acknowledged_[2]));
  } else {
    EXPECT_TRUE(restored.status().code() == StatusCode::kIoError ||
                restored.status().code() == StatusCode::kDataLoss)
        << restored.status().ToLogString();
    ExpectNoServerPaths(restored.status());
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRecovery({}, {}, /*fatal=*/true));
}

INSTANTIATE_TEST_SUITE_P(Points, RestoreFaultTest, ::testing::Range<uint64_t>(0, 6));

class OpenFaultTest : public FaultInjectionTest,
                      public ::testing::WithParamInterface<FaultPoint> {};

TEST_P(OpenFaultTest, AFailedOpenChangesNothing) {
  for (uint64_t v = 1; v <= 2; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
  store_.reset();
  fs_->Arm(FaultAt(GetParam()));
  auto opened = OpenStoreOn(Options(), env_);
  ASSERT_GT(fs_->failed(), 0u) << "the fault never fired";
  if (opened.ok()) {
    store_ = std::move(opened).value();
  } else {
    ExpectNoServerPaths(opened.status());
  }
  fs_->Clear();
  if (!store_) {
    ASSERT_NO_FATAL_FAILURE(Open());
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRecovery());
}

INSTANTIATE_TEST_SUITE_P(Points, OpenFaultTest,
                         ::testing::Values(FaultPoint{Op::kRename, 0, FaultKind::kFatal},
                                           FaultPoint{Op::kRename, 1, FaultKind::kFatal},
                                           FaultPoint{Op::kRename, 0, FaultKind::kNoSpace},
                                           FaultPoint{Op::kSync, 0, FaultKind::kFatal, "MANIFEST"}),
                         [](const auto& point) { return PointName(point.param); });

TEST_F(FaultInjectionTest, AFailedFlushAfterAnAcknowledgedPushSuspendsWritesUntilSpaceReturns) {
  for (uint64_t v = 1; v <= 2; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
  ASSERT_NO_FATAL_FAILURE(PushUnsealed());
  FaultyFileSystem::Fault fault;
  fault.op = Op::kWrite;
  fault.file_contains = ".blob";
  fs_->Arm(fault);
  const Status flushed = store_->Flush();
  ASSERT_FALSE(flushed.ok());
  ExpectNoServerPaths(flushed);
  const StoreHealthReport health = store_->Health();
  EXPECT_EQ(health.state, State::kSuspended);
  EXPECT_NE(health.reason.find("ran out of space"), std::string::npos) << health.reason;
  EXPECT_GE(health.engine_errors, 1u);
  // Writes are refused with 507's status while the volume is full; reads work.
  auto refused = Push(3, drift_.Next());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().subcode(), StatusSubcode::kNoSpace) << refused.status().ToLogString();
  ExpectNoServerPaths(refused.status());
  const Status delete_refused = store_->DeleteVersion("m", 1);
  EXPECT_EQ(delete_refused.subcode(), StatusSubcode::kNoSpace) << delete_refused.ToLogString();
  ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact());
  // Space back: the engine resumes in this store, without a reopen.
  fs_->Clear();
  ASSERT_NO_FATAL_FAILURE(WaitWritable());
  EXPECT_GE(store_->Health().recoveries, 1u);
  ASSERT_NO_FATAL_FAILURE(ExpectRecovery());
}

// A retryable I/O error (what a remote file system reports for a timeout) in the write-ahead
// log: RocksDB cannot write that log again, so the store turns read-only until reopened.
TEST_F(FaultInjectionTest, ARetryableLogWriteErrorMakesTheStoreReadOnlyUntilReopened) {
  for (uint64_t v = 1; v <= 2; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
  FaultyFileSystem::Fault fault;
  fault.op = Op::kWrite;
  fault.no_space = false;
  fault.retryable = true;
  fault.file_contains = ".log";
  fs_->Arm(fault);
  const std::string body = drift_.Next();
  auto refused = Push(3, body);
  ASSERT_FALSE(refused.ok());
  ExpectNoServerPaths(refused.status());
  fs_->Clear();
  EXPECT_EQ(store_->Health().state, State::kReadOnly);
  ASSERT_NO_FATAL_FAILURE(ExpectRecovery(3, body, /*fatal=*/true));
}

// The same in a flush (a blob file): RocksDB retries the flush itself, and writes are taken
// again (or never stopped) once the error stops.
TEST_F(FaultInjectionTest, ARetryableFlushErrorLeavesTheStoreWritable) {
  for (uint64_t v = 1; v <= 2; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));
  ASSERT_NO_FATAL_FAILURE(PushUnsealed());
  FaultyFileSystem::Fault fault;
  fault.op = Op::kWrite;
  fault.no_space = false;
  fault.retryable = true;
  fault.file_contains = ".blob";
  fs_->Arm(fault);
  const Status flushed = store_->Flush();
  EXPECT_FALSE(flushed.ok());
  ExpectNoServerPaths(flushed);
  const StoreHealthReport health = store_->Health();
  EXPECT_NE(health.state, State::kReadOnly) << health.reason;
  const std::string body = drift_.Next();
  auto pushed = Push(3, body);
  if (pushed.ok()) {
    acknowledged_[3] = body;
  } else {
    EXPECT_EQ(pushed.status().code(), StatusCode::kUnavailable) << pushed.status().ToLogString();
    ExpectNoServerPaths(pushed.status());
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRecovery());
}

TEST_F(FaultInjectionTest, TheReserveRefusesPushesAndLeavesDeletesGcAndReadsWorking) {
  constexpr uint64_t kReserve = 64ull << 20;
  ASSERT_NO_FATAL_FAILURE(Open(kReserve));
  for (uint64_t v = 1; v <= 3; ++v) ASSERT_NO_FATAL_FAILURE(PushAcknowledged(v));

  // Room for the reserve and a little more: a push announcing more is refused up front.
  fs_->SetFreeSpace(kReserve + (1 << 20));
  const std::string body = drift_.Next();
  auto begin = store_->BeginPush("m", 4, 2 << 20);
  ASSERT_FALSE(begin.ok());
  EXPECT_EQ(begin.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(begin.status().subcode(), StatusSubcode::kNoSpace);
  EXPECT_NE(begin.status().message().find("storage.min_free_bytes"), std::string::npos);
  ExpectNoServerPaths(begin.status());
  EXPECT_EQ(store_->Health().state, State::kWritable);  // above the reserve still
  // A body of unknown size is cut off once the volume reaches the reserve.
  {
    auto session = store_->BeginPush("m", 4, std::nullopt);
    ASSERT_TRUE(session.ok()) << session.status().ToLogString();
    fs_->SetFreeSpace(kReserve - 1);
    Status written = Status::Ok();
    const std::string big =
        Serialize({{"big", DType::kU8, {16 << 20}, std::string(16 << 20, 'x')}});
    for (size_t off = 0; off < big.size() && written.ok(); off += 1 << 20) {
      written = (*session)->Write(Bytes(std::string_view(big).substr(off, 1 << 20)));
    }
    EXPECT_EQ(written.subcode(), StatusSubcode::kNoSpace) << written.ToLogString();
  }
  const StoreHealthReport health = store_->Health();
  EXPECT_EQ(health.state, State::kReserveReached);
  // The volume's free bytes: the records of a push given up are not spoken for.
  EXPECT_EQ(health.free_bytes, kReserve - 1);
  EXPECT_EQ(health.reserved_bytes, kReserve);
  ExpectNoServerPaths(Status::Unavailable(health.reason));

  // Inside the reserve: deletes, tags, policies, GC and reads work.
  ASSERT_TRUE(store_->SetTag("m", "best", 3).ok());
  ASSERT_TRUE(store_->RemoveTag("m", "best").ok());
  ASSERT_TRUE(store_->SetPolicy("m", CodecPolicy{}).ok());
  ASSERT_TRUE(store_->DeleteVersion("m", 1).ok());
  acknowledged_.erase(1);
  auto gc = store_->CollectGarbage("m", GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status().ToLogString();
  ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact());
  EXPECT_EQ(store_->RearrangeLatest("m", nullptr).status().subcode(), StatusSubcode::kNoSpace);

  // Space back: pushes are taken again.
  fs_->SetFreeSpace(std::nullopt);
  EXPECT_EQ(store_->Health().state, State::kWritable);
  auto pushed = Push(4, body);
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToLogString();
  acknowledged_[4] = body;
  ASSERT_NO_FATAL_FAILURE(ExpectAcknowledgedIntact());
}

// Records of 64 KiB and more wait in memtables for the flush before their commit, and count
// against the reserve meanwhile; a push given up gives their space back at once (its records
// never reach the volume), not at the next flush.
class LargeRecordReserveTest : public FaultInjectionTest {
 protected:
  LargeRecordReserveTest() { chunk_bytes_ = 256 << 10; }
};

TEST_F(LargeRecordReserveTest, APushGivenUpGivesBackTheSpaceItsRecordsHeld) {
  constexpr uint64_t kReserve = 64ull << 20;
  ASSERT_NO_FATAL_FAILURE(Open(kReserve));
  constexpr uint64_t kFree = kReserve + (256ull << 20);
  fs_->SetFreeSpace(kFree);
  std::mt19937_64 rng(5);
  const std::string noise = RandomBytes(rng, 8 << 20);  // incompressible: 32 records of 256 KiB
  const std::string body = Serialize({{"noise", DType::kU8, {noise.size()}, noise}});
  {
    auto session = store_->BeginPush("m", 1, body.size());
    ASSERT_TRUE(session.ok()) << session.status().ToLogString();
    // All but the last chunk's bytes: the push is given up before its commit.
    const std::string_view sent = std::string_view(body).substr(0, body.size() - (1 << 20));
    for (size_t off = 0; off < sent.size(); off += 1 << 20) {
      ASSERT_TRUE((*session)->Write(Bytes(sent.substr(off, 1 << 20))).ok());
    }
    // Meanwhile they count against it (the encoders hold at most a few chunks back).
    EXPECT_LE(store_->Health().free_bytes, kFree - (4 << 20));
  }
  EXPECT_EQ(store_->Health().free_bytes, kFree);
  // A push of the same size then fits as it did.
  auto pushed = Push(1, body);
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToLogString();
  EXPECT_EQ(store_->Health().free_bytes, kFree);  // flushed by its commit
}

}  // namespace
}  // namespace ckpt::testing
