#include "ckpt/daemon/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

namespace ckpt::daemon {
namespace {

Status Bad(std::string_view key, std::string_view why) {
  return Status::InvalidArgument("config: '" + std::string(key) + "' " + std::string(why));
}

// What a file's keys are parsed into: the config, and the [cluster] section, which only takes
// effect when it names a ceph_conf.
struct ParseTarget {
  DaemonConfig& config;
  ClusterOptions cluster;
  bool cluster_seen = false;
  S3Options s3;
  bool s3_seen = false;
};

static_assert(std::is_same_v<size_t, uint64_t>, "size_t members are read as uint64_t");

// Where a plain key's value goes.
using Member = std::variant<int*, uint32_t*, uint64_t*, int64_t*, bool*, std::string*,
                            std::chrono::seconds*, std::chrono::milliseconds*, double*>;

// One key of the file. Plain keys name their member and (numbers) its range; the others parse
// their value themselves (`apply`). The order is the order keys are applied in.
struct KeySpec {
  std::string_view section;
  std::string_view key;
  Member (*member)(ParseTarget&) = nullptr;
  int64_t min = 0;
  uint64_t max = 0;
  Status (*apply)(const toml::node& value, const std::string& name, ParseTarget&) = nullptr;
};

Status ApplyListenKey(const toml::node& value, const std::string& name, ParseTarget& t) {
  if (!value.is_string()) return Bad(name, "must be a string");
  const std::string listen = *value.value<std::string>();
  return listen.empty() ? Status::Ok() : ApplyListen(listen, t.config);
}

// storage.on_reference_miss is retired: a push decodes a reference that is not in memory (one
// payload per chunk once the latest version is rearranged). Old config files still parse.
Status ApplyReferenceMiss(const toml::node& value, const std::string& name, ParseTarget&) {
  if (!value.is_string()) return Bad(name, "must be a string");
  const std::string miss = *value.value<std::string>();
  if (miss != "keyframe" && miss != "decode" && !miss.empty()) {
    return Bad(name, "must be \"keyframe\" or \"decode\" (retired: either has no effect)");
  }
  return Status::Ok();
}

Status ApplyLease(const toml::node& value, const std::string& name, ParseTarget& t) {
  auto v = value.value<double>();
  if (!v || !(*v >= 1 && *v <= 3600)) return Bad(name, "must be a number of seconds in [1, 3600]");
  t.cluster.lease = std::chrono::milliseconds(static_cast<int64_t>(*v * 1000));
  return Status::Ok();
}

Status ApplyS3Lease(const toml::node& value, const std::string& name, ParseTarget& t) {
  auto v = value.value<double>();
  if (!v || !(*v >= 2 && *v <= 3600)) return Bad(name, "must be a number of seconds in [2, 3600]");
  t.s3.lease = std::chrono::milliseconds(static_cast<int64_t>(*v * 1000));
  return Status::Ok();
}

Status ApplyS3Addressing(const toml::node& value, const std::string& name, ParseTarget& t) {
  const auto v = value.value<std::string>();
  if (!v || (*v != "path" && *v != "virtual_hosted")) {
    return Bad(name, "must be \"path\" or \"virtual_hosted\"");
  }
  t.s3.virtual_hosted = *v == "virtual_hosted";
  return Status::Ok();
}

Status ApplyDefaultRetention(const toml::node& value, const std::string& name, ParseTarget& t) {
  const toml::table* table = value.as_table();
  if (!table) return Bad(name, "must be a table such as { keep_last = 10 }");
  std::ostringstream json;
  json << toml::json_formatter{*table};
  auto parsed = RetentionPolicy::FromJson(json.str());
  if (!parsed.ok()) return Bad(name, parsed.status().message());
  t.config.store.default_retention = *parsed;
  return Status::Ok();
}

Status ReadString(const toml::table& table, const std::string& section, std::string_view key,
                  std::string& out) {
  const toml::node* node = table.get(key);
  if (!node) return Status::Ok();
  if (!node->is_string()) return Bad(section + "." + std::string(key), "must be a string");
  out = *node->value<std::string>();
  return Status::Ok();
}

Status ApplyTokens(const toml::node& value, const std::string& name, ParseTarget& t) {
  const toml::array* list = value.as_array();
  if (!list) return Bad(name, "must be an array of tables ([[auth.tokens]])");
  t.config.tokens.clear();
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string where = name + "[" + std::to_string(i) + "]";
    const toml::table* token = list->get(i)->as_table();
    if (!token) return Bad(where, "must be a table with name, sha256, scope, model_prefix");
    for (const auto& [key, unused] : *token) {
      const std::string_view k = key.str();
      if (k != "name" && k != "sha256" && k != "scope" && k != "model_prefix") {
        return Bad(where + "." + std::string(k), "is not a known option");
      }
    }
    api::TokenGrant grant;
    std::string scope = "read";
    CKPT_RETURN_IF_ERROR(ReadString(*token, where, "name", grant.name));
    CKPT_RETURN_IF_ERROR(ReadString(*token, where, "sha256", grant.sha256_hex));
    CKPT_RETURN_IF_ERROR(ReadString(*token, where, "scope", scope));
    CKPT_RETURN_IF_ERROR(ReadString(*token, where, "model_prefix", grant.model_prefix));
    const auto parsed = api::ScopeFromName(scope);
    if (!parsed) return Bad(where + ".scope", "must be \"read\", \"write\" or \"admin\"");
    grant.scope = *parsed;
    t.config.tokens.push_back(std::move(grant));
  }
  auto check = api::Authorizer::Create(t.config.tokens);
  if (!check.ok()) return Bad(name, check.status().message());
  return Status::Ok();
}

Status ApplyLogFormat(const toml::node& value, const std::string& name, ParseTarget& t) {
  if (!value.is_string()) return Bad(name, "must be a string");
  const std::string format = *value.value<std::string>();
  if (format != "text" && format != "json") return Bad(name, "must be \"text\" or \"json\"");
  t.config.server.json_logs = format == "json";
  return Status::Ok();
}

// Every key of the file: config/ckptd.toml documents each (ConfigKeys; tests/daemon/config_test.cc
// checks that the example lists exactly these).
#define CKPT_MEMBER(expr) [](ParseTarget& t) -> Member { return &t.expr; }
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();
const KeySpec kKeys[] = {
    {"server", "listen", nullptr, 0, 0, ApplyListenKey},
    {"server", "threads", CKPT_MEMBER(config.server.threads), 1, 256},
    {"server", "max_body_bytes", CKPT_MEMBER(config.server.max_body_bytes), 1, uint64_t{1} << 50},
    {"server", "max_header_bytes", CKPT_MEMBER(config.server.max_header_bytes), 1024, 16u << 20},
    {"server", "max_json_body_bytes", CKPT_MEMBER(config.server.max_json_body_bytes), 1024,
     uint64_t{1} << 30},
    {"server", "io_buffer_bytes", CKPT_MEMBER(config.server.io_buffer_bytes), 4096,
     uint64_t{64} << 20},
    {"server", "io_timeout_seconds", CKPT_MEMBER(config.server.io_timeout), 1, 86400},
    {"server", "idle_timeout_seconds", CKPT_MEMBER(config.server.idle_timeout), 1, 86400},
    {"server", "shutdown_grace_seconds", CKPT_MEMBER(config.server.shutdown_grace), 1, 86400},
    {"server", "push_wait_seconds", CKPT_MEMBER(config.server.push_wait), 1, 86400},
    {"server", "max_connections", CKPT_MEMBER(config.server.max_connections), 0, 1u << 20},
    {"server", "tls_cert_file", CKPT_MEMBER(config.server.tls_cert_file)},
    {"server", "tls_key_file", CKPT_MEMBER(config.server.tls_key_file)},
    {"server", "tls_client_ca_file", CKPT_MEMBER(config.server.tls_client_ca_file)},
    {"server", "decode_encoded_payloads", CKPT_MEMBER(config.server.decode_encoded_payloads)},
    {"storage", "data_dir", CKPT_MEMBER(config.store.data_dir)},
    {"storage", "on_reference_miss", nullptr, 0, 0, ApplyReferenceMiss},
    {"storage", "chunk_bytes", CKPT_MEMBER(config.store.chunk_bytes), 4096, uint64_t{256} << 20},
    {"storage", "reference_cache_bytes", CKPT_MEMBER(config.store.reference_cache_bytes), 0,
     uint64_t{1} << 40},
    {"storage", "since_delta_cache_bytes", CKPT_MEMBER(config.store.since_delta_cache_bytes), 0,
     uint64_t{1} << 40},
    {"storage", "sync_commits", CKPT_MEMBER(config.store.sync_commits)},
    {"storage", "min_free_bytes", CKPT_MEMBER(config.store.min_free_bytes), 0, uint64_t{1} << 50},
    {"storage", "warm_cache_on_start", CKPT_MEMBER(config.warm_cache_on_start)},
    {"storage", "rearrange_latest", CKPT_MEMBER(config.rearrange_latest)},
    {"storage", "rearrange_delay_ms", CKPT_MEMBER(config.rearrange_delay), 0, 3600000},
    {"storage", "zstd_level", CKPT_MEMBER(config.store.zstd_level), 1, 19},
    {"storage", "push_encoder_threads", CKPT_MEMBER(config.store.push_encoder_threads), 1, 64},
    {"storage", "max_tensors_per_checkpoint", CKPT_MEMBER(config.store.max_tensors_per_checkpoint),
     1, 1u << 24},
    {"storage", "max_models", CKPT_MEMBER(config.store.max_models), 0, uint64_t{1} << 40},
    {"storage", "upload_expiry_seconds", CKPT_MEMBER(config.store.upload_expiry), 1, 30 * 86400},
    {"storage", "max_shards_per_version", CKPT_MEMBER(config.store.max_shards_per_version), 1,
     1u << 16},
    {"cluster", "ceph_conf", CKPT_MEMBER(cluster.conf_file)},
    {"cluster", "client_name", CKPT_MEMBER(cluster.client_name)},
    {"cluster", "pool", CKPT_MEMBER(cluster.pool)},
    {"cluster", "namespace", CKPT_MEMBER(cluster.object_namespace)},
    {"cluster", "advertise_url", CKPT_MEMBER(cluster.advertise_url)},
    {"cluster", "lease_seconds", nullptr, 0, 0, ApplyLease},
    {"s3", "endpoint", CKPT_MEMBER(s3.endpoint)},
    {"s3", "bucket", CKPT_MEMBER(s3.bucket)},
    {"s3", "prefix", CKPT_MEMBER(s3.prefix)},
    {"s3", "region", CKPT_MEMBER(s3.region)},
    {"s3", "addressing", nullptr, 0, 0, ApplyS3Addressing},
    {"s3", "access_key", CKPT_MEMBER(s3.access_key)},
    {"s3", "secret_key", CKPT_MEMBER(s3.secret_key)},
    {"s3", "ca_file", CKPT_MEMBER(s3.ca_file)},
    {"s3", "parallelism", CKPT_MEMBER(s3.parallelism), 1, 256},
    {"s3", "pack_bytes", CKPT_MEMBER(s3.pack_bytes), 0, uint64_t{256} << 20},
    {"s3", "part_bytes", CKPT_MEMBER(s3.part_bytes), 5 << 20, uint64_t{5} << 30},
    {"s3", "attempts", CKPT_MEMBER(s3.attempts), 1, 100},
    {"s3", "request_timeout_ms", CKPT_MEMBER(s3.request_timeout), 1000, 3600000},
    {"s3", "advertise_url", CKPT_MEMBER(s3.advertise_url)},
    {"s3", "lease_seconds", nullptr, 0, 0, ApplyS3Lease},
    {"codec", "keyframe_every", CKPT_MEMBER(config.store.default_policy.keyframe_every), 0,
     CodecPolicy::kMaxKeyframeEvery},
    {"retention", "interval_seconds", CKPT_MEMBER(config.retention.interval), 0, 7 * 86400},
    {"retention", "after_push", CKPT_MEMBER(config.retention.after_push)},
    {"retention", "rebase_min_dead_fraction",
     CKPT_MEMBER(config.retention.rebase_min_dead_fraction), 0, 100},
    {"retention", "default", nullptr, 0, 0, ApplyDefaultRetention},
    {"auth", "tokens", nullptr, 0, 0, ApplyTokens},
    {"log", "level", CKPT_MEMBER(config.log_level)},
    {"log", "format", nullptr, 0, 0, ApplyLogFormat},
};
#undef CKPT_MEMBER

// Reads a plain key's value into its member, checking its type and range.
Status ApplyPlain(const KeySpec& spec, const toml::node& node, const std::string& name,
                  ParseTarget& t) {
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on a chain of string operator+.
  std::string range = "[";
  range.append(std::to_string(spec.min)).append(", ").append(std::to_string(spec.max)).append("]");
  auto integer = [&](auto* out) -> Status {
    auto v = node.value<int64_t>();
    if (!node.is_integer() || !v) return Bad(name, "must be an integer");
    if (*v < spec.min || static_cast<uint64_t>(*v) > spec.max)
      return Bad(name, "must be in " + range);
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(*v);
    return Status::Ok();
  };
  return std::visit(
      [&](auto* out) -> Status {
        using T = std::remove_pointer_t<decltype(out)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (!node.is_boolean()) return Bad(name, "must be true or false");
          *out = *node.value<bool>();
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (!node.is_string()) return Bad(name, "must be a string");
          *out = *node.value<std::string>();
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, std::chrono::seconds>) {
          int64_t seconds = 0;
          CKPT_RETURN_IF_ERROR(integer(&seconds));
          *out = std::chrono::seconds(seconds);
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, std::chrono::milliseconds>) {
          int64_t milliseconds = 0;
          CKPT_RETURN_IF_ERROR(integer(&milliseconds));
          *out = std::chrono::milliseconds(milliseconds);
          return Status::Ok();
        } else if constexpr (std::is_same_v<T, double>) {
          auto v = node.value<double>();
          if (!v || !(*v >= static_cast<double>(spec.min) && *v <= static_cast<double>(spec.max))) {
            return Bad(name, "must be a number in " + range);
          }
          *out = *v;
          return Status::Ok();
        } else {
          return integer(out);
        }
      },
      spec.member(t));
}

// The keys of one section: none unknown, each applied.
Status ApplySection(std::string_view section, const toml::table& table, ParseTarget& t) {
  for (const auto& [key, unused] : table) {
    const bool known = std::any_of(std::begin(kKeys), std::end(kKeys), [&](const KeySpec& k) {
      return k.section == section && k.key == key.str();
    });
    if (!known) {
      return Bad(std::string(section) + "." + std::string(key.str()), "is not a known option");
    }
  }
  for (const KeySpec& spec : kKeys) {
    if (spec.section != section) continue;
    const toml::node* node = table.get(spec.key);
    if (!node) continue;
    const std::string name = std::string(section) + "." + std::string(spec.key);
    CKPT_RETURN_IF_ERROR(spec.apply ? spec.apply(*node, name, t)
                                    : ApplyPlain(spec, *node, name, t));
  }
  return Status::Ok();
}

// What holds across keys.
Status CheckCombinations(ParseTarget& t) {
  const auto& s = t.config.server;
  if (s.tls_cert_file.empty() != s.tls_key_file.empty()) {
    return Bad("server.tls_cert_file", "and server.tls_key_file must be given together");
  }
  if (!s.tls_client_ca_file.empty() && s.tls_cert_file.empty()) {
    return Bad("server.tls_client_ca_file", "needs server.tls_cert_file and tls_key_file");
  }
  if (t.cluster_seen && !t.cluster.conf_file.empty()) {
    if (t.cluster.pool.empty()) return Bad("cluster.pool", "must not be empty");
    if (t.cluster.advertise_url.empty()) {
      return Bad("cluster.advertise_url",
                 "is required with a cluster: the URL other daemons redirect writes to (for "
                 "example \"http://10.0.0.5:8420\")");
    }
    t.config.store.cluster = std::move(t.cluster);
  }
  if (t.s3_seen && !t.s3.endpoint.empty()) {
    if (t.config.store.cluster) {
      return Bad("s3", "and [cluster] cannot both be configured: the store lives in one of them");
    }
    if (!t.s3.endpoint.starts_with("http://") && !t.s3.endpoint.starts_with("https://")) {
      return Bad("s3.endpoint", "must start with http:// or https://");
    }
    if (t.s3.bucket.empty()) return Bad("s3.bucket", "must not be empty");
    if (t.s3.advertise_url.empty()) {
      return Bad("s3.advertise_url",
                 "is required with S3: the URL other daemons redirect writes to (for example "
                 "\"http://10.0.0.5:8420\")");
    }
    // Credentials: the file's, else the environment's (AWS's variable names).
    if (t.s3.access_key.empty() && t.s3.secret_key.empty()) {
      const char* access = std::getenv("AWS_ACCESS_KEY_ID");
      const char* secret = std::getenv("AWS_SECRET_ACCESS_KEY");
      if (access) t.s3.access_key = access;
      if (secret) t.s3.secret_key = secret;
    }
    if (t.s3.access_key.empty() || t.s3.secret_key.empty()) {
      return Bad("s3.access_key",
                 "and s3.secret_key are required (in the file, or AWS_ACCESS_KEY_ID and "
                 "AWS_SECRET_ACCESS_KEY in the environment)");
    }
    t.config.store.s3 = std::move(t.s3);
  }
  return Status::Ok();
}

}  // namespace

std::vector<ConfigKey> ConfigKeys() {
  std::vector<ConfigKey> out;
  for (const KeySpec& k : kKeys) out.push_back({k.section, k.key});
  return out;
}

Status ApplyListen(std::string_view listen, DaemonConfig& config) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == listen.size()) {
    return Status::InvalidArgument("listen address '" + std::string(listen) +
                                   "' must be HOST:PORT");
  }
  const std::string port_text(listen.substr(colon + 1));
  if (port_text.find_first_not_of("0123456789") != std::string::npos || port_text.size() > 5 ||
      std::stoul(port_text) > 65535) {
    return Status::InvalidArgument("listen port '" + port_text + "' must be 0..65535");
  }
  std::string host(listen.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  config.server.address = host;
  config.server.port = static_cast<uint16_t>(std::stoul(port_text));
  return Status::Ok();
}

Status ApplyToml(std::string_view toml_text, DaemonConfig& config) {
  toml::table root;
  try {
    root = toml::parse(toml_text);
  } catch (const toml::parse_error& e) {
    std::ostringstream where;
    where << e.source().begin;
    return Status::InvalidArgument("config: " + std::string(e.description()) + " at " +
                                   where.str());
  }
  std::vector<std::string_view> sections;
  for (const KeySpec& k : kKeys) {
    if (sections.empty() || sections.back() != k.section) sections.push_back(k.section);
  }
  for (const auto& [section, unused] : root) {
    if (std::find(sections.begin(), sections.end(), section.str()) == sections.end()) {
      return Bad(section.str(), "is not a known option");
    }
  }
  ParseTarget target{config, ClusterOptions{}, false, S3Options{}, false};
  for (std::string_view section : sections) {
    const toml::node* node = root.get(section);
    if (!node) continue;
    const toml::table* table = node->as_table();
    if (!table) return Bad(section, "must be a table");
    if (section == "cluster") target.cluster_seen = true;
    if (section == "s3") target.s3_seen = true;
    CKPT_RETURN_IF_ERROR(ApplySection(section, *table, target));
  }
  return CheckCombinations(target);
}

Status CheckListenerIsProtected(const DaemonConfig& config) {
  if (!config.tokens.empty()) return Status::Ok();
  const std::string& address = config.server.address;
  boost::system::error_code ec;
  const auto ip = boost::asio::ip::make_address(address, ec);
  if (address == "localhost" || (!ec && ip.is_loopback())) return Status::Ok();
  return Status::FailedPrecondition(
      "refusing to listen on " + address +
      " without authentication: anyone who can reach it could read, overwrite and delete every "
      "checkpoint. Configure [[auth.tokens]] (see config/ckptd.toml) or listen on 127.0.0.1");
}

Status ApplyTomlFile(const std::string& path, DaemonConfig& config) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("config file '" + path + "' cannot be read");
  std::stringstream text;
  text << in.rdbuf();
  return ApplyToml(text.str(), config).WithContext(path);
}

}  // namespace ckpt::daemon
