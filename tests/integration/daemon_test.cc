// Integration tests: the real ckptd on an ephemeral loopback port with a temporary data
// directory, driven through the C++ client library and raw HTTP.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "ckpt/client/client.h"
#include "daemon_process.h"
#include "raw_http.h"
#include "store_inspection.h"
#include "test_support.h"

namespace ckpt {
namespace {

using testing::DaemonProcess;
using testing::DriftingModel;
using testing::RawHttp;
using testing::Sha256Hex;
using testing::TempDir;

class DaemonTest : public ::testing::Test {
 protected:
  void StartDaemon(std::vector<std::string> args = {}) {
    daemon_ = std::make_unique<DaemonProcess>(CKPTD_BINARY, dir_.path(), std::move(args));
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
    ClientOptions options;
    options.server = daemon_->url();
    client_ = std::make_unique<Client>(std::move(Client::Create(options)).value());
  }

  // A failed test shows what the daemon logged (sanitizer reports included) before its
  // temporary directory is removed.
  void TearDown() override {
    if (HasFailure() && daemon_) std::cerr << "---- ckptd log ----\n" << daemon_->log();
  }

  void ExpectServing() {
    RawHttp http(daemon_->port());
    ASSERT_TRUE(http.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
    EXPECT_EQ(http.Read().status, 200);
  }

  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<Client> client_;
};

// Several daemons of one deployment may be listed; each request goes to the first that
// accepts a connection.
TEST_F(DaemonTest, ClientsFailOverToTheNextListedServer) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  // A port nothing listens on: bound for a moment, then released.
  uint16_t dead = 0;
  {
    boost::asio::io_context ioc;
    boost::asio::ip::tcp::acceptor acceptor(ioc, {boost::asio::ip::make_address("127.0.0.1"), 0});
    dead = acceptor.local_endpoint().port();
  }
  const std::string dead_url = "http://127.0.0.1:" + std::to_string(dead);
  ClientOptions options;
  options.server = dead_url + "," + daemon_->url();
  auto client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_EQ(client->endpoints().size(), 2u);
  DriftingModel model(3, 5000);
  const std::string body = model.Next();
  auto pushed = client->PushBuffer("failover", 1, body);
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  auto pulled = client->PullToBuffer("failover", "latest");
  ASSERT_TRUE(pulled.ok()) << pulled.status().ToString();
  EXPECT_EQ(Sha256Hex(*pulled), Sha256Hex(body));
  EXPECT_TRUE(client->ListModels().ok());

  options.server = dead_url + "," + dead_url;
  auto none = Client::Create(options)->ListModels();
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("no server reachable"), std::string::npos)
      << none.status().ToString();
  for (const char* bad : {"http://a:1,https://b:2", "http://a:1,", "http://a:1,ftp://b:2"}) {
    options.server = bad;
    EXPECT_EQ(Client::Create(options).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST_F(DaemonTest, FortyVersionsRestoreIdenticalAcrossRestartAndDeletes) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  DriftingModel model(42, 200000);  // ~800 KB of F32 weights plus F16/BF16/I64/BOOL tensors
  std::map<uint64_t, std::string> sha;
  for (uint64_t step = 1; step <= 40; ++step) {
    std::string body = model.Next();
    auto r = client_->PushBuffer("llm-run", step * 100, body);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    sha[step * 100] = Sha256Hex(body);
    EXPECT_EQ(r->sha256, sha[step * 100]);
  }
  auto verify_all = [&] {
    for (const auto& [version, digest] : sha) {
      auto body = client_->PullToBuffer("llm-run", std::to_string(version));
      ASSERT_TRUE(body.ok()) << version << ": " << body.status().ToString();
      ASSERT_EQ(Sha256Hex(*body), digest) << version;
    }
    auto latest = client_->PullToBuffer("llm-run", "latest");
    ASSERT_TRUE(latest.ok());
    EXPECT_EQ(Sha256Hex(*latest), sha.rbegin()->second);
  };
  verify_all();
  auto info = client_->GetModel("llm-run");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->version_count, 40u);
  EXPECT_LT(info->stored_bytes, info->raw_bytes);

  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->log();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  verify_all();

  for (uint64_t v : {100, 1700, 2500, 2600, 4000}) {
    ASSERT_TRUE(client_->DeleteVersion("llm-run", v).ok());
    sha.erase(v);
  }
  verify_all();
  EXPECT_EQ(client_->PullToBuffer("llm-run", "2500").status().code(), StatusCode::kNotFound);
}

// A pointwise-relative override (as for optimizer moments) next to an absolute bound: every
// element within its own bound across versions, and ?detail=1 says which bound each tensor has.
TEST_F(DaemonTest, PointwiseBoundOverrideHoldsAndIsReported) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(client_
                  ->SetPolicy("moments", R"({"mode":"lossy","max_abs_error":1e-3,
                      "lossless_tensors":[],
                      "overrides":[{"tensors":"layer1.bias","max_pointwise_rel_error":0.01}]})")
                  .ok());
  DriftingModel model(45, 20000);
  std::vector<std::string> bodies;
  for (int v = 1; v <= 6; ++v) {
    bodies.push_back(model.Next());
    ASSERT_TRUE(client_->PushBuffer("moments", v, bodies.back()).ok());
  }
  for (size_t v = 1; v <= bodies.size(); ++v) {
    auto body = client_->PullToBuffer("moments", std::to_string(v));
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    auto check = testing::CheckWithinBound(bodies[v - 1], *body, 1e-3, {{"layer1.bias", 0.01}});
    ASSERT_EQ(check.error, "") << "version " << v;
  }
  RawHttp http(daemon_->port());
  ASSERT_TRUE(http.Send("GET /v1/models/moments/versions/6?detail=1 HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto reply = http.Read();
  ASSERT_EQ(reply.status, 200) << reply.body;
  auto doc = nlohmann::json::parse(reply.body);
  int seen = 0;
  for (const auto& t : doc["tensors"]) {
    if (t["name"] == "layer1.bias") {
      EXPECT_EQ(t["quantizer"], "log");
      EXPECT_EQ(t["max_pointwise_rel_error"], 0.01);
      EXPECT_FALSE(t.contains("max_abs_error"));
      ++seen;
    } else if (t["name"] == "layer1.weight") {
      EXPECT_EQ(t["max_abs_error"], 1e-3);
      ++seen;
    }
  }
  EXPECT_EQ(seen, 2);
}

// After a restart the next push of a lossless model is a delta, whether the daemon restored each
// model's latest version into memory before it reported ready (storage.warm_cache_on_start) or
// the push decodes its reference from storage.
TEST_F(DaemonTest, RestartWarmsTheCacheSoTheNextPushIsADelta) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  // A chain longer than the pushes: every push after the first is a delta when it can be.
  ASSERT_TRUE(client_->SetPolicy("warm", R"({"mode":"lossless","keyframe_every":16})").ok());
  DriftingModel model(44, 50000);
  for (uint64_t v = 1; v <= 3; ++v) {
    auto r = client_->PushBuffer("warm", v, model.Next());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  ASSERT_EQ(daemon_->Stop(), 0) << daemon_->log();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());  // ready = warmed
  auto warm = client_->PushBuffer("warm", 4, model.Next());
  ASSERT_TRUE(warm.ok()) << warm.status().ToString();
  EXPECT_EQ(warm->kind, "delta");

  const auto config = dir_.path() / "no-warmup.toml";
  std::ofstream(config) << "[storage]\nwarm_cache_on_start = false\n";
  ASSERT_EQ(daemon_->Stop(), 0) << daemon_->log();
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--config", config.string()}));
  auto cold = client_->PushBuffer("warm", 5, model.Next());
  ASSERT_TRUE(cold.ok()) << cold.status().ToString();
  EXPECT_EQ(cold->kind, "delta");
  for (uint64_t v = 1; v <= 5; ++v)
    EXPECT_TRUE(client_->PullToBuffer("warm", std::to_string(v)).ok());
}

// The lossy guarantee through the real daemon: every version within the bound, across a restart
// (the closed loop continues from the stored chain), with per-tensor detail over HTTP.
TEST_F(DaemonTest, LossyVersionsStayWithinBoundAcrossRestart) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const double bound = 1e-3;
  auto bad = client_->SetPolicy("lossy-run", R"({"mode":"lossy","max_abs_error":-1})");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("max_abs_error"), std::string::npos);
  ASSERT_TRUE(
      client_
          ->SetPolicy("lossy-run", R"({"mode":"lossy","max_abs_error":1e-3,"lossless_tensors":[]})")
          .ok());
  DriftingModel model(43, 100000);
  std::vector<std::string> bodies;
  auto push = [&](int count) {
    for (int i = 0; i < count; ++i) {
      bodies.push_back(model.Next());
      auto r = client_->PushBuffer("lossy-run", bodies.size(), bodies.back());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    }
  };
  auto verify_all = [&] {
    for (size_t v = 1; v <= bodies.size(); ++v) {
      auto body = client_->PullToBuffer("lossy-run", std::to_string(v));  // SHA-256 checked
      ASSERT_TRUE(body.ok()) << v << ": " << body.status().ToString();
      auto check = testing::CheckWithinBound(bodies[v - 1], *body, bound);
      ASSERT_EQ(check.error, "") << "version " << v;
      EXPECT_GT(check.inexact_tensors, 0u);
    }
  };
  ASSERT_NO_FATAL_FAILURE(push(10));
  verify_all();
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->log();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_NO_FATAL_FAILURE(push(10));
  verify_all();

  RawHttp http(daemon_->port());
  ASSERT_TRUE(
      http.Send("GET /v1/models/lossy-run/versions/11?detail=1 HTTP/1.1\r\nHost: x\r\n\r\n"));
  auto reply = http.Read();
  ASSERT_EQ(reply.status, 200) << reply.body;
  auto doc = nlohmann::json::parse(reply.body);
  EXPECT_EQ(doc["lossy"], true);
  bool saw_weight = false;
  for (const auto& t : doc["tensors"]) {
    if (t["name"] != "layer1.weight") continue;
    saw_weight = true;
    EXPECT_EQ(t["codec"], "lossy");
    EXPECT_EQ(t["kind"], "delta") << "the chain continued after the restart";
    EXPECT_EQ(t["max_abs_error"], bound);
    EXPECT_LT(t["bits_per_element"].get<double>(), 8.0);
  }
  EXPECT_TRUE(saw_weight);
}

TEST_F(DaemonTest, MalformedTruncatedAndInvalidRequestsGetPrecise4xxAndChangeNothing) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--config", CKPT_TEST_SMALL_LIMITS_CONFIG}));
  DriftingModel model(7, 1000);
  std::string good = model.Next();
  ASSERT_TRUE(client_->PushBuffer("m", 1, good).ok());

  struct Case {
    std::string name;
    std::string target;
    std::string body;
    int status;
    std::string message;
  };
  std::string bad_json = model.Next();
  bad_json[bad_json.find(':')] = '#';
  std::string short_body = model.Next();
  short_body.resize(short_body.size() - 10);
  std::string unknown_dtype = model.Next();
  auto pos = unknown_dtype.find("\"F32\"");
  unknown_dtype.replace(pos, 5, "\"F31\"");
  std::vector<Case> cases = {
      {"invalid json", "/v1/models/m/versions/2", bad_json, 400, "invalid header JSON"},
      {"truncated", "/v1/models/m/versions/2", short_body, 400, "runs past the end"},
      {"unknown dtype", "/v1/models/m/versions/2", unknown_dtype, 400, "unknown dtype 'F31'"},
      {"stale version", "/v1/models/m/versions/1", good, 409, "latest version 1"},
      {"bad version", "/v1/models/m/versions/1x", good, 400, "not a decimal"},
      {"bad name", "/v1/models/bad!name/versions/2", good, 400, "invalid model name"},
      {"too large", "/v1/models/m/versions/2", std::string(3 << 20, 'x'), 413, "exceeds"},
  };
  for (const auto& c : cases) {
    RawHttp http(daemon_->port());
    ASSERT_TRUE(http.Send(testing::PutHeader(c.target, c.body.size())));
    http.Send(c.body);
    auto r = http.Read();
    EXPECT_EQ(r.status, c.status) << c.name << ": " << r.body << r.error;
    EXPECT_NE(r.body.find(c.message), std::string::npos) << c.name << ": " << r.body;
    ExpectServing();
  }
  auto versions = client_->ListVersions("m");
  ASSERT_TRUE(versions.ok());
  ASSERT_EQ(versions->size(), 1u);
  EXPECT_EQ(Sha256Hex(*client_->PullToBuffer("m", "1")), Sha256Hex(good));
}

TEST_F(DaemonTest, ChunkedBodiesAndExpectContinueAreHonoured) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  DriftingModel model(8, 50000);
  std::string v1 = model.Next(), v2 = model.Next();
  {
    RawHttp http(daemon_->port());
    std::string head =
        "PUT /v1/models/c/versions/1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    ASSERT_TRUE(http.Send(head + testing::Chunked(v1, 7777)));
    auto r = http.Read();
    EXPECT_EQ(r.status, 201) << r.body;
  }
  {
    RawHttp http(daemon_->port());
    ASSERT_TRUE(http.Send(testing::PutHeader("/v1/models/c/versions/2", v2.size(), true)));
    EXPECT_EQ(http.Read().status, 100);
    ASSERT_TRUE(http.Send(v2));
    EXPECT_EQ(http.Read().status, 201);
  }
  {
    // A refusal known from the headers arrives instead of 100 Continue, before any body.
    RawHttp http(daemon_->port());
    ASSERT_TRUE(http.Send(testing::PutHeader("/v1/models/c/versions/2", v2.size(), true)));
    auto r = http.Read();
    EXPECT_EQ(r.status, 409) << r.body;
  }
  {
    // A chunked body that ends early (terminating chunk after half the data).
    RawHttp http(daemon_->port());
    std::string head =
        "PUT /v1/models/c/versions/3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    ASSERT_TRUE(http.Send(head + testing::Chunked(model.Next().substr(0, v1.size() / 2), 4096)));
    auto r = http.Read();
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("truncated"), std::string::npos) << r.body;
  }
  EXPECT_EQ(Sha256Hex(*client_->PullToBuffer("c", "1")), Sha256Hex(v1));
  EXPECT_EQ(Sha256Hex(*client_->PullToBuffer("c", "latest")), Sha256Hex(v2));
  auto model_info = client_->GetModel("c");
  EXPECT_EQ(model_info->version_count, 2u);
}

TEST_F(DaemonTest, PushesToOneModelAreSerializedAndOtherModelsProceed) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  DriftingModel model(9, 200000);
  std::string body = model.Next();
  // Hold a push to "busy" open half-way through its body.
  // 100 Continue is the readiness signal: the daemon answers it after taking the model's lock.
  RawHttp holder(daemon_->port());
  ASSERT_TRUE(holder.Send(testing::PutHeader("/v1/models/busy/versions/1", body.size(), true)));
  ASSERT_EQ(holder.Read().status, 100);
  ASSERT_TRUE(holder.Send(std::string_view(body).substr(0, body.size() / 2)));
  // A second push to the same model waits for its turn (it gets no 100 Continue until then).
  std::string next = model.Next();
  Status second;
  std::thread waiter([&] {
    ClientOptions options;
    options.server = daemon_->url();
    second = Client::Create(options)->PushBuffer("busy", 2, next).status();
  });
  // Other models proceed in parallel.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      ClientOptions options;
      options.server = daemon_->url();
      auto c = Client::Create(options);
      DriftingModel m(100 + t, 20000);
      for (uint64_t v = 1; v <= 5; ++v) {
        if (c->PushBuffer("par" + std::to_string(t), v, m.Next()).ok()) ++ok;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 20);
  ASSERT_TRUE(holder.Send(std::string_view(body).substr(body.size() / 2)));
  EXPECT_EQ(holder.Read().status, 201);
  waiter.join();
  EXPECT_TRUE(second.ok()) << second.ToString();
  EXPECT_EQ(Sha256Hex(*client_->PullToBuffer("busy", "1")), Sha256Hex(body));
  EXPECT_EQ(Sha256Hex(*client_->PullToBuffer("busy", "2")), Sha256Hex(next));
}

// A push waiting for a busy model is woken by the model's release, not by a timer: it starts
// (gets its 100 Continue) within a few milliseconds of the first push's commit. The median of
// several rounds is compared: a poll every 20 ms would put it near 10 ms.
TEST_F(DaemonTest, AWaitingPushStartsAsSoonAsTheFirstCommits) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  DriftingModel model(14, 2000);
  // How many requests wait for their model's turn, from /metrics.
  const auto waiting = [&] {
    RawHttp http(daemon_->port());
    if (!http.Send("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")) return -1;
    const std::string body = http.Read().body;
    const std::string name = "\nckptd_requests_waiting_for_model ";
    const size_t at = body.find(name);
    return at == std::string::npos ? -1 : std::atoi(body.c_str() + at + name.size());
  };
  using Clock = std::chrono::steady_clock;
  std::vector<double> start_ms;
  for (uint64_t round = 0; round < 9; ++round) {
    const std::string first = model.Next(), second = model.Next();
    RawHttp holder(daemon_->port());
    ASSERT_TRUE(holder.Send(testing::PutHeader(
        "/v1/models/turns/versions/" + std::to_string(2 * round + 1), first.size(), true)));
    ASSERT_EQ(holder.Read().status, 100);
    ASSERT_TRUE(holder.Send(std::string_view(first).substr(0, first.size() - 1)));
    RawHttp next(daemon_->port());
    ASSERT_TRUE(next.Send(testing::PutHeader(
        "/v1/models/turns/versions/" + std::to_string(2 * round + 2), second.size(), true)));
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (waiting() != 1) ASSERT_LT(Clock::now(), deadline) << "the second push never waited";
    ASSERT_TRUE(holder.Send(std::string_view(first).substr(first.size() - 1)));
    ASSERT_EQ(holder.Read().status, 201);
    const auto committed = Clock::now();
    ASSERT_EQ(next.Read().status, 100);
    start_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - committed).count());
    ASSERT_TRUE(next.Send(second));
    ASSERT_EQ(next.Read().status, 201);
  }
  std::sort(start_ms.begin(), start_ms.end());
  EXPECT_LT(start_ms[start_ms.size() / 2], 4.0)
      << "median ms from the first push's 201 to the second's 100 Continue; slowest "
      << start_ms.back();
  EXPECT_EQ(waiting(), 0);
}

TEST_F(DaemonTest, PushWaitingLongerThanPushWaitGets409Aborted) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon({"--config", CKPT_TEST_SMALL_LIMITS_CONFIG}));  // 1 s wait
  DriftingModel model(12, 1000);
  std::string body = model.Next();
  RawHttp holder(daemon_->port());
  ASSERT_TRUE(holder.Send(testing::PutHeader("/v1/models/w/versions/1", body.size(), true)));
  ASSERT_EQ(holder.Read().status, 100);
  RawHttp second(daemon_->port());
  ASSERT_TRUE(second.Send(testing::PutHeader("/v1/models/w/versions/2", body.size(), true)));
  auto r = second.Read();
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_NE(r.body.find("ABORTED"), std::string::npos) << r.body;
  ASSERT_TRUE(holder.Send(body));
  EXPECT_EQ(holder.Read().status, 201);
}

TEST_F(DaemonTest, KillDuringPushLeavesNoVersionAndNoDataAfterRestart) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  DriftingModel model(10, 2000000);  // ~8 MB per checkpoint: several chunks per push
  std::vector<std::string> bodies;
  for (uint64_t v = 1; v <= 3; ++v) {
    bodies.push_back(model.Next());
    ASSERT_TRUE(client_->PushBuffer("k", v, bodies.back()).ok());
  }
  ASSERT_EQ(daemon_->Stop(), 0);
  const size_t chunks_before = testing::CountKeys(daemon_->data_dir().string(), "chunks");
  ASSERT_GT(chunks_before, 0u);
  ASSERT_NO_FATAL_FAILURE(StartDaemon());

  std::string next = model.Next();
  {
    RawHttp http(daemon_->port());
    ASSERT_TRUE(http.Send(testing::PutHeader("/v1/models/k/versions/4", next.size(), true)));
    ASSERT_EQ(http.Read().status, 100);  // the push has begun
    ASSERT_TRUE(http.Send(std::string_view(next).substr(0, next.size() * 3 / 4)));
    daemon_->Kill();
  }
  const size_t chunks_after_crash = testing::CountKeys(daemon_->data_dir().string(), "chunks");
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  EXPECT_EQ(client_->PullToBuffer("k", "4").status().code(), StatusCode::kNotFound);
  for (uint64_t v = 1; v <= 3; ++v) {
    auto body = client_->PullToBuffer("k", std::to_string(v));
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    EXPECT_EQ(Sha256Hex(*body), Sha256Hex(bodies[v - 1]));
  }
  ASSERT_EQ(daemon_->Stop(), 0);
  EXPECT_GE(chunks_after_crash, chunks_before);  // the crash did leave partial data behind ...
  EXPECT_EQ(testing::CountKeys(daemon_->data_dir().string(), "chunks"), chunks_before);  // ... gone
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  ASSERT_TRUE(client_->PushBuffer("k", 4, next).ok());
  EXPECT_EQ(Sha256Hex(*client_->PullToBuffer("k", "latest")), Sha256Hex(next));
}

TEST_F(DaemonTest, HeadReturnsHeadersWithoutBody) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  DriftingModel model(11, 1000);
  std::string body = model.Next();
  ASSERT_TRUE(client_->PushBuffer("h", 3, body).ok());
  RawHttp http(daemon_->port());
  ASSERT_TRUE(
      http.Send("HEAD /v1/models/h/versions/latest HTTP/1.1\r\nHost: x\r\n\r\n"
                "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
  // The HEAD response carries Content-Length but no body, so the pipelined GET follows directly.
  auto head = http.ReadHead();
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.content_length, body.size());
  EXPECT_EQ(head.sha256, Sha256Hex(body));
  auto health = http.Read();
  EXPECT_EQ(health.status, 200) << health.error;
}

}  // namespace
}  // namespace ckpt

namespace ckpt {
namespace {

TEST_F(DaemonTest, ShutdownClosesIdleKeepAliveConnectionsPromptlyAndExitsCleanly) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  RawHttp idle(daemon_->port());
  ASSERT_TRUE(idle.Send("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_EQ(idle.Read().status, 200);  // the connection stays open (keep-alive), idle
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(daemon_->Stop(), 0) << daemon_->log();
  // Well under the 30 s idle timeout and the 30 s shutdown grace.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace ckpt
