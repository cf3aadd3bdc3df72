#include "ckpt/daemon/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace ckpt::daemon {
namespace {

TEST(DaemonConfig, ExampleConfigFileParsesToTheDefaults) {
  DaemonConfig defaults;
  DaemonConfig parsed;
  ASSERT_TRUE(ApplyTomlFile(CKPT_EXAMPLE_CONFIG, parsed).ok());
  EXPECT_FALSE(parsed.store.cluster.has_value());
  EXPECT_EQ(parsed.server.address, defaults.server.address);
  EXPECT_EQ(parsed.server.port, defaults.server.port);
  EXPECT_EQ(parsed.server.threads, defaults.server.threads);
  EXPECT_EQ(parsed.server.max_body_bytes, defaults.server.max_body_bytes);
  EXPECT_EQ(parsed.server.io_timeout, defaults.server.io_timeout);
  EXPECT_EQ(parsed.server.push_wait, defaults.server.push_wait);
  EXPECT_EQ(parsed.server.max_header_bytes, defaults.server.max_header_bytes);
  EXPECT_EQ(parsed.server.max_json_body_bytes, defaults.server.max_json_body_bytes);
  EXPECT_EQ(parsed.server.idle_timeout, defaults.server.idle_timeout);
  EXPECT_EQ(parsed.server.shutdown_grace, defaults.server.shutdown_grace);
  EXPECT_EQ(parsed.server.io_buffer_bytes, defaults.server.io_buffer_bytes);
  EXPECT_EQ(parsed.store.zstd_level, defaults.store.zstd_level);
  EXPECT_EQ(parsed.store.max_tensors_per_checkpoint, defaults.store.max_tensors_per_checkpoint);
  EXPECT_EQ(parsed.store.max_models, defaults.store.max_models);
  EXPECT_EQ(parsed.store.push_encoder_threads, defaults.store.push_encoder_threads);
  EXPECT_EQ(parsed.server.tls_cert_file, defaults.server.tls_cert_file);
  EXPECT_EQ(parsed.server.tls_client_ca_file, defaults.server.tls_client_ca_file);
  EXPECT_EQ(parsed.server.decode_encoded_payloads, defaults.server.decode_encoded_payloads);
  EXPECT_EQ(parsed.tokens.size(), 0u);
  EXPECT_EQ(parsed.server.max_connections, defaults.server.max_connections);
  EXPECT_EQ(parsed.store.data_dir, defaults.store.data_dir);
  EXPECT_EQ(parsed.store.chunk_bytes, defaults.store.chunk_bytes);
  EXPECT_EQ(parsed.store.reference_cache_bytes, defaults.store.reference_cache_bytes);
  EXPECT_EQ(parsed.store.sync_commits, defaults.store.sync_commits);
  EXPECT_EQ(parsed.store.default_policy, defaults.store.default_policy);
  EXPECT_EQ(parsed.log_level, defaults.log_level);
  EXPECT_EQ(parsed.warm_cache_on_start, defaults.warm_cache_on_start);
  EXPECT_EQ(parsed.store.default_retention, defaults.store.default_retention);
  EXPECT_TRUE(parsed.store.default_retention.KeepsEverything());
  EXPECT_EQ(parsed.retention.interval, defaults.retention.interval);
  EXPECT_EQ(parsed.retention.after_push, defaults.retention.after_push);
  EXPECT_EQ(parsed.retention.rebase_min_dead_fraction, defaults.retention.rebase_min_dead_fraction);
}

// The example file documents every key of the one key table, each in its own section, and says
// it takes a restart.
TEST(DaemonConfig, ExampleConfigFileDocumentsEveryKey) {
  std::ifstream in(CKPT_EXAMPLE_CONFIG);
  std::stringstream text;
  text << in.rdbuf();
  const std::string example = text.str();
  const std::vector<ConfigKey> keys = ConfigKeys();
  ASSERT_GT(keys.size(), 30u);
  for (const ConfigKey& k : keys) {
    const size_t begin = example.find("\n[" + std::string(k.section) + "]\n");
    ASSERT_NE(begin, std::string::npos) << k.section;
    const size_t end = example.find("\n[", begin + 1 + k.section.size() + 2);
    const std::string section = example.substr(begin, end - begin);
    EXPECT_NE(section.find(std::string(k.key)), std::string::npos)
        << k.section << "." << k.key << " is not documented in its section";
    EXPECT_NE(section.find("Restart"), std::string::npos) << k.section;
  }
}

TEST(DaemonConfig, RetentionSectionSetsTheDefaultPolicy) {
  DaemonConfig c;
  Status s = ApplyToml(R"([retention]
interval_seconds = 0
after_push = false
[retention.default]
keep_last = 5
keep_within = "72h"
keep_best = { count = 3, metric = "loss", mode = "min" }
)",
                       c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.retention.interval, std::chrono::seconds(0));
  EXPECT_FALSE(c.retention.after_push);
  EXPECT_EQ(c.store.default_retention.keep_last, 5u);
  EXPECT_EQ(c.store.default_retention.keep_within_ms, 72 * 3'600'000);
  ASSERT_TRUE(c.store.default_retention.keep_best.has_value());
  EXPECT_EQ(c.store.default_retention.keep_best->metric, "loss");
}

TEST(DaemonConfig, OverridesOnlyWhatIsSet) {
  DaemonConfig c;
  ASSERT_TRUE(
      ApplyToml("[server]\nlisten = \"0.0.0.0:9000\"\n[codec]\nkeyframe_every = 8\n", c).ok());
  EXPECT_EQ(c.server.address, "0.0.0.0");
  EXPECT_EQ(c.server.port, 9000);
  EXPECT_EQ(c.store.default_policy.keyframe_every, 8u);
  EXPECT_EQ(c.store.data_dir, "./data");
  EXPECT_TRUE(c.warm_cache_on_start);
  ASSERT_TRUE(ApplyToml("[storage]\nwarm_cache_on_start = false\n", c).ok());
  EXPECT_FALSE(c.warm_cache_on_start);
  ASSERT_TRUE(ApplyToml("[storage]\npush_encoder_threads = 6\n", c).ok());
  EXPECT_EQ(c.store.push_encoder_threads, 6u);
}

TEST(DaemonConfig, RejectsUnknownKeysWrongTypesAndRanges) {
  struct Case {
    const char* toml;
    const char* mention;
  };
  for (const Case& c :
       {Case{"[server]\nthreds = 4\n", "server.threds"},
        Case{"[server]\nthreads = \"4\"\n", "server.threads"},
        Case{"[server]\nthreads = 0\n", "server.threads"},
        Case{"[storage]\nsync_commits = 1\n", "storage.sync_commits"},
        Case{"[storage]\nwarm_cache_on_start = \"yes\"\n", "storage.warm_cache_on_start"},
        Case{"[storage]\nchunk_bytes = 10\n", "storage.chunk_bytes"},
        Case{"[storage]\npush_encoder_threads = 0\n", "storage.push_encoder_threads"},
        Case{"[extra]\n", "extra"},
        Case{"[storage]\non_reference_miss = \"guess\"\n", "on_reference_miss"},
        Case{"[server]\nlisten = \"nohost\"\n", "HOST:PORT"},
        Case{"[server]\nlisten = \"h:99999\"\n", "0..65535"},
        Case{"[server\n", "config"},
        Case{"[retention.default]\nkeep_last = 0\n", "keep_last"},
        Case{"[retention.default]\nkeep_lats = 3\n", "retention.default"},
        Case{"[retention]\ndefault = 3\n", "retention.default"},
        Case{"[retention]\ninterval_seconds = -1\n", "retention.interval_seconds"},
        Case{"[retention]\nrebase_min_dead_fraction = \"x\"\n", "rebase_min_dead_fraction"},
        Case{"[cluster]\nceph_conf = \"/etc/ceph/ceph.conf\"\n", "cluster.advertise_url"},
        Case{"[cluster]\nlease_seconds = 0.5\n", "cluster.lease_seconds"},
        Case{"[cluster]\nceph_conf = \"c\"\nadvertise_url = \"http://h:1\"\npool = \"\"\n",
             "cluster.pool"},
        Case{"[cluster]\nmonitors = \"x\"\n", "cluster.monitors"}}) {
    DaemonConfig config;
    Status s = ApplyToml(c.toml, config);
    ASSERT_EQ(s.code(), StatusCode::kInvalidArgument) << c.toml;
    EXPECT_NE(s.message().find(c.mention), std::string::npos) << s.message();
  }
}

TEST(DaemonConfig, ClusterSectionConfiguresTheRadosBackend) {
  DaemonConfig single;
  ASSERT_TRUE(ApplyToml("[cluster]\nceph_conf = \"\"\n", single).ok());
  EXPECT_FALSE(single.store.cluster.has_value());  // empty ceph_conf: a single node

  DaemonConfig c;
  Status s = ApplyToml(R"([cluster]
ceph_conf = "/etc/ceph/ceph.conf"
client_name = "client.ckptd"
pool = "checkpoints"
namespace = "prod"
lease_seconds = 2.5
advertise_url = "http://10.0.0.5:8420"
)",
                       c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(c.store.cluster.has_value());
  EXPECT_EQ(c.store.cluster->conf_file, "/etc/ceph/ceph.conf");
  EXPECT_EQ(c.store.cluster->client_name, "client.ckptd");
  EXPECT_EQ(c.store.cluster->pool, "checkpoints");
  EXPECT_EQ(c.store.cluster->object_namespace, "prod");
  EXPECT_EQ(c.store.cluster->lease, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.store.cluster->advertise_url, "http://10.0.0.5:8420");
}

TEST(DaemonConfig, AuthTokensAreParsedAndChecked) {
  DaemonConfig c;
  const std::string digest = api::Authorizer::TokenDigestHex("secret");
  Status s = ApplyToml("[[auth.tokens]]\nname = \"trainer\"\nsha256 = \"" + digest +
                           "\"\nscope = \"write\"\nmodel_prefix = \"team-\"\n"
                           "[[auth.tokens]]\nname = \"ops\"\nsha256 = \"" +
                           api::Authorizer::TokenDigestHex("other") + "\"\nscope = \"admin\"\n",
                       c);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(c.tokens.size(), 2u);
  EXPECT_EQ(c.tokens[0].name, "trainer");
  EXPECT_EQ(c.tokens[0].scope, api::Scope::kWrite);
  EXPECT_EQ(c.tokens[0].model_prefix, "team-");
  EXPECT_EQ(c.tokens[1].scope, api::Scope::kAdmin);
  for (const auto& [toml, mention] : std::vector<std::pair<std::string, std::string>>{
           {"[[auth.tokens]]\nname = \"x\"\nsha256 = \"" + digest + "\"\nscope = \"root\"\n",
            "auth.tokens[0].scope"},
           {"[[auth.tokens]]\nname = \"x\"\nsha256 = \"abc\"\n", "64 hex digits"},
           {"[[auth.tokens]]\nname = \"x\"\ntoken = \"plain\"\n", "auth.tokens[0].token"},
           {"[auth]\ntokens = 3\n", "auth.tokens"}}) {
    DaemonConfig bad;
    Status e = ApplyToml(toml, bad);
    ASSERT_EQ(e.code(), StatusCode::kInvalidArgument) << toml;
    EXPECT_NE(e.message().find(mention), std::string::npos) << e.message();
  }
}

TEST(DaemonConfig, NonLoopbackListenersNeedTokens) {
  DaemonConfig c;
  EXPECT_TRUE(CheckListenerIsProtected(c).ok());  // 127.0.0.1
  for (const char* listen : {"[::1]:0", "localhost:1"}) {
    ASSERT_TRUE(ApplyListen(listen, c).ok());
    EXPECT_TRUE(CheckListenerIsProtected(c).ok()) << listen;
  }
  for (const char* listen : {"0.0.0.0:8420", "10.1.2.3:8420", "[::]:8420", "ckpt.example:1"}) {
    ASSERT_TRUE(ApplyListen(listen, c).ok());
    Status s = CheckListenerIsProtected(c);
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << listen;
    EXPECT_NE(s.message().find("auth.tokens"), std::string::npos);
  }
  c.tokens.push_back({"t", api::Authorizer::TokenDigestHex("t"), api::Scope::kRead, ""});
  EXPECT_TRUE(CheckListenerIsProtected(c).ok());
}

TEST(DaemonConfig, ListenAcceptsBracketedIpv6) {
  DaemonConfig c;
  ASSERT_TRUE(ApplyListen("[::1]:0", c).ok());
  EXPECT_EQ(c.server.address, "::1");
  EXPECT_EQ(c.server.port, 0);
}

}  // namespace
}  // namespace ckpt::daemon
