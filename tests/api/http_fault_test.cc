// Faults of the file system seen through HTTP: the real server in process over a store whose
// file system fails on request (FaultyFileSystem). Each answer has the status the fault calls
// for, a JSON error without server paths, /v1/status and /healthz say what happened, and
// writes come back once the fault is gone.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "ckpt/api/http_server.h"
#include "ckpt/storage/checkpoint_store.h"
#include "faulty_file_system.h"
#include "raw_http.h"
#include "store_open.h"
#include "test_support.h"

namespace ckpt::testing {
namespace {

using nlohmann::json;
using Op = FaultyFileSystem::Op;

class HttpFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::tie(fs_, env_) = FaultyFileSystem::NewEnv();
    ASSERT_NO_FATAL_FAILURE(Start());
  }

  // Opens the store (caches empty) and serves it.
  void Start() {
    server_.reset();
    store_.reset();
    StoreOptions options;
    options.data_dir = dir_.str();
    options.chunk_bytes = 16 << 10;
    options.min_free_bytes = 0;  // the faults decide, not the reserve
    auto store = OpenStoreOn(options, env_);
    ASSERT_TRUE(store.ok()) << store.status().ToLogString();
    store_ = std::move(store).value();
    api::HttpServerOptions http;
    http.port = 0;
    auto server = api::HttpServer::Start(http, store_.get());
    ASSERT_TRUE(server.ok()) << server.status().ToLogString();
    server_ = std::move(server).value();
  }

  void TearDown() override {
    server_.reset();
    store_.reset();
  }

  RawResponse Call(std::string_view method, const std::string& target, std::string_view body = {}) {
    return Request(server_->port(), method, target, body);
  }

  RawResponse Push(uint64_t version) {
    return Call("PUT", "/v1/models/m/versions/" + std::to_string(version), drift_.Next());
  }

  // The error body: code and message, the message free of server paths.
  json Error(const RawResponse& r) {
    const json body = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(body.is_object() && body.contains("error")) << r.body;
    if (!body.is_object() || !body.contains("error")) return {};
    const std::string message = body["error"]["message"];
    EXPECT_EQ(message.find(dir_.str()), std::string::npos) << message;
    EXPECT_EQ(message.find(".log"), std::string::npos) << message;
    EXPECT_EQ(message.find('/'), std::string::npos) << message;
    return body["error"];
  }

  json Status() { return json::parse(Call("GET", "/v1/status").body); }

  void WaitWritable() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (Status()["writes"] != "writable" && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(Status()["writes"], "writable") << Status();
  }

  TempDir dir_;
  std::shared_ptr<FaultyFileSystem> fs_;
  std::shared_ptr<rocksdb::Env> env_;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<api::HttpServer> server_;
  DriftingModel drift_{3, 40000};
};

TEST_F(HttpFaultTest, ALogWriteOutOfSpaceIs507UntilSpaceReturns) {
  ASSERT_EQ(Push(1).status, 201);
  FaultyFileSystem::Fault fault;
  fault.op = Op::kWrite;
  fault.file_contains = ".log";
  fs_->Arm(fault);
  const RawResponse refused = Push(2);
  EXPECT_EQ(refused.status, 507) << refused.body;
  const json error = Error(refused);
  EXPECT_EQ(error["code"], "RESOURCE_EXHAUSTED");
  EXPECT_EQ(error["reason"], "NO_SPACE");
  // Suspended while the volume is full: every write is 507; reads and the health check answer.
  EXPECT_EQ(Status()["writes"], "suspended");
  const RawResponse deleted = Call("DELETE", "/v1/models/m/versions/1");
  EXPECT_EQ(deleted.status, 507) << deleted.body;
  Error(deleted);
  EXPECT_EQ(Call("GET", "/v1/models/m/versions/1").status, 200);
  const RawResponse health = Call("GET", "/healthz?detail=1");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(json::parse(health.body)["writes"], "suspended");

  fs_->Clear();
  ASSERT_NO_FATAL_FAILURE(WaitWritable());
  EXPECT_GE(Status()["recoveries"].get<int>(), 1);
  EXPECT_EQ(Push(3).status, 201);
  const RawResponse listing = Call("GET", "/v1/models/m/versions");
  EXPECT_EQ(json::parse(listing.body)["versions"].size(), 2u) << listing.body;
}

TEST_F(HttpFaultTest, AnIoErrorIs500ThenTheStoreIsReadOnlyAndServesReads) {
  ASSERT_EQ(Push(1).status, 201);
  FaultyFileSystem::Fault fault;
  fault.op = Op::kSync;
  fault.no_space = false;
  fs_->Arm(fault);
  const RawResponse refused = Push(2);
  EXPECT_EQ(refused.status, 500) << refused.body;
  EXPECT_EQ(Error(refused)["code"], "IO_ERROR");
  fs_->Clear();
  const json status = Status();
  EXPECT_EQ(status["writes"], "read_only") << status;
  EXPECT_NE(status["reason"].get<std::string>().find("restart"), std::string::npos);
  const RawResponse again = Push(3);
  EXPECT_EQ(again.status, 503) << again.body;
  EXPECT_EQ(Error(again)["code"], "UNAVAILABLE");
  EXPECT_EQ(Call("GET", "/v1/models/m/versions/1").status, 200);
  const RawResponse metrics = Call("GET", "/metrics");
  EXPECT_NE(metrics.body.find("ckptd_storage_writes{state=\"read_only\"} 1"), std::string::npos);
}

TEST_F(HttpFaultTest, AFailedReadNeverSendsWrongBytesAndTheNextReadWorks) {
  const std::string body = drift_.Next();
  ASSERT_EQ(Call("PUT", "/v1/models/m/versions/1", body).status, 201);
  ASSERT_TRUE(store_->Flush().ok());
  ASSERT_NO_FATAL_FAILURE(Start());  // empty caches: the restore reads the files
  FaultyFileSystem::Fault fault;
  fault.op = Op::kRead;
  fault.no_space = false;
  fault.failures = 1;
  fs_->Arm(fault);
  const RawResponse restored = Call("GET", "/v1/models/m/versions/1");
  ASSERT_GT(fs_->failed(), 0u);
  // Failed before the headers: 500 with the error body. After them: the body stops short of
  // its Content-Length. Or the engine retried the read: the exact bytes.
  if (restored.status == 500) {
    EXPECT_EQ(Error(restored)["code"], "IO_ERROR");
  } else if (restored.error.empty()) {
    EXPECT_EQ(restored.status, 200);
    EXPECT_EQ(Sha256Hex(restored.body), Sha256Hex(body));
  }
  const RawResponse again = Call("GET", "/v1/models/m/versions/1");
  EXPECT_EQ(again.status, 200);
  EXPECT_EQ(Sha256Hex(again.body), Sha256Hex(body));
}

}  // namespace
}  // namespace ckpt::testing
