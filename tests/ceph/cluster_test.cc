// Scale-out: real ckptd daemons sharing one store, either one pool of a real one-node Ceph
// cluster (each test in its own RADOS namespace) or one bucket of its S3 gateway (each test under
// its own key prefix): the same suite runs on both backends. Any daemon restores any model; writes
// go through the lease holder (307 elsewhere); a killed owner's models are taken over once its
// lease expires; a paused owner that lost its lease cannot commit; lossy models keep their bound
// across owners; a daemon with an empty data directory serves everything from the cluster; a reader
// daemon caches what it restores, and a model deleted and pushed again is never served from that
// cache; a sharded version commits on the writer and is one version to every daemon.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <rados/librados.hpp>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backends/s3/s3_client.h"
#include "backends/s3/s3_metadata_log.h"
#include "ceph_cluster.h"
#include "ckpt/base/hashing.h"
#include "ckpt/base/tensor_slices.h"
#include "ckpt/client/client.h"
#include "ckpt/codec/coding_plan.h"
#include "ckpt/codec/edge_encoder.h"
#include "ckpt/codec/encoded_body.h"
#include "daemon_process.h"
#include "raw_http.h"
#include "store_fixture.h"
#include "test_support.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::CephCluster;
using testing::DaemonProcess;
using testing::DriftingModel;
using testing::RawHttp;
using testing::Request;
using testing::Sha256Hex;
using testing::TempDir;
using Clock = std::chrono::steady_clock;

constexpr double kLeaseSeconds = 3;

// Where the daemons of a test keep the store.
enum class Backend { kRados, kS3 };
constexpr char kBucket[] = "ckptd-tests";

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  return info.param == Backend::kRados ? "Rados" : "S3";
}

// The S3 options of a test's store: the gateway's bucket, under the test's prefix.
S3Options TestS3Options(const std::string& prefix) {
  S3Options s3;
  s3.endpoint = CephCluster::Get().Gateway();
  s3.bucket = kBucket;
  s3.prefix = prefix;
  s3.access_key = CephCluster::kS3AccessKey;
  s3.secret_key = CephCluster::kS3SecretKey;
  return s3;
}

// The config section that puts a daemon's store on `backend`, in `place` (a RADOS namespace or
// an S3 key prefix).
std::string StoreSection(Backend backend, const std::string& place, const std::string& url) {
  std::ostringstream out;
  if (backend == Backend::kRados) {
    out << "[cluster]\nceph_conf = \"" << CephCluster::Get().conf_file() << "\"\npool = \""
        << CephCluster::kPool << "\"\nnamespace = \"" << place << "\"\n";
  } else {
    out << "[s3]\nendpoint = \"" << CephCluster::Get().Gateway() << "\"\nbucket = \"" << kBucket
        << "\"\nprefix = \"" << place << "\"\naccess_key = \"" << CephCluster::kS3AccessKey
        << "\"\nsecret_key = \"" << CephCluster::kS3SecretKey
        << "\"\n"
        // Small packs: a push writes packs before its commit, as a large model's does.
        << "pack_bytes = 16384\n";
  }
  out << "lease_seconds = " << kLeaseSeconds << "\nadvertise_url = \"" << url << "\"\n";
  return out.str();
}

// One ckptd of the deployment under test: its own directory, a fixed port (so that its
// advertised URL is known before it starts), the shared store.
struct Node {
  // `rearrange_latest`: whether the node rearranges models' latest versions after pushes (off
  // by default: the tests that count chunk objects or cached links need a store that changes
  // only when they push).
  Node(const std::string& name, Backend backend, const std::string& place,
       bool rearrange_latest = false)
      : port(testing::FreePort()), url("http://127.0.0.1:" + std::to_string(port)) {
    std::filesystem::create_directories(dir.path() / name);
    const auto config = dir.path() / "ckptd.toml";
    // Small network reads, so that a partly sent body is consumed (and its chunks written) as
    // it arrives.
    std::ofstream(config) << "[server]\nio_buffer_bytes = 4096\n"
                          << "[storage]\nchunk_bytes = 16384\nrearrange_latest = "
                          << (rearrange_latest ? "true" : "false") << "\n"
                          << "[retention]\ninterval_seconds = 0\nafter_push = false\n"
                          << StoreSection(backend, place, url);
    process = std::make_unique<DaemonProcess>(
        CKPTD_BINARY, dir.path(), std::vector<std::string>{"--config", config.string()});
    process->set_listen("127.0.0.1:" + std::to_string(port));
    process->set_log_level("info");
  }

  TempDir dir;
  uint16_t port;
  std::string url;
  std::unique_ptr<DaemonProcess> process;
};

class ClusterTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kS3) {
      CKPT_REQUIRE_S3_GATEWAY();
      ASSERT_TRUE(CephCluster::Get().CreateBucket(kBucket));
    } else {
      CKPT_REQUIRE_CEPH_CLUSTER();
    }
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    // The test's name without the backend's suffix.
    const std::string name = info->name();
    namespace_ = "t-" + name.substr(0, name.find('/'));
    a_ = std::make_unique<Node>("a", GetParam(), namespace_);
    b_ = std::make_unique<Node>("b", GetParam(), namespace_);
    ASSERT_TRUE(a_->process->Start()) << a_->process->log();
    ASSERT_TRUE(b_->process->Start()) << b_->process->log();
    if (GetParam() == Backend::kS3) {
      s3_ = std::make_unique<S3Client>(TestS3Options(namespace_));
    } else {
      ASSERT_NO_FATAL_FAILURE(CephCluster::Get().Connect(&cluster_, &io_, namespace_));
    }
  }

  void TearDown() override {
    for (Node* node : {a_.get(), b_.get()}) {
      if (node && node->process->pid() > 0) kill(node->process->pid(), SIGCONT);
      if (HasFailure() && node) std::cerr << "---- ckptd log ----\n" << node->process->log();
    }
    if (GetParam() == Backend::kRados) {
      io_.close();
      cluster_.shutdown();
    }
  }

  static std::string VersionPath(const std::string& model, uint64_t version) {
    return "/v1/models/" + model + "/versions/" + std::to_string(version);
  }

  // Every version in `digests` restores through `node` to its SHA-256 (`where` names the case).
  void ExpectRestores(const Node& node, const std::string& model,
                      const std::map<uint64_t, std::string>& digests, const std::string& where) {
    for (const auto& [v, digest] : digests) {
      auto r = Request(node.port, "GET", VersionPath(model, v));
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(Sha256Hex(r.body), digest) << "version " << v << where;
    }
  }

  // `node`'s ckptd_restore_links_decoded_total.
  static double LinksDecoded(const Node& node) {
    const std::string metrics = Request(node.port, "GET", "/metrics").body;
    const std::string series = "\nckptd_restore_links_decoded_total ";
    const size_t at = metrics.find(series);
    EXPECT_NE(at, std::string::npos) << metrics;
    return at == std::string::npos ? -1 : std::stod(metrics.substr(at + series.size()));
  }

  // Replaces daemon B by one with an empty data directory (what a new node starts with).
  void ReplaceBWithAnEmptyDisk() {
    ASSERT_EQ(b_->process->Stop(), 0);
    std::filesystem::remove_all(b_->process->data_dir());
    ASSERT_TRUE(b_->process->Start()) << b_->process->log();
  }

  // The chunk objects of `model` in this test's store.
  size_t ChunkObjects(const std::string& model) {
    size_t n = 0;
    if (GetParam() == Backend::kS3) {
      auto listed = s3_->ListAll("chunks/");
      EXPECT_TRUE(listed.ok()) << listed.status().ToString();
      if (!listed.ok()) return 0;
      for (const auto& object : *listed) {
        // chunks/<h>/<model>/...
        if (object.key.substr(9).starts_with(model + "/")) ++n;
      }
      return n;
    }
    const std::string prefix = "chunk/" + model + "/";
    for (auto it = io_.nobjects_begin(); it != io_.nobjects_end(); ++it) {
      if (it->get_oid().starts_with(prefix)) ++n;
    }
    return n;
  }

  // Pushes through `node` until it is accepted (a takeover waits for the lease to expire):
  // returns the final response and how long it took. Redirects are not followed: a redirect to
  // `dead_url` counts as "not yet".
  testing::RawResponse PushUntilAccepted(Node& node, const std::string& target,
                                         const std::string& body, double* seconds) {
    const auto start = Clock::now();
    testing::RawResponse r;
    while (Clock::now() - start < std::chrono::seconds(30)) {
      r = Request(node.port, "PUT", target, body);
      if (r.status != 307 && r.status != 503) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // polling the lease
    }
    *seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return r;
  }

  // Runs `script` (saved as `name`) with Debian's Python: it must exit 0 and print "python ok".
  void ExpectPythonRuns(const std::string& name, const std::string& script) {
    const auto path = a_->dir.path() / name;
    std::ofstream(path) << script;
    const std::string output = (a_->dir.path() / "python.out").string();
    const int rc =
        std::system(("/usr/bin/python3 " + path.string() + " > " + output + " 2>&1").c_str());
    std::ifstream in(output);
    const std::string text((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(rc, 0) << text;
    EXPECT_NE(text.find("python ok"), std::string::npos) << text;
  }

  std::string namespace_;
  std::unique_ptr<Node> a_, b_;
  librados::Rados cluster_;  // a client of the test's own, to look at the pool (RADOS)
  librados::IoCtx io_;
  std::unique_ptr<S3Client> s3_;  // the same for the bucket (S3)
};

INSTANTIATE_TEST_SUITE_P(Backends, ClusterTest, ::testing::Values(Backend::kRados, Backend::kS3),
                         BackendName);

TEST_P(ClusterTest, AnyDaemonRestoresWritesRedirectToTheOwnerAndAnEmptyDiskServesEverything) {
  DriftingModel drift(7, 20000);
  std::map<uint64_t, std::string> sha;
  for (uint64_t v = 1; v <= 6; ++v) {
    const std::string body = drift.Next();
    auto r = Request(a_->port, "PUT", VersionPath("m", v * 10), body);
    ASSERT_EQ(r.status, 201) << r.body;
    sha[v * 10] = Sha256Hex(body);
  }
  auto tag = Request(a_->port, "PUT", "/v1/models/m/versions/30/tags/best");
  ASSERT_EQ(tag.status, 200) << tag.body;

  // Every version restores through B, bit-exact; listings and tags agree.
  ExpectRestores(*b_, "m", sha, " through B");
  auto latest = Request(b_->port, "GET", "/v1/models/m/versions/latest");
  EXPECT_EQ(Sha256Hex(latest.body), sha[60]);
  auto tagged = Request(b_->port, "GET", "/v1/models/m/versions/tag:best");
  EXPECT_EQ(Sha256Hex(tagged.body), sha[30]);
  auto models = json::parse(Request(b_->port, "GET", "/v1/models").body);
  ASSERT_EQ(models["models"].size(), 1u) << models.dump();
  EXPECT_EQ(models["models"][0]["version_count"], 6);

  // Writes sent to B go to A, the lease holder, before any body is read.
  const std::string next = drift.Next();
  auto redirected = Request(b_->port, "PUT", VersionPath("m", 70), next);
  EXPECT_EQ(redirected.status, 307) << redirected.body;
  EXPECT_EQ(redirected.headers["location"], a_->url + VersionPath("m", 70));
  auto policy = Request(b_->port, "PUT", "/v1/models/m/policy", R"({"mode":"lossless"})");
  EXPECT_EQ(policy.status, 307);
  EXPECT_EQ(Request(b_->port, "DELETE", VersionPath("m", 10)).status, 307);
  // A version pushed (and one deleted) through A is seen by B at once.
  ASSERT_EQ(Request(a_->port, "PUT", VersionPath("m", 70), next).status, 201);
  ASSERT_EQ(Request(a_->port, "DELETE", VersionPath("m", 20)).status, 204);
  sha[70] = Sha256Hex(next);
  sha.erase(20);
  EXPECT_EQ(Sha256Hex(Request(b_->port, "GET", "/v1/models/m/versions/latest").body), sha[70]);
  EXPECT_EQ(Request(b_->port, "GET", VersionPath("m", 20)).status, 404);
  // Models written through different daemons are listed by every daemon.
  for (const char* name : {"n1", "n2", "n3"}) {
    ASSERT_EQ(Request(b_->port, "PUT", VersionPath(name, 1), drift.Next()).status, 201);
  }
  for (uint16_t port : {a_->port, b_->port}) {
    auto all = json::parse(Request(port, "GET", "/v1/models").body);
    EXPECT_EQ(all["models"].size(), 4u) << all.dump();
  }
  for (const char* name : {"n1", "n2", "n3"}) {
    ASSERT_EQ(Request(b_->port, "DELETE", std::string("/v1/models/") + name).status, 204);
  }

  // A replacement node: B again, from an empty data directory.
  ASSERT_NO_FATAL_FAILURE(ReplaceBWithAnEmptyDisk());
  ExpectRestores(*b_, "m", sha, " from an empty disk");

  // A deleted model disappears everywhere; pushed again, it is listed everywhere again.
  ASSERT_EQ(Request(a_->port, "DELETE", "/v1/models/m").status, 204);
  EXPECT_EQ(Request(b_->port, "GET", "/v1/models/m").status, 404);
  EXPECT_TRUE(json::parse(Request(b_->port, "GET", "/v1/models").body)["models"].empty());
  const std::string again = drift.Next();
  ASSERT_EQ(Request(a_->port, "PUT", VersionPath("m", 5), again).status, 201);
  auto relisted = json::parse(Request(b_->port, "GET", "/v1/models").body);
  ASSERT_EQ(relisted["models"].size(), 1u) << relisted.dump();
  EXPECT_EQ(relisted["models"][0]["version_count"], 1);
  EXPECT_EQ(Sha256Hex(Request(b_->port, "GET", VersionPath("m", 5)).body), Sha256Hex(again));
}

// The C++ client (and so the CLI) and the Python client follow a write's redirect to the lease
// holder; the C++ client before sending any of the body (Expect: 100-continue).
TEST_P(ClusterTest, ClientsFollowRedirectsToTheWriter) {
  DriftingModel drift(5, 10000);
  const std::string first = drift.Next();
  ASSERT_EQ(Request(a_->port, "PUT", VersionPath("m", 1), first).status, 201);  // A writes m

  ClientOptions options;
  options.server = b_->url;
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  const std::string second = drift.Next();
  auto pushed = client->PushBuffer("m", 2, second);
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  EXPECT_EQ(pushed->version, 2u);
  auto policy = client->SetPolicy("m", R"({"mode":"lossless","keyframe_every":8})");
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  auto pulled = client->PullToBuffer("m", "2");
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  EXPECT_EQ(Sha256Hex(*pulled), Sha256Hex(second));
  EXPECT_NE(a_->process->log().find("PUT /v1/models/m/versions/2 status=201"), std::string::npos);
  EXPECT_NE(b_->process->log().find("PUT /v1/models/m/versions/2 status=307 in=0"),
            std::string::npos)
      << "the C++ client sent body bytes to the daemon that redirected";

  const std::string script = R"(
import sys
sys.path.insert(0, ")" + std::string(CKPT_PYTHON_CLIENT_DIR) +
                             R"(")
import numpy as np
from ckptd import Client
c = Client(")" + b_->url + R"(")
weights = {"w": np.arange(4096, dtype=np.float32)}
c.push("m", 3, weights)
c.tag("m", 3, "py")
back = c.pull("m", "tag:py", as_torch=False)
assert (back["w"] == weights["w"]).all()
print("python ok")
)";
  ExpectPythonRuns("redirect.py", script);
  EXPECT_NE(a_->process->log().find("PUT /v1/models/m/versions/3 status=201"), std::string::npos);
}

// A daemon that cannot reach its pool does not start, and says why.
TEST_P(ClusterTest, AMisconfiguredClusterStopsTheDaemonWithTheReason) {
  TempDir dir;
  const auto config = dir.path() / "ckptd.toml";
  std::string expected;
  if (GetParam() == Backend::kRados) {
    std::ofstream(config)
        << "[cluster]\nceph_conf = \"" << CephCluster::Get().conf_file()
        << "\"\npool = \"no-such-pool\"\nadvertise_url = \"http://127.0.0.1:1\"\n";
    expected = "opening pool 'no-such-pool'";
  } else {
    std::string section = StoreSection(GetParam(), "p", "http://127.0.0.1:1");
    section.replace(section.find(kBucket), std::string(kBucket).size(), "no-such-bucket");
    std::ofstream(config) << section;
    expected = "bucket 'no-such-bucket' does not exist";
  }
  DaemonProcess daemon(CKPTD_BINARY, dir.path(), {"--config", config.string()});
  EXPECT_FALSE(daemon.Start());
  EXPECT_NE(daemon.log().find(expected), std::string::npos) << daemon.log();
  EXPECT_EQ(daemon.log().find(CephCluster::kS3SecretKey), std::string::npos) << daemon.log();
}

// Formats are forever, and forward compatibility is refused loudly: a model object written with
// a newer layout is neither read nor taken over.
TEST_P(ClusterTest, AModelOfANewerLayoutIsRefused) {
  if (GetParam() == Backend::kS3) {
    // A log entry of a newer format heads the model's log.
    std::string entry = s3_layout::EncodeLogEntry({1, 1, "t", "", {}, {}});
    // The format, after the 8-byte magic (u32 big-endian).
    entry[11] = static_cast<char>(s3_layout::kFormatVersion + 1);
    entry.resize(entry.size() - 8);
    const uint64_t sum =
        Xxh3Checksum(std::span(reinterpret_cast<const uint8_t*>(entry.data()), entry.size()));
    for (int i = 7; i >= 0; --i) entry += static_cast<char>((sum >> (8 * i)) & 0xff);
    ASSERT_TRUE(s3_->Put(s3_layout::LogKey("future", 1), entry).ok());
  } else {
    auto u64 = [](uint64_t v) {
      librados::bufferlist bl;
      for (int i = 7; i >= 0; --i) bl.append(static_cast<char>((v >> (8 * i)) & 0xff));
      return bl;
    };
    ASSERT_EQ(io_.omap_set("model.future", {{std::string("\001layout"), u64(2)},
                                            {std::string("\001generation"), u64(1)},
                                            {std::string("\001epoch"), u64(1)}}),
              0);
  }
  auto read = Request(b_->port, "GET", "/v1/models/future");
  EXPECT_EQ(read.status, 409) << read.body;
  EXPECT_NE(read.body.find("newer ckptd"), std::string::npos) << read.body;
  auto write = Request(a_->port, "PUT", "/v1/models/future/policy", R"({"mode":"lossless"})");
  EXPECT_EQ(write.status, 409) << write.body;
  EXPECT_NE(write.body.find("newer ckptd"), std::string::npos) << write.body;
}

TEST_P(ClusterTest, KilledOwnersModelsAreTakenOverAfterTheLeaseAndOrphansCollected) {
  DriftingModel drift(11, 40000);
  std::map<uint64_t, std::string> sha;
  for (uint64_t v = 1; v <= 3; ++v) {
    const std::string body = drift.Next();
    ASSERT_EQ(Request(a_->port, "PUT", VersionPath("m", v), body).status, 201);
    sha[v] = Sha256Hex(body);
  }
  const size_t committed_chunks = ChunkObjects("m");

  // A push to A that A never finishes: most of the body, then A dies.
  const std::string interrupted = drift.Next();
  RawHttp http(a_->port);
  ASSERT_TRUE(http.Send(testing::PutHeader(VersionPath("m", 4), interrupted.size())));
  ASSERT_TRUE(http.Send(std::string_view(interrupted).substr(0, interrupted.size() * 3 / 4)));
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (ChunkObjects("m") == committed_chunks && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // A writes its chunks
  }
  ASSERT_GT(ChunkObjects("m"), committed_chunks) << "A wrote no chunk of the interrupted push";
  a_->process->Kill();
  const auto killed = Clock::now();

  // B takes the model over once A's lease expires; the push through B then succeeds.
  const std::string body = drift.Next();
  double seconds = 0;
  auto pushed = PushUntilAccepted(*b_, VersionPath("m", 5), body, &seconds);
  ASSERT_EQ(pushed.status, 201) << pushed.body;
  sha[5] = Sha256Hex(body);
  const double takeover = std::chrono::duration<double>(Clock::now() - killed).count();
  std::cout << "takeover after kill -9: " << takeover << " s (lease " << kLeaseSeconds << " s)\n";
  EXPECT_LE(takeover, 2 * kLeaseSeconds + 5);

  auto listed = json::parse(Request(b_->port, "GET", "/v1/models/m/versions").body);
  std::vector<uint64_t> versions;
  for (const auto& v : listed["versions"]) versions.push_back(v["version"]);
  EXPECT_EQ(versions, (std::vector<uint64_t>{1, 2, 3, 5}));  // the interrupted one is absent
  ExpectRestores(*b_, "m", sha, " after the takeover");

  // The interrupted push's chunks are orphans: scrub sees them, garbage collection removes them.
  auto before = json::parse(Request(b_->port, "POST", "/v1/admin/scrub").body);
  EXPECT_GT(before["models"][0]["orphaned_chunks"].get<uint64_t>(), 0u) << before.dump();
  auto gc = Request(b_->port, "POST", "/v1/admin/gc");
  ASSERT_EQ(gc.status, 200) << gc.body;
  auto after = json::parse(Request(b_->port, "POST", "/v1/admin/scrub").body);
  EXPECT_EQ(after["models"][0]["orphaned_chunks"], 0) << after.dump();
  EXPECT_EQ(after["models"][0]["damaged_versions"].size(), 0u) << after.dump();
}

TEST_P(ClusterTest, APausedOwnerThatLostItsLeaseCannotCommit) {
  DriftingModel drift(13, 20000);
  std::map<uint64_t, std::string> sha;
  for (uint64_t v = 1; v <= 2; ++v) {
    const std::string body = drift.Next();
    ASSERT_EQ(Request(a_->port, "PUT", VersionPath("m", v), body).status, 201);
    sha[v] = Sha256Hex(body);
  }
  // A starts a push, then freezes (it still believes it owns the model).
  const std::string stale = drift.Next();
  RawHttp http(a_->port);
  ASSERT_TRUE(http.Send(testing::PutHeader(VersionPath("m", 3), stale.size())));
  const size_t committed_chunks = ChunkObjects("m");
  ASSERT_TRUE(http.Send(std::string_view(stale).substr(0, stale.size() / 2)));
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (ChunkObjects("m") == committed_chunks && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // A is inside the push
  }
  ASSERT_GT(ChunkObjects("m"), committed_chunks) << "A wrote no chunk of its push";
  ASSERT_EQ(kill(a_->process->pid(), SIGSTOP), 0);

  // B takes over and commits versions 3 and after.
  double seconds = 0;
  const std::string b3 = drift.Next();
  auto r3 = PushUntilAccepted(*b_, VersionPath("m", 3), b3, &seconds);
  ASSERT_EQ(r3.status, 201) << r3.body;
  sha[3] = Sha256Hex(b3);
  // On S3, enough more that B's snapshots compact the log below A's last generation: A's
  // commit must still find the generation it would take filled (takeover entries stay).
  const uint64_t b_last = GetParam() == Backend::kS3 ? 72 : 4;
  for (uint64_t v = 4; v <= b_last; ++v) {
    const float x = static_cast<float>(v);
    const std::string body =
        v == 4 ? drift.Next()
               : testing::Serialize({{"w", DType::kF32, {2}, testing::FloatBytes({x, -x})}}, {});
    ASSERT_EQ(Request(b_->port, "PUT", VersionPath("m", v), body).status, 201) << v;
    sha[v] = Sha256Hex(body);
  }

  // A resumes and finishes its push: the commit is refused, nothing changes.
  ASSERT_EQ(kill(a_->process->pid(), SIGCONT), 0);
  ASSERT_TRUE(http.Send(std::string_view(stale).substr(stale.size() / 2)));
  auto refused = http.Read();
  // Refused by the epoch guard of the commit, or earlier when A's lease renewal found the lease
  // taken: either way 503, and nothing of it is visible.
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("lease"), std::string::npos) << refused.body;

  auto listed = json::parse(Request(b_->port, "GET", "/v1/models/m/versions").body);
  ASSERT_EQ(listed["versions"].size(), b_last) << listed.dump();
  for (const auto& [v, digest] : sha) {
    auto through_b = Request(b_->port, "GET", VersionPath("m", v));
    EXPECT_EQ(Sha256Hex(through_b.body), digest) << "version " << v;
    auto through_a = Request(a_->port, "GET", VersionPath("m", v));
    EXPECT_EQ(Sha256Hex(through_a.body), digest) << "version " << v << " through A";
  }
  // The monitoring figures say what happened: B took the lease; A lost it (its renewal found it
  // taken, or its commit was fenced).
  auto sample = [](uint16_t port, const std::string& name) {
    const std::string text = Request(port, "GET", "/metrics").body;
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + name.size() + 2));
  };
  EXPECT_EQ(sample(b_->port, "ckptd_cluster_models_owned"), 1);
  EXPECT_EQ(sample(b_->port, "ckptd_cluster_lease_takeovers_total"), 1);
  EXPECT_EQ(sample(a_->port, "ckptd_cluster_models_owned"), 0);
  EXPECT_GE(sample(a_->port, "ckptd_cluster_leases_lost_total") +
                sample(a_->port, "ckptd_cluster_commits_fenced_total"),
            1);
  // A now sends writes to B.
  auto redirected = Request(a_->port, "PUT", VersionPath("m", b_last + 1), drift.Next());
  EXPECT_EQ(redirected.status, 307);
  EXPECT_EQ(redirected.headers["location"], b_->url + VersionPath("m", b_last + 1));
}

// A daemon that is not a model's owner keeps what it restores in its cache like the owner: a
// version restored again replays nothing. A model deleted and pushed again gets seqs above the
// old ones (the deletion bumps the epoch), so such a daemon, which may never see the model
// missing in between, restores the new model's versions, not its cached reconstructions of the
// old ones.
TEST_P(ClusterTest, AModelDeletedAndPushedAgainIsNotServedFromAnotherDaemonsCache) {
  for (const char* mode : {"lossless", "lossy"}) {
    SCOPED_TRACE(mode);
    const std::string model = std::string("r-") + mode;
    const std::string policy =
        std::string(mode) == "lossy"
            ? R"({"mode":"lossy","max_abs_error":0.001,"lossless_tensors":[]})"
            : R"({"mode":"lossless"})";
    std::map<uint64_t, std::string> sha;
    for (uint64_t seed : {11, 12}) {
      ASSERT_EQ(Request(a_->port, "PUT", "/v1/models/" + model + "/policy", policy).status, 200);
      DriftingModel drift(seed, 20000);
      std::map<uint64_t, std::string> restored;
      for (uint64_t v = 1; v <= 3; ++v) {
        ASSERT_EQ(Request(a_->port, "PUT", VersionPath(model, v), drift.Next()).status, 201);
        restored[v] = Sha256Hex(Request(a_->port, "GET", VersionPath(model, v)).body);
      }
      // B restores every version (its cache now holds reconstructions of this incarnation).
      ExpectRestores(*b_, model, restored, " through B, seed " + std::to_string(seed));
      const double links = LinksDecoded(*b_);
      ExpectRestores(*b_, model, {{2, restored[2]}}, " through B again");
      EXPECT_EQ(LinksDecoded(*b_), links) << "version 2 restored again from B's cache";
      if (seed == 11) {
        ASSERT_EQ(Request(a_->port, "DELETE", "/v1/models/" + model).status, 204);
      }
    }
  }
}

TEST_P(ClusterTest, LossyModelsKeepTheirBoundAcrossAnOwnershipChange) {
  constexpr double kBound = 1e-3;
  ASSERT_EQ(Request(a_->port, "PUT", "/v1/models/q/policy",
                    R"({"mode":"lossy","max_abs_error":0.001,"lossless_tensors":[]})")
                .status,
            200);
  DriftingModel drift(17, 30000);
  std::map<uint64_t, std::string> pushed;
  for (uint64_t v = 1; v <= 4; ++v) {
    pushed[v] = drift.Next();
    ASSERT_EQ(Request(a_->port, "PUT", VersionPath("q", v), pushed[v]).status, 201);
  }
  ASSERT_EQ(a_->process->Stop(), 0);  // a clean stop releases A's leases: B takes over at once
  for (uint64_t v = 5; v <= 8; ++v) {
    pushed[v] = drift.Next();
    double seconds = 0;
    auto r = PushUntilAccepted(*b_, VersionPath("q", v), pushed[v], &seconds);
    ASSERT_EQ(r.status, 201) << r.body;
    if (v == 5) {
      EXPECT_LT(seconds, kLeaseSeconds) << "a released lease is taken at once";
    }
  }
  // B continued the closed loop: its first version's quantized tensors are deltas against the
  // reconstruction A left, not keyframes.
  auto detail = json::parse(Request(b_->port, "GET", VersionPath("q", 5) + "?detail=1").body);
  int quantized = 0;
  for (const auto& t : detail["tensors"]) {
    if (t["codec"] != "lossy") continue;
    ++quantized;
    EXPECT_EQ(t["kind"], "delta") << t.dump();
  }
  EXPECT_GT(quantized, 0) << detail.dump();
  for (const auto& [v, body] : pushed) {
    auto r = Request(b_->port, "GET", VersionPath("q", v));
    ASSERT_EQ(r.status, 200) << r.body;
    auto check = testing::CheckWithinBound(body, r.body, kBound);
    EXPECT_TRUE(check.error.empty()) << "version " << v << ": " << check.error;
    EXPECT_LE(check.worst, kBound);
  }
  // A replacement for B with an empty disk restores the same bodies (bit for bit what B sent).
  std::map<uint64_t, std::string> restored;
  for (const auto& [v, body] : pushed) {
    restored[v] = Sha256Hex(Request(b_->port, "GET", VersionPath("q", v)).body);
  }
  ASSERT_NO_FATAL_FAILURE(ReplaceBWithAnEmptyDisk());
  ExpectRestores(*b_, "q", restored, " from an empty disk");
}

// The owner rearranges a model's latest version after each push (the latest becomes keyframes,
// the one before a reverse delta); any daemon then restores every version exactly, and the
// latest from storage alone decodes one payload per chunk.
TEST_P(ClusterTest, TheOwnerRearrangesTheLatestAndAnyDaemonRestoresEveryVersion) {
  Node writer("c", GetParam(), namespace_, /*rearrange_latest=*/true);
  ASSERT_TRUE(writer.process->Start()) << writer.process->log();
  // A reverse chain longer than the pushes: the version before the latest is one delta away.
  ASSERT_EQ(Request(writer.port, "PUT", "/v1/models/m/policy",
                    R"({"mode":"lossless","keyframe_every":16})")
                .status,
            200);
  DriftingModel drift(29, 20000);
  std::map<uint64_t, std::string> sha;
  for (uint64_t v = 1; v <= 5; ++v) {
    const std::string body = drift.Next();
    ASSERT_EQ(Request(writer.port, "PUT", VersionPath("m", v), body).status, 201);
    sha[v] = Sha256Hex(body);
  }
  // The rearrangement runs in the background: wait (bounded) until the latest is keyframes.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  json latest;
  do {
    latest = json::parse(Request(writer.port, "GET", VersionPath("m", 5) + "?detail=1").body);
    if (latest.value("kind", "") == "keyframe") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < deadline);
  ASSERT_EQ(latest.value("kind", ""), "keyframe") << latest.dump() << writer.process->log();
  auto before = json::parse(Request(writer.port, "GET", VersionPath("m", 4) + "?detail=1").body);
  for (const auto& t : before["tensors"]) {
    if (t["raw_bytes"] == 0) continue;
    EXPECT_EQ(t["kind"], "delta") << t.dump();
    EXPECT_EQ(t["chain_length"], 1) << t.dump();
  }
  // A new node's start-up warm-up restores the latest from storage alone.
  ReplaceBWithAnEmptyDisk();
  size_t chunks = 0;
  for (const auto& t : latest["tensors"]) {
    chunks += (t["raw_bytes"].get<size_t>() + 16383) / 16384;
  }
  EXPECT_EQ(LinksDecoded(*b_), static_cast<double>(chunks));
  ExpectRestores(*b_, "m", sha, " through B");
  ExpectRestores(writer, "m", sha, " through the writer");
  ASSERT_EQ(writer.process->Stop(), 0);
}

// Rows [offset, offset + rows) of a 64 x 256 F32 tensor whose values drift with `version`, as
// shard `shard` of `of`.
std::string RowShard(uint64_t version, uint32_t shard, std::string* global_bytes = nullptr,
                     uint32_t of = 2) {
  constexpr uint64_t kRows = 64, kColumns = 256;
  std::vector<float> global(kRows * kColumns);
  for (size_t i = 0; i < global.size(); ++i) {
    global[i] = std::sin(0.01f * static_cast<float>(i)) + 1e-3f * static_cast<float>(version);
  }
  if (global_bytes) *global_bytes = testing::FloatBytes(global);
  auto [offset, rows] = SplitExtent(kRows, shard, of);
  std::vector<float> part(global.begin() + offset * kColumns,
                          global.begin() + (offset + rows) * kColumns);
  std::map<std::string, SliceDeclaration> slices = {{"w", {{kRows, kColumns}, {offset, 0}}}};
  return testing::Serialize({{"w", DType::kF32, {rows, kColumns}, testing::FloatBytes(part)},
                             {"b", DType::kF32, {4}, testing::FloatBytes({1, 2, 3, 4})}},
                            {{std::string(kSlicesMetadataKey), SliceDeclarationsJson(slices)}});
}

// A sharded version on RADOS: any daemon takes a shard (no redirect; on S3 shards go to the
// writer), the version is invisible until its last shard and committed by the writer, any daemon
// serves it whole, by rank and its layout, and scrub, deletion and garbage collection treat it as
// one version.
TEST_P(ClusterTest, ShardedVersionsCommitOnTheWriterAndAnyDaemonServesThem) {
  auto shard_target = [](uint64_t v, uint32_t shard) {
    return VersionPath("tp", v) + "/shards/" + std::to_string(shard) + "?of=2";
  };
  std::map<uint64_t, std::string> global;
  for (uint64_t v = 1; v <= 2; ++v) {
    std::string bytes;
    RowShard(v, 0, &bytes);
    global[v] = bytes;
    auto first = Request(a_->port, "PUT", shard_target(v, 0), RowShard(v, 0));
    ASSERT_EQ(first.status, 202) << first.body;
    if (v == 2 && GetParam() == Backend::kS3) {
      // Shards are spooled on the writer's disk: B sends the rank to A.
      auto elsewhere = Request(b_->port, "PUT", shard_target(v, 1), RowShard(v, 1));
      ASSERT_EQ(elsewhere.status, 307) << elsewhere.body;
      EXPECT_EQ(elsewhere.headers["location"], a_->url + shard_target(v, 1));
      auto last = Request(a_->port, "PUT", shard_target(v, 1), RowShard(v, 1));
      ASSERT_EQ(last.status, 201) << last.body;
      continue;
    }
    if (v == 2) {  // A writes the model now; B takes a shard too, and A commits it
      auto elsewhere = Request(b_->port, "PUT", shard_target(v, 1), RowShard(v, 1));
      ASSERT_EQ(elsewhere.status, 202) << elsewhere.body;
      // Not visible until committed: B answers the previous version as the latest, and that
      // the upload is complete, committed through A.
      auto latest = json::parse(Request(b_->port, "GET", "/v1/models/tp").body);
      EXPECT_EQ(latest["latest_version"], 1) << latest.dump();
      auto upload = json::parse(elsewhere.body)["upload"];
      EXPECT_EQ(upload["missing"].size(), 0u) << upload.dump();
      EXPECT_EQ(upload["commit_through"], a_->url) << upload.dump();
      auto commit = Request(b_->port, "POST", VersionPath("tp", v) + "/shards:commit");
      ASSERT_EQ(commit.status, 307) << commit.body;
      auto last = Request(a_->port, "POST", VersionPath("tp", v) + "/shards:commit");
      ASSERT_EQ(last.status, 201) << last.body;
      continue;
    }
    auto last = Request(a_->port, "PUT", shard_target(v, 1), RowShard(v, 1));
    ASSERT_EQ(last.status, 201) << last.body;
  }
  for (Node* node : {a_.get(), b_.get()}) {
    for (const auto& [v, bytes] : global) {
      auto whole = Request(node->port, "GET", VersionPath("tp", v));
      ASSERT_EQ(whole.status, 200) << whole.body;
      EXPECT_NE(whole.body.find(bytes), std::string::npos) << "version " << v;
      auto rank = Request(node->port, "GET", VersionPath("tp", v) + "?rank=1&of=2");
      ASSERT_EQ(rank.status, 200) << rank.body;
      EXPECT_NE(rank.body.find(bytes.substr(bytes.size() / 2)), std::string::npos);
      EXPECT_EQ(rank.body.find(bytes.substr(0, bytes.size() / 2)), std::string::npos);
    }
    auto layout = json::parse(Request(node->port, "GET", VersionPath("tp", 2) + "?layout=1").body);
    EXPECT_EQ(layout["shards"], 2) << layout.dump();
    EXPECT_EQ(layout["tensors"]["w"]["slices"].size(), 2u) << layout.dump();
  }
  // An abandoned upload, stored through B (on S3: sent to A) and seen by A, is aborted on the
  // writer.
  const uint16_t taker = GetParam() == Backend::kS3 ? a_->port : b_->port;
  ASSERT_EQ(Request(taker, "PUT", shard_target(3, 0), RowShard(3, 0)).status, 202);
  auto pending = Request(a_->port, "GET", VersionPath("tp", 3) + "/shards");
  ASSERT_EQ(pending.status, 200) << pending.body;
  EXPECT_EQ(json::parse(pending.body)["received"], json::array({0})) << pending.body;
  EXPECT_EQ(Request(a_->port, "DELETE", VersionPath("tp", 3) + "/shards").status, 204);
  EXPECT_EQ(Request(b_->port, "GET", VersionPath("tp", 3) + "/shards").status, 404);
  auto versions = json::parse(Request(b_->port, "GET", "/v1/models/tp/versions").body);
  EXPECT_EQ(versions["versions"].size(), 2u) << versions.dump();

  auto scrub = json::parse(Request(a_->port, "POST", "/v1/admin/scrub").body);
  EXPECT_EQ(scrub["models"][0]["orphaned_chunks"], 0) << scrub.dump();
  EXPECT_EQ(scrub["models"][0]["damaged_versions"].size(), 0u) << scrub.dump();
  // Deleting the first version rebases the second (a delta against it) as one version.
  const uint64_t stored =
      json::parse(Request(b_->port, "GET", "/v1/models/tp").body)["stored_bytes"];
  EXPECT_EQ(Request(a_->port, "DELETE", VersionPath("tp", 1)).status, 204);
  auto gc = Request(a_->port, "POST", "/v1/admin/gc");
  ASSERT_EQ(gc.status, 200) << gc.body;
  EXPECT_EQ(json::parse(gc.body)["models"][0]["gc"]["versions_rebased"], 1) << gc.body;
  EXPECT_LT(json::parse(Request(b_->port, "GET", "/v1/models/tp").body)["stored_bytes"], stored);
  ExpectRestores(*b_, "tp", {{2, Sha256Hex(Request(a_->port, "GET", VersionPath("tp", 2)).body)}},
                 " after deleting version 1");
}

// A request with a Content-Type (RawHttp's Request sends none).
testing::RawResponse RequestTyped(uint16_t port, std::string_view method, std::string_view target,
                                  std::string_view content_type, std::string_view body) {
  RawHttp http(port);
  const std::string head =
      std::string(method) + " " + std::string(target) +
      " HTTP/1.1\r\nHost: localhost\r\nContent-Type: " + std::string(content_type) +
      "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  if (!http.Send(head) || !http.Send(body)) return testing::RawResponse{};
  return http.Read();
}

// Shard `shard` of `of` of version `version` of "enc", coded as its rank codes it: by the plan
// `node` answers, against `reference` (the rank's part of the base).
std::string EncodedRowShard(const Node& node, uint64_t version, uint32_t shard, uint32_t of,
                            const std::string& reference) {
  const std::string body = RowShard(version, shard, nullptr, of);
  auto view = CheckpointView::Parse(testing::Bytes(body));
  EXPECT_TRUE(view.ok()) << view.status().ToString();
  const std::string target = "/v1/models/enc/versions/" + std::to_string(version) + "/shards/" +
                             std::to_string(shard) + "/plan?of=" + std::to_string(of);
  auto answer = Request(node.port, "POST", target, view->raw_header());
  EXPECT_EQ(answer.status, 200) << answer.body;
  auto plan = CodingPlan::FromJson(answer.body);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  auto base = CheckpointView::Parse(testing::Bytes(reference));
  EXPECT_TRUE(base.ok()) << base.status().ToString();
  std::string encoded;
  auto coded = EncodeByPlan(*plan, *view, &*base, 1, [&](std::string_view piece) {
    encoded += piece;
    return Status::Ok();
  });
  EXPECT_TRUE(coded.ok()) << coded.status().ToString();
  return encoded;
}

// Any daemon takes a shard: 4 ranks' encoded shards split across both daemons are stored in the
// pool (no shard is redirected), and the upload is committed once, by the writer. A daemon
// SIGKILLed while a shard arrives loses nothing acknowledged: the rank sends the shard to the
// other daemon, the version commits, and no object of the upload is left in the pool.
TEST_P(ClusterTest, AnyDaemonTakesAShardAndTheWriterCommitsEachUploadOnce) {
  if (GetParam() == Backend::kS3) {
    GTEST_SKIP() << "the S3 backend spools shards on the writer's disk (redirected to it)";
  }
  constexpr uint32_t kRanks = 4;
  auto shard_target = [](uint64_t v, uint32_t shard) {
    return VersionPath("enc", v) + "/shards/" + std::to_string(shard) + "?of=4";
  };
  std::map<uint64_t, std::string> sha;
  // Version 1, plain, through A: A writes the model from now on.
  for (uint32_t r = 0; r < kRanks; ++r) {
    auto stored = Request(a_->port, "PUT", shard_target(1, r), RowShard(1, r, nullptr, kRanks));
    ASSERT_EQ(stored.status, r + 1 < kRanks ? 202 : 201) << stored.body;
  }
  sha[1] = Sha256Hex(Request(a_->port, "GET", VersionPath("enc", 1)).body);

  // Version 2: ranks 0 and 1 send to A, ranks 2 and 3 to B, each coded against its own part of
  // version 1 (what it pushed: the policy is lossless).
  for (uint32_t r = 0; r < kRanks; ++r) {
    Node& node = r < 2 ? *a_ : *b_;
    const std::string encoded =
        EncodedRowShard(node, 2, r, kRanks, RowShard(1, r, nullptr, kRanks));
    auto stored =
        RequestTyped(node.port, "PUT", shard_target(2, r), kEncodedShardMediaType, encoded);
    ASSERT_EQ(stored.status, 202) << "rank " << r << ": " << stored.body;
    EXPECT_LT(encoded.size(), RowShard(2, r, nullptr, kRanks).size());
    if (r + 1 == kRanks) {
      auto upload = json::parse(stored.body)["upload"];
      EXPECT_EQ(upload["missing"].size(), 0u) << upload.dump();
      EXPECT_EQ(upload["commit_through"], a_->url) << upload.dump();
    }
  }
  EXPECT_EQ(b_->process->log().find("status=307"), std::string::npos) << "a shard was redirected";
  auto committed = Request(a_->port, "POST", VersionPath("enc", 2) + "/shards:commit");
  ASSERT_EQ(committed.status, 201) << committed.body;
  // Asked again (another rank that saw the upload complete): the same version, unchanged.
  auto again = Request(a_->port, "POST", VersionPath("enc", 2) + "/shards:commit");
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(json::parse(again.body)["version"]["version"], 2) << again.body;
  std::string global2;
  RowShard(2, 0, &global2, kRanks);
  auto restored2 = Request(b_->port, "GET", VersionPath("enc", 2));
  ASSERT_EQ(restored2.status, 200) << restored2.body;
  EXPECT_NE(restored2.body.find(global2), std::string::npos) << "lossless, bit-exact";
  sha[2] = Sha256Hex(restored2.body);

  // Version 3: ranks 0 and 1 stored through A; rank 2's shard is arriving at B when B is killed.
  for (uint32_t r = 0; r < 2; ++r) {
    auto stored = RequestTyped(a_->port, "PUT", shard_target(3, r), kEncodedShardMediaType,
                               EncodedRowShard(*a_, 3, r, kRanks, RowShard(2, r, nullptr, kRanks)));
    ASSERT_EQ(stored.status, 202) << stored.body;
  }
  const std::string rank2 = EncodedRowShard(*b_, 3, 2, kRanks, RowShard(2, 2, nullptr, kRanks));
  {
    // The rank first sends its shard plain, with a large tensor of its own: B stores more than
    // a write's worth of it in the pool before it dies.
    const std::string plain =
        testing::Serialize({{"pad", DType::kF32, {4u << 20}, std::string(16u << 20, '\1')}}, {});
    RawHttp http(b_->port);
    const std::string head =
        "PUT " + shard_target(3, 2) +
        " HTTP/1.1\r\nHost: localhost\r\nContent-Length: " + std::to_string(plain.size()) +
        "\r\n\r\n";
    ASSERT_TRUE(http.Send(head) && http.Send(std::string_view(plain).substr(0, 12u << 20)));
    // Killed once B has written a piece of the attempt in the pool (a readiness check on the
    // pool).
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    bool written = false;
    while (!written && Clock::now() < deadline) {
      for (auto it = io_.nobjects_begin(); it != io_.nobjects_end() && !written; ++it) {
        written = it->get_oid().starts_with("upload/enc/3/") && it->get_oid().ends_with("/0");
      }
      if (!written) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(written) << "B never wrote a piece of rank 2's shard";
    b_->process->Kill();
  }
  // The rank sends its shard again, to A, as does rank 3: A commits.
  auto resent = RequestTyped(a_->port, "PUT", shard_target(3, 2), kEncodedShardMediaType, rank2);
  ASSERT_EQ(resent.status, 202) << resent.body;
  auto last = RequestTyped(a_->port, "PUT", shard_target(3, 3), kEncodedShardMediaType,
                           EncodedRowShard(*a_, 3, 3, kRanks, RowShard(2, 3, nullptr, kRanks)));
  ASSERT_EQ(last.status, 201) << last.body;
  std::string global3;
  RowShard(3, 0, &global3, kRanks);
  auto restored3 = Request(a_->port, "GET", VersionPath("enc", 3));
  ASSERT_EQ(restored3.status, 200);
  EXPECT_NE(restored3.body.find(global3), std::string::npos) << "lossless, bit-exact";
  sha[3] = Sha256Hex(restored3.body);

  // Nothing of the uploads is left in the pool, the killed attempt included.
  for (auto it = io_.nobjects_begin(); it != io_.nobjects_end(); ++it) {
    EXPECT_FALSE(it->get_oid().starts_with("upload/")) << it->get_oid();
  }
  std::set<std::string> index;
  ASSERT_EQ(io_.omap_get_keys2("uploads", "", 100, &index, nullptr), 0);
  EXPECT_TRUE(index.empty()) << *index.begin();
  auto scrub = json::parse(Request(a_->port, "POST", "/v1/admin/scrub").body);
  EXPECT_EQ(scrub["models"][0]["orphaned_chunks"], 0) << scrub.dump();
  // B restarts and serves every version; it has no upload to resume.
  ASSERT_TRUE(b_->process->Start()) << b_->process->log();
  ExpectRestores(*b_, "enc", sha, " through B after its restart");
  auto uploads = Request(b_->port, "GET", VersionPath("enc", 4) + "/shards");
  EXPECT_EQ(uploads.status, 404) << uploads.body;

  // The last two shards of a new model (nobody holds its lease) arrive at both daemons at
  // once: one daemon takes the lease and commits; the other commits too or says where.
  testing::RawResponse raced[2];
  {
    std::thread a_side([&] {
      raced[0] =
          Request(a_->port, "PUT", VersionPath("race", 1) + "/shards/0?of=2", RowShard(1, 0));
    });
    raced[1] = Request(b_->port, "PUT", VersionPath("race", 1) + "/shards/1?of=2", RowShard(1, 1));
    a_side.join();
  }
  int committed_answers = 0;
  for (const auto& r : raced) {
    ASSERT_TRUE(r.status == 201 || r.status == 202) << r.status << " " << r.body;
    committed_answers += r.status == 201;
  }
  auto race_commit = Request(a_->port, "POST", VersionPath("race", 1) + "/shards:commit");
  if (race_commit.status == 307) {
    race_commit = Request(b_->port, "POST", VersionPath("race", 1) + "/shards:commit");
  }
  ASSERT_TRUE(race_commit.status == 200 || race_commit.status == 201) << race_commit.body;
  EXPECT_LE(committed_answers, 1) << raced[0].body << raced[1].body;
  std::string race_global;
  RowShard(1, 0, &race_global);
  for (Node* node : {a_.get(), b_.get()}) {
    auto whole = Request(node->port, "GET", VersionPath("race", 1));
    ASSERT_EQ(whole.status, 200) << whole.body;
    EXPECT_NE(whole.body.find(race_global), std::string::npos);
  }

  // The Python client's ranks: the one whose shard completes the upload on B has the commit
  // done through the writer, and its answer is the committed version.
  const std::string script = R"(
import sys
sys.path.insert(0, ")" + std::string(CKPT_PYTHON_CLIENT_DIR) +
                             R"(")
import numpy as np
from ckptd import Client
rows = np.arange(64 * 256, dtype=np.float32).reshape(64, 256)
Client(")" + (a_->url) + R"(").push("py", 1, {"w": rows * 0})  # A writes the model
answers = []
for rank in range(4):
    client = Client(")" + (a_->url) +
                             R"(" if rank < 3 else ")" + (b_->url) + R"(", encoded=False)
    part = rows[rank * 16:(rank + 1) * 16]
    answers.append(client.push_shard("py", 2, rank, 4, {"w": part}, metrics={"loss": 1.5},
                                     tags=("best",), slices={"w": {"global_shape": [64, 256],
                                                   "offsets": [rank * 16, 0]}}))
assert "version" not in answers[2], answers[2]
assert answers[3]["version"]["version"] == 2, answers[3]
back = Client(")" + (b_->url) +
                             R"(").pull("py", "tag:best", as_torch=False)
assert (back["w"] == rows).all()
print("python ok")
)";
  ExpectPythonRuns("any_daemon.py", script);
  EXPECT_NE(b_->process->log().find(
                "POST /v1/models/py/versions/2/shards:commit?metric.loss=1.5&tag=best status=307"),
            std::string::npos)
      << "the rank's client did not ask the writer for the commit";
}

}  // namespace
}  // namespace ckpt
