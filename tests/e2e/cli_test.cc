// End-to-end tests of the `ckpt` CLI against a real ckptd.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/base/safetensors.h"
#include "daemon_process.h"
#include "flaky_proxy.h"
#include "raw_http.h"
#include "test_support.h"

namespace ckpt {
namespace {

using nlohmann::json;
using testing::DaemonProcess;
using testing::DriftingModel;
using testing::Sha256Hex;
using testing::TempDir;

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

class CliTest : public ::testing::Test {
 protected:
  // The passes that follow pushes (rearrangement, retention) are put off beyond any test: what
  // the tests see deleted is what their own commands deleted, however slow the build (a pass
  // due a second after the last push would otherwise apply a policy a test set meanwhile).
  void SetUp() override {
    const auto config = dir_.path() / "cli_test.toml";
    std::ofstream(config) << "[storage]\nrearrange_delay_ms = 3600000\n";
    daemon_ = std::make_unique<DaemonProcess>(
        CKPTD_BINARY, dir_.path(), std::vector<std::string>{"--config", config.string()});
    ASSERT_TRUE(daemon_->Start()) << daemon_->log();
  }

  // The JSON a command prints with --json (stdout only); fails the test if it is not JSON.
  json RunJson(const std::string& args, const std::string& server = "") {
    const std::string cmd = "CKPT_SERVER=" + (server.empty() ? daemon_->url() : server) + " " +
                            CKPT_CLI_BINARY + " --json " + args + " 2>/dev/null";
    std::string out;
    FILE* pipe = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
    pclose(pipe);
    json doc = json::parse(out, nullptr, false);
    EXPECT_FALSE(doc.is_discarded()) << args << ": " << out;
    return doc;
  }

  CommandResult Run(const std::string& args, const std::string& server = "") {
    const std::string cmd = "CKPT_SERVER=" + (server.empty() ? daemon_->url() : server) + " " +
                            CKPT_CLI_BINARY + " " + args + " 2>&1";
    CommandResult r;
    FILE* pipe = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
    int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  }

  std::string WriteFile(const std::string& name, const std::string& bytes) {
    auto path = (dir_.path() / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  TempDir dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(CliTest, PushListPullRemoveAndPolicy) {
  DriftingModel model(1, 100000);
  std::vector<std::string> files;
  for (int v = 1; v <= 3; ++v) {
    files.push_back(WriteFile("v" + std::to_string(v) + ".safetensors", model.Next()));
    auto r = Run("push resnet " + std::to_string(v * 10) + " " + files.back());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("pushed resnet@" + std::to_string(v * 10)), std::string::npos);
  }
  auto ls = Run("ls");
  ASSERT_EQ(ls.exit_code, 0) << ls.output;
  EXPECT_NE(ls.output.find("resnet"), std::string::npos);
  auto versions = Run("ls resnet");
  ASSERT_EQ(versions.exit_code, 0);
  EXPECT_NE(versions.output.find("keyframe"), std::string::npos);
  EXPECT_NE(versions.output.find("delta"), std::string::npos);

  const std::string out = (dir_.path() / "restored.safetensors").string();
  auto pull = Run("pull resnet latest -o " + out);
  ASSERT_EQ(pull.exit_code, 0) << pull.output;
  EXPECT_NE(pull.output.find("(verified)"), std::string::npos);
  EXPECT_EQ(Sha256Hex(ReadFile(out)), Sha256Hex(ReadFile(files[2])));
  ASSERT_EQ(Run("pull resnet 10 -o " + out).exit_code, 0);
  EXPECT_EQ(Sha256Hex(ReadFile(out)), Sha256Hex(ReadFile(files[0])));

  auto policy = Run("policy resnet '{\"keyframe_every\":3}'");
  ASSERT_EQ(policy.exit_code, 0) << policy.output;
  EXPECT_EQ(RunJson("policy resnet")["keyframe_every"], 3);

  ASSERT_EQ(Run("rm resnet 10").exit_code, 0);
  EXPECT_EQ(Run("pull resnet 10 -o " + out).exit_code, 1);
  ASSERT_EQ(Run("pull resnet 20 -o " + out).exit_code, 0);
  EXPECT_EQ(Sha256Hex(ReadFile(out)), Sha256Hex(ReadFile(files[1])));
  ASSERT_EQ(Run("rm resnet --yes").exit_code, 0);
  EXPECT_EQ(Run("ls resnet").exit_code, 1);
}

// The CLI with a lossy model: pull verifies the SHA-256 of what the server sends (the
// reconstruction), and every restored element is within the bound.
TEST_F(CliTest, LossyPolicyPushAndVerifiedPull) {
  auto bad = Run("policy llm '{\"mode\":\"lossy\"}'");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("max_abs_error"), std::string::npos) << bad.output;
  ASSERT_EQ(Run("policy llm '{\"mode\":\"lossy\",\"max_abs_error\":1e-3}'").exit_code, 0);
  DriftingModel model(3, 50000);
  std::vector<std::string> bodies;
  for (int v = 1; v <= 3; ++v) {
    bodies.push_back(model.Next());
    const std::string file = WriteFile("l" + std::to_string(v) + ".safetensors", bodies.back());
    auto r = Run("push llm " + std::to_string(v) + " " + file);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // Said lossy, with the file's own hash (what sha256sum prints).
    EXPECT_NE(r.output.find(" lossy  raw"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("sha256 " + Sha256Hex(bodies.back()).substr(0, 12)), std::string::npos)
        << r.output;
  }
  const std::string out = (dir_.path() / "lossy.safetensors").string();
  for (int v = 1; v <= 3; ++v) {
    auto pull = Run("pull llm " + std::to_string(v) + " -o " + out);
    ASSERT_EQ(pull.exit_code, 0) << pull.output;
    EXPECT_NE(pull.output.find("(verified)"), std::string::npos);
    if (v == 3) {  // the push said what the version restores to, as ls shows it
      const std::string restored = Sha256Hex(ReadFile(out)).substr(0, 12);
      EXPECT_NE(Run("ls llm").output.find(restored), std::string::npos);
      const std::string again = WriteFile("l4.safetensors", bodies.back());
      EXPECT_NE(Run("push llm 4 " + again).output.find("restores to "), std::string::npos);
    }
    auto check = testing::CheckWithinBound(bodies[v - 1], ReadFile(out), 1e-3);
    EXPECT_EQ(check.error, "") << v;
    EXPECT_GT(check.inexact_tensors, 0u);
  }
}

// push --encoded codes the file here: the wire carries what is stored, the version restores to
// the reconstruction the client keeps, which is the next push's reference; a client without it
// (another reference directory, or a version pushed meanwhile by someone else) pulls the base.
TEST_F(CliTest, EncodedPushSendsWhatIsStoredAndKeepsItsReference) {
  ASSERT_EQ(Run("policy enc '{\"mode\":\"lossy\",\"max_abs_error\":1e-3}'").exit_code, 0);
  DriftingModel model(4, 60000);
  const std::string refs = (dir_.path() / "refs").string();
  std::vector<std::string> bodies;
  auto push = [&](int v, const std::string& extra) {
    bodies.push_back(model.Next());
    const std::string file = WriteFile("e" + std::to_string(v) + ".safetensors", bodies.back());
    return RunJson("push enc " + std::to_string(v) + " " + file + " " + extra);
  };
  for (int v = 1; v <= 3; ++v) {
    const json r = push(v, "--encoded --reference-dir " + refs);
    ASSERT_TRUE(r.is_object()) << r;
    EXPECT_TRUE(r["encoded"].get<bool>());
    EXPECT_EQ(r["reference"], v == 1 ? "" : "held") << r;
    EXPECT_LT(r["sent_bytes"].get<uint64_t>(), r["stored_bytes"].get<uint64_t>() + 1024) << r;
    EXPECT_LT(r["sent_bytes"].get<uint64_t>() * 3, r["raw_bytes"].get<uint64_t>()) << r;
    EXPECT_EQ(r["pushed_sha256"], Sha256Hex(bodies.back()));
  }
  const std::string out = (dir_.path() / "e3.restored").string();
  ASSERT_EQ(Run("pull enc 3 -o " + out).exit_code, 0);
  EXPECT_EQ(ReadFile(out), ReadFile(refs + "/enc.safetensors"));
  EXPECT_EQ(testing::CheckWithinBound(bodies[2], ReadFile(out), 1e-3).error, "");
  // Version 4 pushed without --encoded: the reference kept is no longer the base.
  ASSERT_EQ(push(4, "").value("encoded", true), false);
  const json fifth = push(5, "--encoded --reference-dir " + refs);
  EXPECT_EQ(fifth["reference"], "pulled") << fifth;
  const json sixth = push(6, "--encoded --reference-dir " + (dir_.path() / "other").string());
  EXPECT_EQ(sixth["reference"], "pulled") << sixth;
  const std::string last = (dir_.path() / "e6.restored").string();
  ASSERT_EQ(Run("pull enc 6 -o " + last).exit_code, 0);
  EXPECT_EQ(testing::CheckWithinBound(bodies[5], ReadFile(last), 1e-3).error, "");
}

// A kept reference that no longer restores the base (damaged on disk, its sidecar unchanged)
// is refused by the daemon as drifted; the push forgets it, pulls the base and goes through,
// and the version restores within its bound.
TEST_F(CliTest, AnEncodedPushWhoseReferenceIsDamagedPullsTheBaseOnce) {
  ASSERT_EQ(Run("policy dmg '{\"mode\":\"lossy\",\"max_abs_error\":1e-3}'").exit_code, 0);
  DriftingModel model(8, 60000);
  const std::string refs = (dir_.path() / "damaged-refs").string();
  std::string body;
  for (int v = 1; v <= 2; ++v) {
    body = model.Next();
    const std::string file = WriteFile("dmg" + std::to_string(v), body);
    ASSERT_EQ(
        Run("push dmg " + std::to_string(v) + " " + file + " --encoded --reference-dir " + refs)
            .exit_code,
        0);
  }
  const std::string held = refs + "/dmg.safetensors";
  std::string damaged = ReadFile(held);
  for (size_t i = damaged.size() - 4096; i < damaged.size() - 4000; ++i) damaged[i] ^= 0x5a;
  WriteFile(held, damaged);
  body = model.Next();
  const json third =
      RunJson("push dmg 3 " + WriteFile("dmg3", body) + " --encoded --reference-dir " + refs);
  ASSERT_TRUE(third.is_object()) << third;
  EXPECT_TRUE(third["encoded"].get<bool>()) << third;
  EXPECT_EQ(third["reference"], "pulled") << third;
  EXPECT_NE(third["reference_note"].get<std::string>().find("did not restore the base"),
            std::string::npos)
      << third;
  const std::string out = (dir_.path() / "dmg3.restored").string();
  ASSERT_EQ(Run("pull dmg 3 -o " + out).exit_code, 0);
  EXPECT_EQ(testing::CheckWithinBound(body, ReadFile(out), 1e-3).error, "");
  EXPECT_EQ(ReadFile(held), ReadFile(out)) << "the reference kept is the new version's";
  // One that is no longer a safetensors file at all: the same.
  WriteFile(held, "truncated");
  const json fourth = RunJson("push dmg 4 " + WriteFile("dmg4", model.Next()) +
                              " --encoded --reference-dir " + refs);
  ASSERT_TRUE(fourth.is_object()) << fourth;
  EXPECT_EQ(fourth["reference"], "pulled") << fourth;
}

// Options of the coding at the edge without --encoded, or with an output it cannot write, are
// usage errors that say so, not ignored.
TEST_F(CliTest, EncodedOptionsOutOfPlaceAreUsageErrors) {
  const std::string file = WriteFile("u1", DriftingModel(9, 1000).Next());
  const auto expect_usage = [&](const std::string& args, const std::string& says) {
    const auto r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << ": " << r.output;
  };
  expect_usage("push u 1 " + file + " --threads 2", "--threads goes with --encoded");
  expect_usage("push u 1 " + file + " --reference-dir x", "--reference-dir goes with --encoded");
  expect_usage("pull u latest -o x --reference-dir x", "--reference-dir goes with --encoded");
  expect_usage("pull u latest -o x --threads 2", "--threads goes with --encoded");
  expect_usage("pull u latest --hf-dir x --encoded", "not a Hugging Face view");
  expect_usage("pull u latest -o - --encoded", "not stdout");
  // A file that is not safetensors is named so, coded here or by the server.
  const std::string text = WriteFile("u.txt", "just a line of text\n");
  for (const std::string encoded : {"", " --encoded"}) {
    const auto r = Run("push u 1 " + text + encoded);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("not a safetensors file: header length"), std::string::npos)
        << encoded << ": " << r.output;
  }
  EXPECT_EQ(Run("ls u").exit_code, 1) << "nothing was pushed";
}

// The default reference directory is $XDG_CACHE_HOME/ckpt/references/HOST-PORT with the host
// in lower case, as the Python client names it, so that both find the same references.
TEST_F(CliTest, TheDefaultReferenceDirectoryNamesTheHostInLowerCase) {
  const std::string url = daemon_->url();
  const std::string port = url.substr(url.rfind(':') + 1);
  const std::filesystem::path cache = dir_.path() / "xdg-cache";
  const std::string file = WriteFile("lc1", DriftingModel(13, 2000).Next());
  const auto r = Run("push lc 1 " + file + " --encoded",
                     "http://LOCALHOST:" + port + " XDG_CACHE_HOME=" + cache.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(cache / "ckpt" / "references" / ("localhost-" + port) /
                                      "lc.safetensors"));
}

// A daemon that trusts its writers decodes nothing: the client checks the reference it holds
// before coding against it, and pulls the base again when it is damaged.
TEST_F(CliTest, AClientOfATrustingDaemonChecksItsReferenceItself) {
  const auto trusting_dir = dir_.path() / "trusting";
  std::filesystem::create_directories(trusting_dir);
  const auto config = trusting_dir / "trusting.toml";
  std::ofstream(config) << "[server]\ndecode_encoded_payloads = false\n"
                        << "[storage]\nrearrange_delay_ms = 3600000\n";
  DaemonProcess trusting(CKPTD_BINARY, trusting_dir,
                         std::vector<std::string>{"--config", config.string()});
  ASSERT_TRUE(trusting.Start()) << trusting.log();
  ASSERT_EQ(
      Run("policy tr '{\"mode\":\"lossy\",\"max_abs_error\":1e-3}'", trusting.url()).exit_code, 0);
  DriftingModel model(14, 60000);
  const std::string refs = (dir_.path() / "trusting-refs").string();
  const json first =
      RunJson("push tr 1 " + WriteFile("tr1", model.Next()) + " --encoded --reference-dir " + refs,
              trusting.url());
  ASSERT_TRUE(first.is_object()) << first;
  std::string held = ReadFile(refs + "/tr.safetensors");
  for (size_t i = held.size() / 2; i < held.size() / 2 + 4; ++i) held[i] ^= 0x5A;
  WriteFile(refs + "/tr.safetensors", held);
  const std::string body = model.Next();
  const json second = RunJson(
      "push tr 2 " + WriteFile("tr2", body) + " --encoded --reference-dir " + refs, trusting.url());
  ASSERT_TRUE(second.is_object()) << second;
  EXPECT_TRUE(second["encoded"].get<bool>()) << second;
  EXPECT_EQ(second["reference"], "pulled") << second;
  EXPECT_NE(second["reference_note"].get<std::string>().find("did not restore the base"),
            std::string::npos)
      << second;
  const std::string out = (dir_.path() / "tr2.restored").string();
  const auto pulled = Run("pull tr 2 -o " + out, trusting.url());
  ASSERT_EQ(pulled.exit_code, 0) << pulled.output;
  EXPECT_EQ(testing::CheckWithinBound(body, ReadFile(out), 1e-3).error, "");
}

// A held version that retention has since taken tensors from cannot be coded against: the pull
// receives the chains from their keyframes, and says it was not sent against the version held.
TEST_F(CliTest, AnEncodedPullSinceAVersionThatLostTensorsSaysItStartedFromKeyframes) {
  DriftingModel model(12, 60000);
  const std::string refs = (dir_.path() / "since-dropped").string();
  for (int v = 1; v <= 2; ++v) {
    ASSERT_EQ(Run("push sd " + std::to_string(v) + " " +
                  WriteFile("sd" + std::to_string(v), model.Next()))
                  .exit_code,
              0);
  }
  const std::string out = (dir_.path() / "sd.safetensors").string();
  const json first = RunJson("pull sd 1 -o " + out + " --encoded --reference-dir " + refs);
  ASSERT_TRUE(first.is_object()) << first;
  ASSERT_EQ(first["since_version"], 0);
  ASSERT_EQ(
      Run("retention sd "
          "'{\"keep_last\":5,\"tensor_rules\":[{\"tensors\":\"layer1.bias\",\"keep_last\":1}]}'"
          " --yes")
          .exit_code,
      0);
  ASSERT_EQ(Run("retention sd --apply").exit_code, 0);
  ASSERT_EQ(RunJson("ls sd")[0]["dropped_tensors"], 1) << RunJson("ls sd");
  const json second = RunJson("pull sd 2 -o " + out + " --encoded --reference-dir " + refs);
  ASSERT_TRUE(second.is_object()) << second;
  EXPECT_EQ(second["since_version"], 0) << second;
  const std::string full = (dir_.path() / "sd-full.safetensors").string();
  ASSERT_EQ(Run("pull sd 2 -o " + full).exit_code, 0);
  EXPECT_EQ(ReadFile(out), ReadFile(full));
  // The version pulled is the one held now: the next sync codes against it.
  ASSERT_EQ(Run("push sd 3 " + WriteFile("sd3", model.Next())).exit_code, 0);
  const json third = RunJson("pull sd 3 -o " + out + " --encoded --reference-dir " + refs);
  ASSERT_TRUE(third.is_object()) << third;
  EXPECT_EQ(third["since_version"], 2) << third;
}

// A client holding a newer version pulls an older one for no more than a client holding
// nothing receives, and keeps the newer one as its reference (the next push's base).
TEST_F(CliTest, AnEncodedPullOfAnOlderVersionKeepsTheNewerReference) {
  DriftingModel model(10, 60000);
  const std::string refs = (dir_.path() / "older-refs").string();
  for (int v = 1; v <= 6; ++v) {
    const std::string file = WriteFile("old" + std::to_string(v), model.Next());
    ASSERT_EQ(
        Run("push old " + std::to_string(v) + " " + file + " --encoded --reference-dir " + refs)
            .exit_code,
        0);
  }
  const std::string plain = (dir_.path() / "old1.plain").string();
  ASSERT_EQ(Run("pull old 1 -o " + plain).exit_code, 0);
  const json cold = RunJson("pull old 1 -o " + plain + ".cold --encoded --reference-dir " +
                            (dir_.path() / "empty-refs").string());
  const json held = RunJson("pull old 1 -o " + plain + ".held --encoded --reference-dir " + refs);
  ASSERT_TRUE(cold.is_object() && held.is_object()) << cold << held;
  EXPECT_EQ(ReadFile(plain + ".held"), ReadFile(plain));
  EXPECT_LE(held["received_bytes"].get<uint64_t>(),
            cold["received_bytes"].get<uint64_t>() + (4u << 10))
      << held;
  const json next = RunJson("push old 7 " + WriteFile("old7", model.Next()) +
                            " --encoded --reference-dir " + refs);
  ASSERT_TRUE(next.is_object()) << next;
  EXPECT_EQ(next["reference"], "held") << "version 6 is still the one kept: " << next;
}

// An encoded pull whose output is a link to the reference replaces the link, and the reference
// it keeps is still the version its sidecar names: the next push codes against the right base.
TEST_F(CliTest, AnEncodedPullThroughALinkToTheReferenceKeepsItTrue) {
  ASSERT_EQ(Run("policy lnk '{\"mode\":\"lossy\",\"max_abs_error\":1e-3}'").exit_code, 0);
  DriftingModel model(6, 60000);
  const std::string refs = (dir_.path() / "link-refs").string();
  std::vector<std::string> bodies;
  for (int v = 1; v <= 2; ++v) {
    bodies.push_back(model.Next());
    const std::string file = WriteFile("lnk" + std::to_string(v), bodies.back());
    ASSERT_EQ(
        Run("push lnk " + std::to_string(v) + " " + file + " --encoded --reference-dir " + refs)
            .exit_code,
        0);
  }
  const std::string older = (dir_.path() / "lnk1.restored").string();
  ASSERT_EQ(Run("pull lnk 1 -o " + older + " --encoded --reference-dir " + refs).exit_code, 0);
  const std::filesystem::path link = dir_.path() / "lnk.link";
  std::filesystem::create_symlink(refs + "/lnk.safetensors", link);
  ASSERT_EQ(Run("pull lnk 2 -o " + link.string() + " --encoded --reference-dir " + refs).exit_code,
            0);
  EXPECT_EQ(Sha256Hex(ReadFile(refs + "/lnk.safetensors")), Sha256Hex(ReadFile(link.string())));
  bodies.push_back(model.Next());
  const json third = RunJson("push lnk 3 " + WriteFile("lnk3", bodies.back()) +
                             " --encoded --reference-dir " + refs);
  ASSERT_TRUE(third.is_object()) << third;
  EXPECT_EQ(third["reference"], "held") << third;
  const std::string out = (dir_.path() / "lnk3.restored").string();
  ASSERT_EQ(Run("pull lnk 3 -o " + out).exit_code, 0);
  EXPECT_EQ(testing::CheckWithinBound(bodies[2], ReadFile(out), 1e-3).error, "");
}

// Followers track a run by encoded pulls: each version's sync receives about what the version
// stored, and every follower ends with the bytes a full restore sends.
TEST_F(CliTest, FollowersSyncEachVersionByItsStoredDelta) {
  ASSERT_EQ(Run("policy run '{\"mode\":\"lossy\",\"max_abs_error\":1e-3}'").exit_code, 0);
  DriftingModel model(6, 60000);
  const std::string writer = (dir_.path() / "writer").string();
  constexpr int kFollowers = 4;
  for (int v = 1; v <= 10; ++v) {
    const std::string file = WriteFile("c" + std::to_string(v), model.Next());
    const json pushed = RunJson("push run " + std::to_string(v) + " " + file +
                                " --encoded --reference-dir " + writer);
    ASSERT_TRUE(pushed.is_object()) << pushed;
    const uint64_t stored = pushed["stored_bytes"].get<uint64_t>();
    for (int f = 0; f < kFollowers; ++f) {
      const std::string out =
          (dir_.path() / ("follower" + std::to_string(f) + ".safetensors")).string();
      const json pulled =
          RunJson("pull run " + std::to_string(v) + " -o " + out + " --encoded --reference-dir " +
                  (dir_.path() / ("f" + std::to_string(f))).string());
      ASSERT_TRUE(pulled.is_object()) << pulled;
      EXPECT_EQ(pulled["since_version"].get<uint64_t>(), static_cast<uint64_t>(v - 1));
      // The names the Python client answers with, too.
      EXPECT_EQ(pulled["model"], "run");
      EXPECT_EQ(pulled["file"], out);
      EXPECT_GT(pulled["restored_bytes"].get<uint64_t>(), pulled["received_bytes"].get<uint64_t>());
      // The version's records, its header and the framing.
      EXPECT_LE(pulled["received_bytes"].get<uint64_t>(), stored * 11 / 10 + 1024)
          << "version " << v << ", follower " << f;
    }
  }
  const std::string full = (dir_.path() / "full.safetensors").string();
  ASSERT_EQ(Run("pull run 10 -o " + full).exit_code, 0);
  for (int f = 0; f < kFollowers; ++f) {
    EXPECT_EQ(ReadFile((dir_.path() / ("follower" + std::to_string(f) + ".safetensors")).string()),
              ReadFile(full))
        << f;
  }
}

TEST_F(CliTest, TagsMetricsRetentionGcScrubAndBackup) {
  DriftingModel model(3, 20000);
  std::vector<std::string> sha;
  for (int v = 1; v <= 5; ++v) {
    const std::string body = model.Next();
    sha.push_back(Sha256Hex(body));
    const std::string file = WriteFile("v" + std::to_string(v) + ".safetensors", body);
    std::string args = "push run " + std::to_string(v) + " " + file +
                       " --metric loss=" + std::to_string(10 - v) + " --label 'host=node 7'";
    if (v == 2) args += " --tag release";
    const json r = RunJson(args);
    ASSERT_TRUE(r.is_object()) << args;
    // What the server answered, as `ls` and Python's push show it.
    EXPECT_EQ(r["metrics"]["loss"], 10 - v) << r;
    EXPECT_EQ(r["labels"]["host"], "node 7") << r;
    EXPECT_EQ(r["tags"], v == 2 ? json::array({"release"}) : json::array()) << r;
    EXPECT_FALSE(r["created_at"].get<std::string>().empty()) << r;
    EXPECT_GT(r["tensor_count"].get<uint32_t>(), 0u) << r;
  }
  const std::string out = (dir_.path() / "release.safetensors").string();
  auto pull = Run("pull run tag:release -o " + out);
  ASSERT_EQ(pull.exit_code, 0) << pull.output;
  EXPECT_EQ(Sha256Hex(ReadFile(out)), sha[1]);
  EXPECT_EQ(Run("tag run 4 candidate").exit_code, 0);
  EXPECT_EQ(Run("tag run 4 candidate --remove").exit_code, 0);
  EXPECT_NE(Run("tag run 4 candidate --remove").exit_code, 0);

  auto set = Run("retention run '{\"keep_last\":2}' --yes");
  ASSERT_EQ(set.exit_code, 0) << set.output;
  auto preview = Run("retention run --preview");
  ASSERT_EQ(preview.exit_code, 0) << preview.output;
  EXPECT_NE(preview.output.find("would delete"), std::string::npos) << preview.output;
  EXPECT_EQ(RunJson("retention run --preview")["deleted"], json::parse("[1,3]"));
  auto gc = Run("gc");
  ASSERT_EQ(gc.exit_code, 0) << gc.output;
  EXPECT_NE(gc.output.find("2 version(s) deleted"), std::string::npos) << gc.output;
  std::set<uint64_t> kept;
  for (const auto& v : RunJson("ls run")) kept.insert(v["version"].get<uint64_t>());
  EXPECT_EQ(kept, (std::set<uint64_t>{2, 4, 5}));
  auto ls = Run("ls run");
  EXPECT_NE(ls.output.find("release loss=8"), std::string::npos) << ls.output;
  auto scrub = Run("scrub");
  EXPECT_EQ(scrub.exit_code, 0) << scrub.output;
  EXPECT_NE(scrub.output.find("clean"), std::string::npos) << scrub.output;
  EXPECT_EQ(RunJson("scrub")["clean"], true);
  auto backup = RunJson("backup " + (dir_.path() / "backups").string());
  EXPECT_EQ(backup["backup_id"], 1) << backup.dump();
  EXPECT_NE(Run("push run 9 " + WriteFile("x", model.Next()) + " --metric loss").exit_code, 0);
}

TEST_F(CliTest, ErrorsAreOneLineAndNonZero) {
  DriftingModel model(2, 1000);
  const std::string good = WriteFile("good.safetensors", model.Next());
  ASSERT_EQ(Run("push m 5 " + good).exit_code, 0);

  auto expect_error = [&](const CommandResult& r, const std::string& part) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(part), std::string::npos) << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  };
  expect_error(Run("push m 5 " + good), "must be greater than the latest version 5");
  expect_error(Run("pull m 6 -o " + (dir_.path() / "x").string()), "has no version 6");
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "x"));
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "x.partial"));
  std::string broken = ReadFile(good);
  broken.resize(broken.size() / 2);
  expect_error(Run("push m 7 " + WriteFile("broken.safetensors", broken)), "safetensors");
  expect_error(Run("push bad/name 7 " + good), "invalid model name");
  expect_error(Run("ls", "http://127.0.0.1:1"), "connecting");
  expect_error(Run("ls", "ftp://nowhere"), "must start with http://");
  // A wrong command line is one line too, exit 2.
  const auto usage = Run("push m 8 " + (dir_.path() / "no-such-file").string());
  expect_error(usage, "File does not exist");
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_EQ(Run("pull m latest").exit_code, 2);
  // An empty $CKPT_SERVER is no setting: the default server is asked.
  const std::string cmd = "CKPT_SERVER= " + std::string(CKPT_CLI_BINARY) + " ls 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  pclose(pipe);
  EXPECT_EQ(out.find("no server URL"), std::string::npos) << out;
}

// Against a daemon with tokens: the CLI sends $CKPT_TOKEN or the --token-file's token.
TEST(CliAuthTest, TokenFromEnvironmentOrFile) {
  TempDir dir;
  const auto config = dir.path() / "auth.toml";
  std::ofstream(config) << "[[auth.tokens]]\nname = \"ci\"\nsha256 = \"" << Sha256Hex("s3cret")
                        << "\"\nscope = \"write\"\n";
  DaemonProcess daemon(CKPTD_BINARY, dir.path(), {"--config", config.string()});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  auto run = [&](const std::string& env, const std::string& args) {
    const std::string cmd =
        env + " CKPT_SERVER=" + daemon.url() + " " + CKPT_CLI_BINARY + " " + args + " 2>&1";
    CommandResult r;
    FILE* pipe = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) r.output.append(buf, n);
    const int status = pclose(pipe);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  };
  DriftingModel model(2, 1000);
  const auto body = (dir.path() / "v.safetensors").string();
  std::ofstream(body, std::ios::binary) << model.Next();
  auto refused = run("", "push m 1 " + body);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("Authorization"), std::string::npos) << refused.output;
  auto wrong = run("CKPT_TOKEN=nope", "ls");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("not valid"), std::string::npos) << wrong.output;
  auto pushed = run("CKPT_TOKEN=s3cret", "push m 1 " + body);
  ASSERT_EQ(pushed.exit_code, 0) << pushed.output;
  const auto token_file = (dir.path() / "token").string();
  std::ofstream(token_file) << "s3cret\n";
  auto listed = run("", "--token-file " + token_file + " ls m");
  ASSERT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_NE(listed.output.find("1"), std::string::npos);
  auto gc = run("CKPT_TOKEN=s3cret", "gc");
  EXPECT_NE(gc.exit_code, 0) << "gc needs admin";
  EXPECT_NE(gc.output.find("scope"), std::string::npos) << gc.output;
}

TEST_F(CliTest, PullsSomeTensorsOrARanksPart) {
  // A version of two tensors, pushed whole: a rank's part of a whole tensor is the tensor.
  const std::string body =
      testing::Serialize({{"w", DType::kF32, {4, 2}, testing::FloatBytes({1, 2, 3, 4, 5, 6, 7, 8})},
                          {"b", DType::kF32, {2}, testing::FloatBytes({9, 10})}});
  ASSERT_EQ(Run("push m 1 " + WriteFile("v.safetensors", body)).exit_code, 0);
  const std::string out = (dir_.path() / "part.safetensors").string();
  auto some = Run("pull m latest -o " + out + " --tensors 'w*'");
  ASSERT_EQ(some.exit_code, 0) << some.output;
  EXPECT_EQ(some.output.find("(verified)"), std::string::npos) << some.output;
  const std::string part = ReadFile(out);
  EXPECT_NE(part.find("\"w\""), std::string::npos);
  EXPECT_EQ(part.find("\"b\""), std::string::npos);
  EXPECT_EQ(part.substr(part.size() - 32), testing::FloatBytes({1, 2, 3, 4, 5, 6, 7, 8}));
  ASSERT_EQ(Run("pull m 1 -o " + out + " --rank 1 --world-size 2").exit_code, 0);
  EXPECT_EQ(ReadFile(out).size(), body.size());
  auto alone = Run("pull m 1 -o " + out + " --rank 1");
  EXPECT_NE(alone.exit_code, 0);
  EXPECT_NE(alone.output.find("--rank and --world-size go together"), std::string::npos)
      << alone.output;
  auto whole = Run("pull m 1 -o " + out);
  EXPECT_NE(whole.output.find("(verified)"), std::string::npos) << whole.output;

  // The Hugging Face view: w (32 bytes) and b (8 bytes) in files of at most 32 bytes.
  const std::string hf = (dir_.path() / "hf").string();
  auto view = Run("pull m latest --hf-dir " + hf + " --max-shard-bytes 32");
  ASSERT_EQ(view.exit_code, 0) << view.output;
  const std::string index = ReadFile(hf + "/model.safetensors.index.json");
  EXPECT_NE(index.find("\"w\": \"model-00001-of-00002.safetensors\""), std::string::npos) << index;
  EXPECT_NE(index.find("\"b\": \"model-00002-of-00002.safetensors\""), std::string::npos);
  EXPECT_EQ(ReadFile(hf + "/model-00002-of-00002.safetensors"),
            testing::Serialize({{"b", DType::kF32, {2}, testing::FloatBytes({9, 10})}}));
  EXPECT_NE(Run("pull m 1").exit_code, 0);  // neither -o nor --hf-dir
}

// Each tensor of a safetensors body: shape and bytes, by name.
std::map<std::string, std::pair<std::vector<uint64_t>, std::string>> TensorsOf(
    const std::string& body) {
  std::map<std::string, std::pair<std::vector<uint64_t>, std::string>> out;
  auto header = testing::ParseBodyHeader(body);
  EXPECT_TRUE(header.ok()) << header.status().message();
  if (!header.ok()) return out;
  for (const TensorInfo& t : header->tensors) {
    out[t.name] = {t.shape, body.substr(8 + header->json_size + t.begin, t.byte_size())};
  }
  return out;
}

// `ckpt push --connections N`: one file sent as N shards at once; the version holds the file's
// tensors as if pushed whole, and is a delta against the version before.
TEST_F(CliTest, PushesAFileAsParallelShards) {
  DriftingModel model(3, 100000);
  const std::string v1 = WriteFile("v1.safetensors", model.Next());
  const std::string v2 = WriteFile("v2.safetensors", model.Next());
  ASSERT_EQ(Run("push m 1 " + v1).exit_code, 0);
  auto r = Run("push m 2 " + v2 + " --connections 3 --metric loss=0.5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("pushed m@2  delta"), std::string::npos) << r.output;
  const std::string out = (dir_.path() / "restored.safetensors").string();
  auto pull = Run("pull m 2 -o " + out);
  ASSERT_EQ(pull.exit_code, 0) << pull.output;
  EXPECT_NE(pull.output.find("(verified)"), std::string::npos);
  EXPECT_EQ(TensorsOf(ReadFile(out)), TensorsOf(ReadFile(v2)));
  auto layout = testing::Request(daemon_->port(), "GET", "/v1/models/m/versions/2?layout=1");
  EXPECT_NE(layout.body.find("\"shards\":3"), std::string::npos) << layout.body;
  // Each rank's part, pulled encoded, is the part a pull of it writes, and carries fewer bytes
  // than the whole version's records.
  const json whole = RunJson("pull m 2 -o " + out + " --encoded --reference-dir " +
                             (dir_.path() / "refs").string());
  for (int rank = 0; rank < 2; ++rank) {
    const std::string plain = out + ".plain", coded = out + ".coded";
    const std::string part = " --rank " + std::to_string(rank) + " --world-size 2";
    ASSERT_EQ(Run("pull m 2 -o " + plain + part).exit_code, 0);
    const json pulled = RunJson("pull m 2 -o " + coded + part + " --encoded");
    EXPECT_TRUE(pulled["encoded"].get<bool>());
    EXPECT_FALSE(pulled["verified"].get<bool>());  // a part has no announced digest
    EXPECT_LT(pulled["received_bytes"].get<uint64_t>(), whole["received_bytes"].get<uint64_t>());
    EXPECT_EQ(ReadFile(coded), ReadFile(plain)) << rank;
  }
  EXPECT_NE(Run("ls m").output.find("loss=0.5"), std::string::npos);

  EXPECT_NE(Run("push m 3 " + v2 + " --connections 0").exit_code, 0);
  auto lonely = Run("push m 3 " + v2 + " --retries 2");
  EXPECT_NE(lonely.exit_code, 0);
  EXPECT_NE(lonely.output.find("--retries goes with --connections"), std::string::npos);
  // The answer counts what the shards sent: the file's bytes, re-framed per shard.
  const json third = RunJson("push m 3 " + v1 + " --connections 2");
  ASSERT_TRUE(third.is_object()) << third;
  EXPECT_GE(third["sent_bytes"].get<uint64_t>(), ReadFile(v1).size()) << third;
}

// Every tensor of `pushed` is in `restored` with its dtype and shape: F32 ones each element
// within `bound`, the others (which the lossy policy keeps lossless) equal.
void ExpectTensorsWithin(const std::string& pushed, const std::string& restored, double bound) {
  auto want = testing::ParseBodyHeader(pushed);
  auto got = testing::ParseBodyHeader(restored);
  ASSERT_TRUE(want.ok() && got.ok());
  ASSERT_EQ(got->tensors.size(), want->tensors.size());
  const auto bytes_of = [](const std::string& body, const SafetensorsHeader& h,
                           const TensorInfo& t) {
    return std::string_view(body).substr(8 + h.json_size + t.begin, t.byte_size());
  };
  for (const TensorInfo& w : want->tensors) {
    const auto g = std::find_if(got->tensors.begin(), got->tensors.end(),
                                [&](const TensorInfo& t) { return t.name == w.name; });
    ASSERT_NE(g, got->tensors.end()) << w.name;
    ASSERT_EQ(g->dtype, w.dtype) << w.name;
    ASSERT_EQ(g->shape, w.shape) << w.name;
    const std::string_view a = bytes_of(pushed, *want, w), b = bytes_of(restored, *got, *g);
    if (w.dtype != DType::kF32) {
      EXPECT_EQ(a, b) << w.name;
      continue;
    }
    double worst = 0;
    for (size_t at = 0; at + 4 <= a.size(); at += 4) {
      float x, y;
      std::memcpy(&x, a.data() + at, 4);
      std::memcpy(&y, b.data() + at, 4);
      worst = std::max(worst, double{std::abs(x - y)});
    }
    EXPECT_LE(worst, bound * (1 + 1e-6)) << w.name;
  }
}

// push --encoded --connections N: each shard is coded here against this machine's
// reconstruction of the same shard of the last version (one reference per rank), the wire
// carries what is stored, and the version restores as a whole push of the file would.
TEST_F(CliTest, EncodedShardedPushCodesEachShardAgainstItsPart) {
  ASSERT_EQ(Run("policy es '{\"mode\":\"lossy\",\"max_abs_error\":1e-3}'").exit_code, 0);
  DriftingModel model(5, 120000);
  const std::string refs = (dir_.path() / "shard-refs").string();
  std::vector<std::string> bodies;
  auto push = [&](const std::string& name, int v, const std::string& refs_dir) {
    bodies.push_back(model.Next());
    const std::string file = WriteFile(name + std::to_string(v), bodies.back());
    return RunJson("push " + name + " " + std::to_string(v) + " " + file +
                   " --encoded --connections 3 --reference-dir " + refs_dir);
  };
  for (int v = 1; v <= 3; ++v) {
    const json r = push("es", v, refs);
    ASSERT_TRUE(r.is_object()) << r;
    EXPECT_TRUE(r["encoded"].get<bool>()) << r;
    EXPECT_EQ(r["reference"], v == 1 ? "" : "held") << r;
    EXPECT_LT(r["sent_bytes"].get<uint64_t>(), r["stored_bytes"].get<uint64_t>() + 3 * 1024) << r;
    EXPECT_LT(r["sent_bytes"].get<uint64_t>() * 3, r["raw_bytes"].get<uint64_t>()) << r;
  }
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(
        std::filesystem::exists(refs + "/es.rank" + std::to_string(rank) + "-of-3.safetensors"));
  }
  const std::string out = (dir_.path() / "es3.restored").string();
  ASSERT_EQ(Run("pull es 3 -o " + out).exit_code, 0);
  ExpectTensorsWithin(bodies[2], ReadFile(out), 1e-3);
  // Another machine holds no part: each rank pulls its part of the base first.
  const json elsewhere = push("es", 4, (dir_.path() / "other-refs").string());
  EXPECT_TRUE(elsewhere["encoded"].get<bool>()) << elsewhere;
  EXPECT_EQ(elsewhere["reference"], "pulled") << elsewhere;
  ASSERT_EQ(Run("pull es 4 -o " + out).exit_code, 0);
  ExpectTensorsWithin(bodies[3], ReadFile(out), 1e-3);
  // Another rank count: each rank's part of the base, as the server cuts it, is pulled first.
  bodies.push_back(model.Next());
  const json two = RunJson("push es 5 " + WriteFile("es5", bodies.back()) +
                           " --encoded --connections 2 --reference-dir " + refs);
  ASSERT_TRUE(two.is_object()) << two;
  EXPECT_EQ(two["version"], 5) << two;
  EXPECT_EQ(two["reference"], "pulled") << two;
  ASSERT_EQ(Run("pull es 5 -o " + out).exit_code, 0);
  ExpectTensorsWithin(bodies[4], ReadFile(out), 1e-3);
  // A part held that no longer restores to what the server holds (as one kept from a shard a
  // commit dropped): the shard is refused at the commit, planned again and its part pulled.
  {
    const std::string part = refs + "/es.rank1-of-2.safetensors";
    std::string held = ReadFile(part);
    for (size_t at = held.size() / 2; at < held.size() / 2 + 4096; ++at) held[at] ^= 0x40;
    std::ofstream(part, std::ios::binary | std::ios::trunc) << held;
  }
  bodies.push_back(model.Next());
  const json drifted = RunJson("push es 6 " + WriteFile("es6", bodies.back()) +
                               " --encoded --connections 2 --reference-dir " + refs);
  ASSERT_TRUE(drifted.is_object()) << drifted;
  EXPECT_TRUE(drifted["encoded"].get<bool>()) << drifted;
  EXPECT_EQ(drifted["reference"], "pulled") << drifted;
  ASSERT_EQ(Run("pull es 6 -o " + out).exit_code, 0);
  ExpectTensorsWithin(bodies[5], ReadFile(out), 1e-3);
  // Version 6 planned on a base of 2 shards: the parts kept for 3 ranks (of version 3) went.
  for (int rank = 0; rank < 3; ++rank) {
    const std::string stale = refs + "/es.rank" + std::to_string(rank) + "-of-3";
    EXPECT_FALSE(std::filesystem::exists(stale + ".safetensors")) << stale;
    EXPECT_FALSE(std::filesystem::exists(stale + ".json")) << stale;
  }
  EXPECT_TRUE(std::filesystem::exists(refs + "/es.rank1-of-2.safetensors"));

  // Lossless: restores bit-identical.
  bodies.clear();
  for (int v = 1; v <= 2; ++v) {
    const json r = push("esl", v, refs);
    EXPECT_TRUE(r["encoded"].get<bool>()) << r;
  }
  ASSERT_EQ(Run("pull esl 2 -o " + out).exit_code, 0);
  EXPECT_EQ(TensorsOf(ReadFile(out)), TensorsOf(bodies[1]));
}

// A shard whose connection breaks mid-body is sent again by itself; without retries the push
// fails with one line naming the shard, and the version is not there.
TEST_F(CliTest, ParallelShardsRetryBrokenConnections) {
  DriftingModel model(4, 100000);
  const std::string v1 = WriteFile("v1.safetensors", model.Next());
  {
    testing::FlakyProxy proxy(daemon_->port(), /*cuts=*/2, /*cut_after=*/64 << 10);
    const std::string via = "http://127.0.0.1:" + std::to_string(proxy.port());
    auto r = Run("push m 1 " + v1 + " --connections 3 --retries 3", via);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(proxy.cut(), 2);
  }
  const std::string out = (dir_.path() / "restored.safetensors").string();
  ASSERT_EQ(Run("pull m 1 -o " + out).exit_code, 0);
  EXPECT_EQ(TensorsOf(ReadFile(out)), TensorsOf(ReadFile(v1)));

  const std::string v2 = WriteFile("v2.safetensors", model.Next());
  {
    testing::FlakyProxy proxy(daemon_->port(), /*cuts=*/1, /*cut_after=*/64 << 10);
    const std::string via = "http://127.0.0.1:" + std::to_string(proxy.port());
    auto r = Run("push m 2 " + v2 + " --connections 3 --retries 0", via);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("sharded push failed: shard "), std::string::npos) << r.output;
  }
  EXPECT_EQ(Run("pull m 2 -o " + out).exit_code, 1);
  // Sending it again completes the upload.
  auto again = Run("push m 2 " + v2 + " --connections 3");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  ASSERT_EQ(Run("pull m 2 -o " + out).exit_code, 0);
  EXPECT_EQ(TensorsOf(ReadFile(out)), TensorsOf(ReadFile(v2)));
}

// Retention from the CLI never deletes what its help does not say: --apply applies the stored
// policy only (a one-off policy is refused, nothing deleted), --preview and --apply exclude
// each other, and replacing the policy with one whose next pass would delete versions the
// stored one keeps needs --yes.
TEST_F(CliTest, RetentionDeletesOnlyWhatTheStoredPolicySays) {
  DriftingModel model(5, 5000);
  for (int v = 1; v <= 6; ++v) {
    const std::string file = WriteFile("v" + std::to_string(v), model.Next());
    ASSERT_EQ(
        Run("push run " + std::to_string(v) + " " + file + " --metric loss=" + std::to_string(v))
            .exit_code,
        0);
  }
  auto versions = [&] {
    std::set<uint64_t> out;
    for (const auto& v : RunJson("ls run")) out.insert(v["version"].get<uint64_t>());
    return out;
  };
  const std::set<uint64_t> all = {1, 2, 3, 4, 5, 6};
  auto one_off = Run("retention run --apply '{\"keep_last\":1}'");
  EXPECT_EQ(one_off.exit_code, 2) << one_off.output;
  EXPECT_NE(one_off.output.find("--apply applies the stored policy"), std::string::npos)
      << one_off.output;
  EXPECT_EQ(versions(), all);
  auto both = Run("retention run --preview --apply");
  EXPECT_NE(both.exit_code, 0) << both.output;
  EXPECT_EQ(versions(), all);

  // {} keeps everything; keep_last 4 would delete 1 and 2: refused without --yes.
  auto refused = Run("retention run '{\"keep_last\":4}'");
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("would delete what the stored policy keeps (1, 2"),
            std::string::npos)
      << refused.output;
  EXPECT_EQ(RunJson("retention run"), json::object());
  ASSERT_EQ(Run("retention run '{\"keep_last\":4}' --yes").exit_code, 0);
  // Replacing keep_last with keep_best alone would drop keep_last's versions: refused, and the
  // stored policy stays as it was; keeping both rules deletes nothing more: stored at once.
  auto narrower = Run("retention run '{\"keep_best\":{\"count\":1,\"metric\":\"loss\"}}'");
  EXPECT_EQ(narrower.exit_code, 1) << narrower.output;
  EXPECT_EQ(RunJson("retention run")["keep_last"], 4);
  auto wider =
      Run("retention run '{\"keep_last\":4,\"keep_best\":{\"count\":1,\"metric\":\"loss\"}}'");
  ASSERT_EQ(wider.exit_code, 0) << wider.output;
  EXPECT_EQ(versions(), all);  // nothing deleted until a pass runs
  auto applied = Run("retention run --apply");
  ASSERT_EQ(applied.exit_code, 0) << applied.output;
  EXPECT_EQ(versions(), (std::set<uint64_t>{1, 3, 4, 5, 6}));  // keep_best: loss 1 at v1
}

// Versions are named the same way everywhere: a number, latest or tag:NAME; deleting a whole
// model needs --yes.
TEST_F(CliTest, VersionsAreNamedAlikeAndAWholeModelNeedsYes) {
  DriftingModel model(6, 5000);
  for (int v = 1; v <= 3; ++v) {
    ASSERT_EQ(Run("push m " + std::to_string(v) + " " + WriteFile("f", model.Next())).exit_code, 0);
  }
  ASSERT_EQ(Run("tag m latest best").exit_code, 0);
  EXPECT_EQ(RunJson("tag m latest best")["version"], 3);
  EXPECT_EQ(RunJson("ls m")[2]["tags"], json::parse(R"(["best"])"));
  auto pinned = Run("rm m tag:best");
  EXPECT_EQ(pinned.exit_code, 1) << pinned.output;  // tagged: pinned
  ASSERT_EQ(Run("tag m tag:best best --remove").exit_code, 0);
  EXPECT_EQ(RunJson("rm m latest")["deleted_version"], 3);
  EXPECT_EQ(RunJson("ls m").size(), 2u);
  auto whole = Run("rm m");
  EXPECT_EQ(whole.exit_code, 1) << whole.output;
  EXPECT_NE(whole.output.find("--yes"), std::string::npos) << whole.output;
  EXPECT_EQ(RunJson("ls m").size(), 2u);
  EXPECT_NE(Run("rm m tag:nosuch").exit_code, 0);
}

// Output for people: `ls MODEL` fits 100 columns with a short hash and marks lossy versions
// with their bound; every command prints JSON with --json.
TEST_F(CliTest, ListingsFitAndMarkLossyVersions) {
  ASSERT_EQ(Run("policy llm '{\"mode\":\"lossy\",\"max_abs_error\":5e-3}'").exit_code, 0);
  DriftingModel model(7, 20000);
  for (int v = 1; v <= 3; ++v) {
    ASSERT_EQ(Run("push llm " + std::to_string(v * 1000) + " " + WriteFile("f", model.Next()) +
                  " --metric loss=1.25 --tag t" + std::to_string(v))
                  .exit_code,
              0);
  }
  auto ls = Run("ls llm");
  ASSERT_EQ(ls.exit_code, 0) << ls.output;
  size_t start = 0;
  while (start < ls.output.size()) {
    const size_t end = ls.output.find('\n', start);
    const std::string line = ls.output.substr(start, end - start);
    size_t width = 0;
    for (char c : line) width += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    EXPECT_LE(width, 100u) << line;
    start = end == std::string::npos ? ls.output.size() : end + 1;
  }
  EXPECT_NE(ls.output.find("  ±0.005  "), std::string::npos) << ls.output;
  const json listing = RunJson("ls llm");
  ASSERT_EQ(listing.size(), 3u);
  EXPECT_EQ(listing[0]["lossy"], true);
  EXPECT_EQ(listing[0]["max_abs_error"], 5e-3);
  // Each version shows the bound it was stored with, not the policy's now.
  ASSERT_EQ(Run("policy llm '{\"max_abs_error\":2e-2}'").exit_code, 0);
  ASSERT_EQ(Run("push llm 4000 " + WriteFile("f", model.Next())).exit_code, 0);
  const json after = RunJson("ls llm");
  EXPECT_EQ(after[0]["max_abs_error"], 5e-3);
  EXPECT_EQ(after[3]["max_abs_error"], 2e-2);
  const std::string sha = listing[0]["sha256"];
  EXPECT_NE(ls.output.find(sha.substr(0, 12)), std::string::npos);
  EXPECT_EQ(ls.output.find(sha.substr(0, 13)), std::string::npos) << ls.output;
  EXPECT_EQ(RunJson("policy llm")["mode"], "lossy");
  EXPECT_TRUE(RunJson("ls").is_array());
  EXPECT_TRUE(RunJson("retention llm --preview")["kept"].is_array());
}

// A policy field that changes nothing is told, not silently stored: the server's answer carries
// a warning, which the CLI prints on stderr.
TEST_F(CliTest, PolicyTellsOfAFieldThatDoesNothing) {
  auto set = Run("policy m '{\"max_abs_error\":5e-3}'");
  ASSERT_EQ(set.exit_code, 0) << set.output;
  EXPECT_NE(set.output.find("ckpt: warning: 'max_abs_error' (0.005) does nothing while 'mode' is "
                            "\"lossless\""),
            std::string::npos)
      << set.output;
  auto lossy = Run("policy m '{\"mode\":\"lossy\"}'");
  ASSERT_EQ(lossy.exit_code, 0) << lossy.output;
  EXPECT_EQ(lossy.output.find("warning"), std::string::npos) << lossy.output;
}

// An interrupted pull keeps FILE.partial; the same command resumes it with Range + If-Range and
// the result is verified whole. If the version behind "latest" changed meanwhile, it starts over.
TEST_F(CliTest, PullResumesItsPartialFile) {
  DriftingModel model(8, 400000);
  const std::string v1 = model.Next();
  ASSERT_EQ(Run("push m 1 " + WriteFile("v1", v1)).exit_code, 0);
  const std::string out = (dir_.path() / "out.safetensors").string();
  {
    testing::FlakyProxy proxy(daemon_->port(), 1, 600000, testing::FlakyProxy::Cut::kResponse);
    auto cut = Run("pull m latest -o " + out, "http://127.0.0.1:" + std::to_string(proxy.port()));
    EXPECT_EQ(cut.exit_code, 1) << cut.output;
    EXPECT_NE(cut.output.find("the same pull resumes it"), std::string::npos) << cut.output;
  }
  EXPECT_FALSE(std::filesystem::exists(out));
  const auto partial_size = std::filesystem::file_size(out + ".partial");
  EXPECT_GT(partial_size, 0u);
  auto resumed = Run("pull m latest -o " + out);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed after"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("(verified)"), std::string::npos) << resumed.output;
  EXPECT_EQ(Sha256Hex(ReadFile(out)), Sha256Hex(v1));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial.etag"));

  // latest moves on between the cut and the resume: the whole new version comes instead.
  std::filesystem::remove(out);
  {
    testing::FlakyProxy proxy(daemon_->port(), 1, 600000, testing::FlakyProxy::Cut::kResponse);
    EXPECT_EQ(Run("pull m latest -o " + out, "http://127.0.0.1:" + std::to_string(proxy.port()))
                  .exit_code,
              1);
  }
  const std::string v2 = model.Next();
  ASSERT_EQ(Run("push m 2 " + WriteFile("v2", v2)).exit_code, 0);
  auto fresh = Run("pull m latest -o " + out);
  ASSERT_EQ(fresh.exit_code, 0) << fresh.output;
  EXPECT_EQ(fresh.output.find("resumed after"), std::string::npos) << fresh.output;
  EXPECT_EQ(Sha256Hex(ReadFile(out)), Sha256Hex(v2));

  // A pull stopped after its last byte but before the rename: the server refuses a range past
  // the end (416), and the pull takes the whole body again.
  std::filesystem::remove(out);
  WriteFile("out.safetensors.partial", v2);
  WriteFile("out.safetensors.partial.etag", "\"" + Sha256Hex(v2) + "\"\n");
  auto complete = Run("pull m latest -o " + out);
  ASSERT_EQ(complete.exit_code, 0) << complete.output;
  EXPECT_EQ(Sha256Hex(ReadFile(out)), Sha256Hex(v2));
  EXPECT_FALSE(std::filesystem::exists(out + ".partial"));
}

// On a terminal the progress bar's last frame is erased, so the command's own line starts
// clean (run under script(1), which gives the CLI a terminal).
TEST_F(CliTest, ProgressBarIsErasedWhenDone) {
  DriftingModel model(9, 2000000);
  const std::string file = WriteFile("big", model.Next());
  const std::string cmd = "CKPT_SERVER=" + daemon_->url() + " script -qec '" +
                          std::string(CKPT_CLI_BINARY) + " push m 1 " + file + "' /dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string output;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) output.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << output;
  const size_t pushed = output.find("pushed m@1");
  ASSERT_NE(pushed, std::string::npos) << output;
  EXPECT_NE(output.find("%"), std::string::npos) << "no progress frame was drawn";
  EXPECT_EQ(output.rfind("\r\033[K", pushed), pushed - 4) << output;
}

}  // namespace
}  // namespace ckpt
