// Observability end to end: GET /metrics in the Prometheus text format after real traffic, and
// request ids echoed in X-Request-Id.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "ckpt/client/client.h"
#include "daemon_fixture.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::DaemonProcess;
using testing::DriftingModel;
using testing::RawHttp;
using testing::TempDir;

class ObservabilityTest : public testing::DaemonFixture {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(StartDaemon()); }

  testing::RawResponse Get(const std::string& target, const std::string& extra_headers = "") {
    RawHttp http(daemon_->port());
    EXPECT_TRUE(http.Send("GET " + target + " HTTP/1.1\r\nHost: x\r\n" + extra_headers + "\r\n"));
    return http.Read();
  }

  // The value of the sample `series` (a metric name with its labels, as printed), or -1.
  static double Sample(const std::string& text, const std::string& series) {
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 2));
  }
};

TEST_F(ObservabilityTest, MetricsCoverRequestsModelsStoreAndEngine) {
  ClientOptions options;
  options.server = daemon_->url();
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  DriftingModel drift(90, 20000);
  for (uint64_t v = 1; v <= 3; ++v) ASSERT_TRUE(client->PushBuffer("run1", v, drift.Next()).ok());
  ASSERT_TRUE(client->PullToBuffer("run1", "latest").ok());
  EXPECT_FALSE(client->PullToBuffer("run1", "99").ok());  // a 404
  ASSERT_TRUE(client->DeleteVersion("run1", 1).ok());

  const auto r = Get("/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.content_type.find("text/plain"), std::string::npos);
  const std::string& m = r.body;
  EXPECT_EQ(Sample(m, R"(ckptd_http_requests_total{method="PUT",route="version",status="201"})"),
            3);
  EXPECT_EQ(Sample(m, R"(ckptd_http_requests_total{method="GET",route="version",status="404"})"),
            1);
  EXPECT_GE(Sample(m, R"(ckptd_http_request_duration_seconds_count{route="version"})"), 5);
  EXPECT_GT(Sample(m, R"(ckptd_http_bytes_total{direction="in"})"), 3 * 20000 * 4);
  EXPECT_GT(Sample(m, R"(ckptd_model_raw_bytes{model="run1"})"), 0);
  EXPECT_GT(Sample(m, R"(ckptd_model_compression_ratio{model="run1"})"), 0);
  EXPECT_EQ(Sample(m, R"(ckptd_model_versions{model="run1"})"), 2);
  EXPECT_EQ(Sample(m, "ckptd_pushes_total"), 3);
  EXPECT_GT(Sample(m, "ckptd_codec_encode_seconds_total"), 0);
  EXPECT_EQ(Sample(m, "ckptd_versions_deleted_total"), 1);
  EXPECT_GE(Sample(m, "ckptd_retention_versions_deleted_total"), 0);
  EXPECT_GE(Sample(m, "ckptd_gc_bytes_freed_total"), 0);
  EXPECT_EQ(Sample(m, "ckptd_restores_total"), 1);  // the 404 opened none
  EXPECT_GE(Sample(m, "ckptd_restore_links_decoded_total"), 0);
  EXPECT_GE(Sample(m, "ckptd_rocksdb_pending_compaction_bytes"), 0);
  EXPECT_GE(Sample(m, "ckptd_rocksdb_sst_bytes"), 0);
  EXPECT_NE(m.find("# TYPE ckptd_http_request_duration_seconds histogram"), std::string::npos);
  // The data directory by what its bytes are (a background pass may run between two reads:
  // each is checked on its own), the same in GET /v1/status.
  EXPECT_GT(Sample(m, "ckptd_stored_bytes"), 0);
  EXPECT_EQ(Sample(m, "ckptd_data_directory_bytes"), Sample(m, "ckptd_stored_bytes") +
                                                         Sample(m, "ckptd_garbage_bytes") +
                                                         Sample(m, "ckptd_metadata_bytes"));
  const auto status = Get("/v1/status");
  ASSERT_EQ(status.status, 200);
  const auto space = nlohmann::json::parse(status.body).value("space", nlohmann::json::object());
  ASSERT_FALSE(space.empty()) << status.body;
  EXPECT_GT(space["stored_bytes"].get<uint64_t>(), 0u) << status.body;
  EXPECT_EQ(space["data_directory_bytes"].get<uint64_t>(),
            space["stored_bytes"].get<uint64_t>() + space["garbage_bytes"].get<uint64_t>() +
                space["metadata_bytes"].get<uint64_t>())
      << status.body;
}

TEST_F(ObservabilityTest, RequestIdsAreEchoedOrGenerated) {
  const auto mine = Get("/healthz", "X-Request-Id: trainer-42.step_7\r\n");
  EXPECT_EQ(mine.request_id, "trainer-42.step_7");
  const auto generated = Get("/v1/models");
  EXPECT_TRUE(std::regex_match(generated.request_id, std::regex("[0-9a-f]{16}")))
      << generated.request_id;
  const auto unsafe = Get("/nope", "X-Request-Id: has spaces and {braces}\r\n");
  EXPECT_EQ(unsafe.status, 404);
  EXPECT_TRUE(std::regex_match(unsafe.request_id, std::regex("[0-9a-f]{16}")));
  // Every answer gets its own.
  EXPECT_NE(Get("/v1/models/none/versions/latest").request_id, generated.request_id);
}

TEST(JsonLogsTest, EveryLineIsAJsonObjectAndRequestsHaveFields) {
  TempDir dir;
  const auto config = dir.path() / "json.toml";
  std::ofstream(config) << "[log]\nformat = \"json\"\n";
  DaemonProcess daemon(CKPTD_BINARY, dir.path(), {"--config", config.string()});
  daemon.set_log_level("info");
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  RawHttp http(daemon.port());
  ASSERT_TRUE(http.Send("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Request-Id: json-1\r\n\r\n"));
  ASSERT_EQ(http.Read().status, 200);
  EXPECT_EQ(daemon.Stop(), 0);
  std::istringstream lines(daemon.log());
  std::string line;
  int parsed = 0;
  bool found = false;
  while (std::getline(lines, line)) {
    const auto doc = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(doc.is_object()) << line;
    EXPECT_TRUE(doc.contains("time") && doc.contains("level")) << line;
    ++parsed;
    if (doc.value("request_id", "") == "json-1") {
      found = true;
      EXPECT_EQ(doc.value("status", 0), 200);
      EXPECT_EQ(doc.value("route", ""), "list_models");
      EXPECT_EQ(doc.value("method", ""), "GET");
    }
  }
  EXPECT_GE(parsed, 3);
  EXPECT_TRUE(found) << daemon.log();
}

}  // namespace
}  // namespace ckpt
