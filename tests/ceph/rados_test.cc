// RADOS against a real one-node Ceph cluster started for this suite (scripts/ceph-one-node.sh,
// loopback, temporary directory, torn down by PID): the primitives the scale-out design builds
// on — whole-object writes and reads, an omap-guarded write that applies nothing when its guard
// fails (commit fencing by lease epoch), exclusive locks that expire (write ownership by lease)
// — the RADOS chunk store and the upload spool in the pool. Skipped with a message when Ceph is not
// installed.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <rados/librados.hpp>
#include <string>
#include <thread>

#include "backends/chunk_store.h"               // internal: the RADOS chunk store
#include "backends/rados/rados_upload_spool.h"  // internal: the spool in the pool
#include "ceph_cluster.h"
#include "test_support.h"

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;

librados::bufferlist Bytes(const std::string& s) {
  librados::bufferlist bl;
  bl.append(s);
  return bl;
}

class RadosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CKPT_REQUIRE_CEPH_CLUSTER();
    ASSERT_NO_FATAL_FAILURE(Connect(&cluster_, &io_));
  }

  void TearDown() override {
    io_.close();
    cluster_.shutdown();
  }

  static void Connect(librados::Rados* cluster, librados::IoCtx* io) {
    testing::CephCluster::Get().Connect(cluster, io);
  }

  librados::Rados cluster_;
  librados::IoCtx io_;
};

TEST_F(RadosTest, WholeObjectsRoundTrip) {
  std::cout << "one-node cluster writable after " << testing::CephCluster::Get().start_seconds()
            << " s\n";
  std::string payload(8 << 20, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 2654435761u >> 13);
  librados::bufferlist written = Bytes(payload);
  ASSERT_EQ(io_.write_full("model/m/chunk/1", written), 0);
  librados::bufferlist read;
  ASSERT_EQ(io_.read("model/m/chunk/1", read, payload.size() + 1, 0),
            static_cast<int>(payload.size()));
  EXPECT_EQ(read.to_str(), payload);
  uint64_t size = 0;
  time_t mtime = 0;
  ASSERT_EQ(io_.stat("model/m/chunk/1", &size, &mtime), 0);
  EXPECT_EQ(size, payload.size());
  EXPECT_EQ(io_.remove("model/m/chunk/1"), 0);
  EXPECT_EQ(io_.stat("model/m/chunk/1", &size, &mtime), -ENOENT);
}

// A commit guarded by the lease epoch: the guard and the write are one operation, so a stale
// owner's commit changes nothing.
TEST_F(RadosTest, OmapGuardedWriteAppliesNothingWhenTheGuardFails) {
  const std::string oid = "model/fenced";
  ASSERT_EQ(io_.omap_set(oid, {{"epoch", Bytes("7")}, {"latest", Bytes("100")}}), 0);

  auto commit = [&](const std::string& epoch, const std::string& latest) {
    librados::ObjectWriteOperation op;
    int guard = 0;
    op.omap_cmp({{"epoch", {Bytes(epoch), LIBRADOS_CMPXATTR_OP_EQ}}}, &guard);
    op.omap_set({{"latest", Bytes(latest)}});
    return io_.operate(oid, &op);
  };
  EXPECT_EQ(commit("6", "200"), -ECANCELED);  // a stale epoch: refused
  std::map<std::string, librados::bufferlist> values;
  ASSERT_EQ(io_.omap_get_vals_by_keys(oid, {"latest"}, &values), 0);
  EXPECT_EQ(values["latest"].to_str(), "100");  // nothing applied
  EXPECT_EQ(commit("7", "200"), 0);
  values.clear();
  ASSERT_EQ(io_.omap_get_vals_by_keys(oid, {"latest"}, &values), 0);
  EXPECT_EQ(values["latest"].to_str(), "200");
}

// Write ownership: an exclusive lock with a duration is refused to others while it lasts and
// can be taken once it expires without being renewed (the owner died).
TEST_F(RadosTest, ExclusiveLocksExpire) {
  librados::Rados other_cluster;
  librados::IoCtx other;
  ASSERT_NO_FATAL_FAILURE(Connect(&other_cluster, &other));
  const std::string oid = "model/leased";
  librados::bufferlist lease = Bytes("lease");
  ASSERT_EQ(io_.write_full(oid, lease), 0);
  timeval duration{1, 0};
  ASSERT_EQ(io_.lock_exclusive(oid, "owner", "node-a", "", &duration, 0), 0);
  const auto taken = Clock::now();
  EXPECT_EQ(other.lock_exclusive(oid, "owner", "node-b", "", &duration, 0), -EBUSY);
  // The owner renews while alive.
  EXPECT_EQ(io_.lock_exclusive(oid, "owner", "node-a", "", &duration, LIBRADOS_LOCK_FLAG_RENEW), 0);
  // Node B polls until the unrenewed lease expires (bounded: 10 s).
  int r = -EBUSY;
  while (r == -EBUSY && Clock::now() - taken < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r = other.lock_exclusive(oid, "owner", "node-b", "", &duration, 0);
  }
  EXPECT_EQ(r, 0);
  EXPECT_GE(Clock::now() - taken, std::chrono::seconds(1));
  // Node A's renewal now fails: it has lost the lease.
  EXPECT_NE(
      io_.lock_exclusive(oid, "owner", "node-a", "", &duration, LIBRADOS_LOCK_FLAG_MUST_RENEW), 0);
  other.close();
  other_cluster.shutdown();
}

TEST_F(RadosTest, ChunkStorePutGetListDelete) {
  RadosChunkStoreOptions options;
  options.conf_file = testing::CephCluster::Get().conf_file();
  auto store = OpenRadosChunkStore(options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ChunkStore& chunks = **store;
  std::string big(5 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 40503u >> 7);
  ASSERT_TRUE(chunks.Put("m1/0000000001.1/0/0", big).ok());
  ASSERT_TRUE(chunks.Put("m1/0000000001.1/1/0", "").ok());  // an empty chunk is an object too
  ASSERT_TRUE(chunks.Put("m10/0000000001.1/0/0", "other model").ok());
  auto read = chunks.Get("m1/0000000001.1/0/0");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, big);
  EXPECT_EQ(chunks.Get("m1/0000000001.1/1/0").value(), "");
  // A retried write of the same name and bytes is harmless.
  ASSERT_TRUE(chunks.Put("m1/0000000001.1/0/0", big).ok());
  EXPECT_EQ(chunks.Get("m1/0000000001.1/0/0").value(), big);

  auto listed = chunks.List("m1/");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  std::sort(listed->begin(), listed->end());
  EXPECT_EQ(*listed, (std::vector<std::string>{"m1/0000000001.1/0/0", "m1/0000000001.1/1/0"}));

  EXPECT_EQ(chunks.Get("m1/missing").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(chunks.Delete("m1/0000000001.1/0/0").ok());
  EXPECT_TRUE(chunks.Delete("m1/0000000001.1/0/0").ok());  // idempotent
  EXPECT_EQ(chunks.Get("m1/0000000001.1/0/0").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(chunks.List("m1/")->size(), 1u);

  // Bulk removal (concurrent in RADOS): every name, present or not.
  std::vector<std::string> many;
  for (int i = 0; i < 150; ++i) {
    many.push_back("bulk/" + std::to_string(i));
    if (i % 3 != 0) {
      ASSERT_TRUE(chunks.Put(many.back(), std::to_string(i)).ok());
    }
  }
  EXPECT_EQ(chunks.List("bulk/")->size(), 100u);
  ASSERT_TRUE(chunks.DeleteAll(many).ok());
  EXPECT_TRUE(chunks.List("bulk/")->empty());
}

TEST_F(RadosTest, ChunkStoreOpenFailuresNameTheStep) {
  RadosChunkStoreOptions options;
  options.conf_file = testing::CephCluster::Get().conf_file();
  options.pool = "no-such-pool";
  auto store = OpenRadosChunkStore(options);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("opening pool 'no-such-pool'"), std::string::npos)
      << store.status().ToString();
  options.conf_file = "/nonexistent/ckptd-test/missing.conf";
  auto unread = OpenRadosChunkStore(options);
  ASSERT_FALSE(unread.ok());
  EXPECT_NE(unread.status().message().find("reading"), std::string::npos);
}

// The upload spool in the pool: a shard is published whole or not at all, never while a commit
// reads the upload, reads back across its pieces, and goes with its upload (every attempt's
// pieces, begun or published, and the index entry).
TEST_F(RadosTest, UploadSpoolPublishesShardsOutsideCommitsAndRemovesEveryAttempt) {
  io_.set_namespace("upload-spool");
  auto spool = NewRadosUploadSpool(io_);
  ASSERT_TRUE(spool->shared());
  UploadRecord record{"m", 7, 2, 1000};
  ASSERT_TRUE(spool->Create(record).ok());
  // A second daemon creating the same upload gets the first one's record.
  auto again = spool->Create(UploadRecord{"m", 7, 3, 2000});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->shard_count, 2u);
  EXPECT_EQ(again->created_at_ms, 1000);

  // Over one 64 MiB piece: reads cross the boundary.
  std::string body((64u << 20) + 4096, '\0');
  uint64_t x = 88172645463325252ull;
  for (char& c : body) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  auto writer = spool->NewShardWriter("m", 7, 0);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  auto span = [](const std::string& s) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  ASSERT_TRUE((*writer)->Append(span(body)).ok());
  ASSERT_TRUE((*writer)->Seal(std::string(64, 'a')).ok());
  // Two commits begin (the second takes the mark over, as a new writer's does); the first one's
  // end leaves the second's mark, which refuses the shard until it ends.
  auto first = spool->BeginCommit("m", 7);
  auto second = spool->BeginCommit("m", 7);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(*first, *second);
  spool->EndCommit("m", 7, *first);
  Status refused = (*writer)->Publish();
  EXPECT_EQ(refused.code(), StatusCode::kAborted) << refused.ToString();
  EXPECT_TRUE(spool->Shards("m", 7)->empty());
  spool->EndCommit("m", 7, *second);
  ASSERT_TRUE((*writer)->Publish().ok());
  auto shards = spool->Shards("m", 7);
  ASSERT_TRUE(shards.ok() && shards->size() == 1u);
  EXPECT_EQ((*shards)[0].body_bytes, body.size());
  EXPECT_EQ((*shards)[0].attempt, (*writer)->attempt());
  auto file = spool->OpenShard("m", 7, (*shards)[0]);
  ASSERT_TRUE(file.ok());
  std::string back(body.size(), '\0');
  ASSERT_TRUE((*file)->ReadAt(0, {reinterpret_cast<uint8_t*>(back.data()), back.size()}).ok());
  EXPECT_TRUE(back == body);
  const uint64_t at = (64u << 20) - 4096;
  std::string window(8192, '\0');
  ASSERT_TRUE((*file)->ReadAt(at, {reinterpret_cast<uint8_t*>(window.data()), window.size()}).ok());
  EXPECT_TRUE(window == body.substr(at, window.size()));

  // An attempt begun and abandoned (its daemon killed: the writer is never destroyed) is
  // removed with the upload.
  auto abandoned = spool->NewShardWriter("m", 7, 1);
  ASSERT_TRUE(abandoned.ok());
  ASSERT_TRUE((*abandoned)->Append(span(std::string(9u << 20, 'x'))).ok());
  auto listed = spool->List();
  ASSERT_TRUE(listed.ok() && listed->size() == 1u);
  ASSERT_TRUE(spool->Remove("m", 7).ok());
  EXPECT_FALSE(spool->Find("m", 7)->has_value());
  EXPECT_TRUE(spool->List()->empty());
  size_t left = 0;
  for (auto it = io_.nobjects_begin(); it != io_.nobjects_end(); ++it) ++left;
  EXPECT_EQ(left, 1u) << "only the (empty) index stays";
  // Its writer, once gone, publishes nothing and leaves nothing.
  EXPECT_EQ((*abandoned)->Publish().code(), StatusCode::kNotFound);
  abandoned->reset();
  left = 0;
  for (auto it = io_.nobjects_begin(); it != io_.nobjects_end(); ++it) ++left;
  EXPECT_EQ(left, 1u);
}

}  // namespace
}  // namespace ckpt
