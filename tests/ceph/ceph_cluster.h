// CephCluster: the one-node Ceph cluster a test binary shares (scripts/ceph-one-node.sh:
// one mon and one BlueStore-on-a-file OSD on loopback ports, everything under a temporary
// directory, stopped by PID). Started on first use, stopped when the binary's tests end.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <rados/librados.hpp>
#include <string>

#include "test_support.h"

namespace ckpt::testing {

// A free loopback TCP port (bound and released; the caller binds it right after).
inline uint16_t FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class CephCluster {
 public:
  // The binary's cluster, started on the first call (5-10 s). Check usable() before use.
  static CephCluster& Get() {
    static CephCluster* cluster = [] {
      auto* c = new CephCluster();
      c->Start();
      ::testing::AddGlobalTestEnvironment(new StopAtEnd(c));
      return c;
    }();
    return *cluster;
  }

  // Empty when the cluster runs; otherwise why not (Ceph missing: skip; start failed: fail).
  const std::string& skip_reason() const { return skip_reason_; }
  bool started() const { return start_status_ == 0; }
  std::string start_log() const {
    std::ifstream log(dir_->path() / "start.log");
    return std::string(std::istreambuf_iterator<char>(log), {});
  }
  double start_seconds() const { return start_seconds_; }
  std::string conf_file() const { return dir_->str() + "/ceph/ceph.conf"; }
  static constexpr char kPool[] = "ckptd";

  // Connects a client.admin client to the pool, in `object_namespace`. ASSERTs (call through
  // ASSERT_NO_FATAL_FAILURE).
  void Connect(librados::Rados* cluster, librados::IoCtx* io,
               const std::string& object_namespace = "") const {
    ASSERT_EQ(cluster->init2("client.admin", "ceph", 0), 0);
    ASSERT_EQ(cluster->conf_read_file(conf_file().c_str()), 0);
    ASSERT_EQ(cluster->connect(), 0);
    ASSERT_EQ(cluster->ioctx_create(kPool, *io), 0);
    io->set_namespace(object_namespace);
  }

  // The S3 gateway (radosgw) on the cluster, started on the first call (3-7 s): its endpoint
  // ("http://127.0.0.1:PORT"), or "" when it could not start (gateway_log() says why).
  static constexpr char kS3AccessKey[] = "ckptdtestaccess";
  static constexpr char kS3SecretKey[] = "ckptdtestsecret0123456789";
  const std::string& Gateway() {
    if (!gateway_tried_ && started()) {
      gateway_tried_ = true;
      const uint16_t port = FreePort();
      const std::string command = std::string("S3_ACCESS_KEY=") + kS3AccessKey +
                                  " S3_SECRET_KEY=" + kS3SecretKey + " " + CKPT_CEPH_SCRIPT +
                                  " start-rgw " + dir_->str() + "/ceph " + std::to_string(port) +
                                  " > " + dir_->str() + "/rgw-start.log 2>&1";
      if (std::system(command.c_str()) == 0) {
        gateway_ = "http://127.0.0.1:" + std::to_string(port);
      }
    }
    return gateway_;
  }
  std::string gateway_log() const {
    std::ifstream log(dir_->path() / "rgw-start.log");
    return std::string(std::istreambuf_iterator<char>(log), {});
  }
  // Creates bucket `name` on the gateway (Ok if it exists); whether it worked.
  bool CreateBucket(const std::string& name) {
    // RGW wants the payload hash header, which curl does not add.
    const std::string command =
        std::string(
            "curl -sf -o /dev/null -X PUT -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "
            "--aws-sigv4 aws:amz:us-east-1:s3 --user ") +
        kS3AccessKey + ":" + kS3SecretKey + " " + Gateway() + "/" + name;
    return !Gateway().empty() && std::system(command.c_str()) == 0;
  }

  void Stop() {
    if (!dir_ || stopped_) return;
    const std::string command =
        std::string(CKPT_CEPH_SCRIPT) + " stop " + dir_->str() + "/ceph > /dev/null 2>&1";
    (void)std::system(command.c_str());
    stopped_ = true;
  }

 private:
  struct StopAtEnd : ::testing::Environment {
    explicit StopAtEnd(CephCluster* c) : cluster(c) {}
    void TearDown() override { cluster->Stop(); }
    CephCluster* cluster;
  };

  void Start() {
    if (!std::filesystem::exists("/usr/bin/ceph-mon") ||
        !std::filesystem::exists("/usr/bin/ceph-osd")) {
      skip_reason_ = "Ceph is not installed (ceph-mon, ceph-osd: scripts/install-deps.sh)";
      return;
    }
    dir_ = std::make_unique<TempDir>();
    const std::string command = "CEPH_MON_PORT=" + std::to_string(FreePort()) +
                                " CEPH_MON_PORT_V1=" + std::to_string(FreePort()) + " " +
                                CKPT_CEPH_SCRIPT + " start " + dir_->str() + "/ceph " + kPool +
                                " > " + dir_->str() + "/start.log 2>&1";
    const auto start = std::chrono::steady_clock::now();
    start_status_ = std::system(command.c_str());
    start_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  std::unique_ptr<TempDir> dir_;
  std::string skip_reason_;
  int start_status_ = -1;
  double start_seconds_ = 0;
  bool stopped_ = false;
  bool gateway_tried_ = false;
  std::string gateway_;
};

// In a fixture's SetUp: skips without Ceph, fails when the cluster did not start.
#define CKPT_REQUIRE_CEPH_CLUSTER()                                                      \
  do {                                                                                   \
    auto& ceph_cluster = ::ckpt::testing::CephCluster::Get();                            \
    if (!ceph_cluster.skip_reason().empty()) GTEST_SKIP() << ceph_cluster.skip_reason(); \
    ASSERT_TRUE(ceph_cluster.started()) << ceph_cluster.start_log();                     \
  } while (0)

// In a fixture's SetUp: as CKPT_REQUIRE_CEPH_CLUSTER, and the S3 gateway answers (skips without
// radosgw installed).
#define CKPT_REQUIRE_S3_GATEWAY()                                           \
  do {                                                                      \
    CKPT_REQUIRE_CEPH_CLUSTER();                                            \
    if (!std::filesystem::exists("/usr/bin/radosgw")) {                     \
      GTEST_SKIP() << "radosgw is not installed (scripts/install-deps.sh)"; \
    }                                                                       \
    ASSERT_FALSE(::ckpt::testing::CephCluster::Get().Gateway().empty())     \
        << ::ckpt::testing::CephCluster::Get().gateway_log();               \
  } while (0)

}  // namespace ckpt::testing
