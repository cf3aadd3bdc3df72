// The store suite on a shared backend: the storage tests' stores (tests/support/store_fixture.h)
// run on RADOS or on S3 instead of their data directory, so that the same tests check that the
// store core behaves alike on every backend. CKPT_STORE_SUITE_BACKEND names the backend
// ("rados" or "s3"); each data directory a test opens gets a RADOS namespace or an S3 key prefix
// of its own on the one-node Ceph cluster this binary starts (ceph_cluster.h). Tests of what only
// the local backend has (its RocksDB files, its backups) skip themselves
// (CKPT_LOCAL_BACKEND_ONLY).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "ceph_cluster.h"
#include "ckpt/base/hashing.h"
#include "store_fixture.h"

namespace ckpt::testing {
namespace {

constexpr char kBucket[] = "ckptd-store-suite";
// Short write leases: a test that crashes a store waits this long for another to write.
constexpr std::chrono::milliseconds kLease{2000};

// A place of its own for each data directory (temporary directories have random names), the same
// at every reopen of it; `run` keeps apart the runs of the suite on one cluster.
std::string PlaceOf(const std::string& run, const std::string& data_dir) {
  const uint64_t hash =
      Xxh3Checksum({reinterpret_cast<const uint8_t*>(data_dir.data()), data_dir.size()});
  return "suite-" + run + "-" + std::to_string(hash);
}

class SharedBackend : public ::testing::Environment {
 public:
  explicit SharedBackend(std::string backend) : backend_(std::move(backend)) {}

  void SetUp() override {
    ASSERT_TRUE(backend_ == "rados" || backend_ == "s3")
        << "CKPT_STORE_SUITE_BACKEND is \"" << backend_ << "\"; expected rados or s3";
    auto& cluster = CephCluster::Get();
    if (!cluster.skip_reason().empty()) GTEST_SKIP() << cluster.skip_reason();
    ASSERT_TRUE(cluster.started()) << cluster.start_log();
    const std::string run = std::to_string(std::random_device{}());
    if (backend_ == "rados") {
      TestStoreBackend() = [conf = cluster.conf_file(), run](StoreOptions& options) {
        ClusterOptions rados;
        rados.conf_file = conf;
        rados.pool = CephCluster::kPool;
        rados.object_namespace = PlaceOf(run, options.data_dir);
        rados.lease = kLease;
        options.cluster = rados;
      };
      return;
    }
    if (!std::filesystem::exists("/usr/bin/radosgw")) {
      GTEST_SKIP() << "radosgw is not installed (scripts/install-deps.sh)";
    }
    ASSERT_FALSE(cluster.Gateway().empty()) << cluster.gateway_log();
    ASSERT_TRUE(cluster.CreateBucket(kBucket));
    TestStoreBackend() = [endpoint = cluster.Gateway(), run](StoreOptions& options) {
      S3Options s3;
      s3.endpoint = endpoint;
      s3.bucket = kBucket;
      s3.prefix = PlaceOf(run, options.data_dir);
      s3.access_key = CephCluster::kS3AccessKey;
      s3.secret_key = CephCluster::kS3SecretKey;
      s3.lease = kLease;
      // Packs of a few records of the suite's small chunks; pushes of more write packs before
      // they commit, as large models' do.
      s3.pack_bytes = 8 << 10;
      options.s3 = s3;
    };
  }

  void TearDown() override { TestStoreBackend() = nullptr; }

 private:
  std::string backend_;
};

// Registered before main runs the tests (the binary links gtest_main).
const bool registered = [] {
  const char* backend = std::getenv("CKPT_STORE_SUITE_BACKEND");
  ::testing::AddGlobalTestEnvironment(new SharedBackend(backend != nullptr ? backend : ""));
  return true;
}();

}  // namespace
}  // namespace ckpt::testing
