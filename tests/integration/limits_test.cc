// Limits against abuse, end to end: connection count, slow clients (slowloris headers, a body
// that stops), tensors per checkpoint. Each refusal leaves the daemon serving everyone else.
#include <gtest/gtest.h>

#include <chrono>

#include "ckpt/client/client.h"
#include "daemon_fixture.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::DriftingModel;
using testing::RawHttp;

class LimitsTest : public testing::DaemonFixture {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        StartDaemon("[server]\nmax_connections = 3\nidle_timeout_seconds = 1\n"
                    "io_timeout_seconds = 1\n[storage]\nmax_tensors_per_checkpoint = 3\n"));
  }

  bool Healthy() {
    RawHttp http(daemon_->port());
    return http.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") && http.Read().status == 200;
  }
};

TEST_F(LimitsTest, ConnectionsBeyondTheLimitGet503AndOthersKeepWorking) {
  // Three connections, each registered (one request answered, kept alive).
  std::vector<std::unique_ptr<RawHttp>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<RawHttp>(daemon_->port()));
    ASSERT_TRUE(held.back()->Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
    ASSERT_EQ(held.back()->Read().status, 200);
  }
  RawHttp fourth(daemon_->port());
  fourth.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  const auto refused = fourth.Read();
  EXPECT_EQ(refused.status, 503) << refused.error;
  EXPECT_NE(refused.body.find("too many connections"), std::string::npos) << refused.body;
  EXPECT_NE(refused.body.find(R"("code":"UNAVAILABLE")"), std::string::npos) << refused.body;
  // The held connections still work; once one closes, new ones are served again.
  ASSERT_TRUE(held[0]->Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(held[0]->Read().status, 200);
  held.clear();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  bool served = false;
  while (!served && std::chrono::steady_clock::now() < deadline) served = Healthy();
  EXPECT_TRUE(served);
}

TEST_F(LimitsTest, SlowClientsAreDroppedAndNothingIsStored) {
  // Slowloris: headers that never finish. The connection is closed after the idle timeout.
  const auto start = std::chrono::steady_clock::now();
  RawHttp slow_headers(daemon_->port());
  ASSERT_TRUE(slow_headers.Send("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  const auto dropped = slow_headers.Read();
  EXPECT_EQ(dropped.status, 0);
  EXPECT_FALSE(dropped.error.empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // A push whose body stops half way: dropped after the I/O timeout, no version, others served.
  DriftingModel model(91, 10);
  const std::string body = model.Next();
  RawHttp stalled(daemon_->port());
  ASSERT_TRUE(stalled.Send(testing::PutHeader("/v1/models/s/versions/1", body.size())));
  ASSERT_TRUE(stalled.Send(body.substr(0, body.size() / 2)));
  EXPECT_TRUE(Healthy());
  const auto cut = stalled.Read();
  EXPECT_NE(cut.status, 201);
  const auto versions = testing::Request(daemon_->port(), "GET", "/v1/models/s/versions");
  EXPECT_EQ(versions.status, 404) << versions.body;
  EXPECT_TRUE(Healthy());
}

TEST_F(LimitsTest, CheckpointsWithTooManyTensorsGet413) {
  DriftingModel model(92, 10);  // four tensors
  const std::string body = model.Next();
  const auto r = testing::Request(daemon_->port(), "PUT", "/v1/models/t/versions/1", body);
  EXPECT_EQ(r.status, 413) << r.body;
  EXPECT_NE(r.body.find("max_tensors_per_checkpoint"), std::string::npos) << r.body;
  EXPECT_TRUE(Healthy());
}

}  // namespace
}  // namespace ckpt
