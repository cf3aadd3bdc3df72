#include "ckpt/daemon/config.h"

#include <toml++/toml.h>

#include <boost/asio/ip/address.hpp>
#include <fstream>
#include <set>
#include <sstream>

namespace ckpt::daemon {
namespace {

Status Bad(std::string_view key, std::string_view why) {
  return Status::InvalidArgument("config: '" + std::string(key) + "' " + std::string(why));
}

template <typename T>
Status ReadInteger(const toml::table& table, std::string_view section, std::string_view key, T min,
                   T max, T& out) {
  const toml::node* node = table.get(key);
  if (!node) return Status::Ok();
  const std::string name = std::string(section) + "." + std::string(key);
  auto v = node->value<int64_t>();
  if (!node->is_integer() || !v) return Bad(name, "must be an integer");
  if (*v < static_cast<int64_t>(min) || static_cast<uint64_t>(*v) > static_cast<uint64_t>(max)) {
    return Bad(name, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  out = static_cast<T>(*v);
  return Status::Ok();
}

Status ReadString(const toml::table& table, std::string_view section, std::string_view key,
                  std::string& out) {
  const toml::node* node = table.get(key);
  if (!node) return Status::Ok();
  if (!node->is_string())
    return Bad(std::string(section) + "." + std::string(key), "must be a string");
  out = *node->value<std::string>();
  return Status::Ok();
}

Status ReadBool(const toml::table& table, std::string_view section, std::string_view key,
                bool& out) {
  const toml::node* node = table.get(key);
  if (!node) return Status::Ok();
  if (!node->is_boolean())
    return Bad(std::string(section) + "." + std::string(key), "must be true or false");
  out = *node->value<bool>();
  return Status::Ok();
}

Status CheckKeys(const toml::table& table, std::string_view section,
                 const std::set<std::string_view>& allowed) {
  for (const auto& [key, value] : table) {
    if (!allowed.count(key.str())) {
      return Bad(std::string(section) + "." + std::string(key.str()), "is not a known option");
    }
  }
  return Status::Ok();
}

Status ApplySeconds(const toml::table& table, std::string_view section, std::string_view key,
                    std::chrono::seconds& out) {
  int64_t seconds = out.count();
  CKPT_RETURN_IF_ERROR(ReadInteger<int64_t>(table, section, key, 1, 86400, seconds));
  out = std::chrono::seconds(seconds);
  return Status::Ok();
}

}  // namespace

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
  CKPT_RETURN_IF_ERROR(
      CheckKeys(root, "", {"server", "storage", "cluster", "codec", "retention", "log", "auth"}));

  if (const toml::table* server = root["server"].as_table()) {
    CKPT_RETURN_IF_ERROR(
        CheckKeys(*server, "server",
                  {"listen", "threads", "max_body_bytes", "max_header_bytes", "max_json_body_bytes",
                   "io_timeout_seconds", "idle_timeout_seconds", "shutdown_grace_seconds",
                   "push_wait_seconds", "io_buffer_bytes", "tls_cert_file", "tls_key_file",
                   "tls_client_ca_file", "max_connections"}));
    std::string listen;
    CKPT_RETURN_IF_ERROR(ReadString(*server, "server", "listen", listen));
    if (!listen.empty()) CKPT_RETURN_IF_ERROR(ApplyListen(listen, config));
    auto& s = config.server;
    CKPT_RETURN_IF_ERROR(ReadInteger<int>(*server, "server", "threads", 1, 256, s.threads));
    CKPT_RETURN_IF_ERROR(ReadInteger<uint64_t>(*server, "server", "max_body_bytes", 1,
                                               uint64_t{1} << 50, s.max_body_bytes));
    CKPT_RETURN_IF_ERROR(ReadInteger<uint32_t>(*server, "server", "max_header_bytes", 1024,
                                               16u << 20, s.max_header_bytes));
    CKPT_RETURN_IF_ERROR(ReadInteger<uint64_t>(*server, "server", "max_json_body_bytes", 1024,
                                               uint64_t{1} << 30, s.max_json_body_bytes));
    CKPT_RETURN_IF_ERROR(ReadInteger<size_t>(*server, "server", "io_buffer_bytes", 4096,
                                             size_t{64} << 20, s.io_buffer_bytes));
    CKPT_RETURN_IF_ERROR(ApplySeconds(*server, "server", "io_timeout_seconds", s.io_timeout));
    CKPT_RETURN_IF_ERROR(ApplySeconds(*server, "server", "idle_timeout_seconds", s.idle_timeout));
    CKPT_RETURN_IF_ERROR(
        ApplySeconds(*server, "server", "shutdown_grace_seconds", s.shutdown_grace));
    CKPT_RETURN_IF_ERROR(ApplySeconds(*server, "server", "push_wait_seconds", s.push_wait));
    CKPT_RETURN_IF_ERROR(
        ReadInteger<size_t>(*server, "server", "max_connections", 0, 1u << 20, s.max_connections));
    CKPT_RETURN_IF_ERROR(ReadString(*server, "server", "tls_cert_file", s.tls_cert_file));
    CKPT_RETURN_IF_ERROR(ReadString(*server, "server", "tls_key_file", s.tls_key_file));
    CKPT_RETURN_IF_ERROR(ReadString(*server, "server", "tls_client_ca_file", s.tls_client_ca_file));
    if (s.tls_cert_file.empty() != s.tls_key_file.empty()) {
      return Bad("server.tls_cert_file", "and server.tls_key_file must be given together");
    }
    if (!s.tls_client_ca_file.empty() && s.tls_cert_file.empty()) {
      return Bad("server.tls_client_ca_file", "needs server.tls_cert_file and tls_key_file");
    }
  } else if (root.contains("server")) {
    return Bad("server", "must be a table");
  }

  if (const toml::table* storage = root["storage"].as_table()) {
    CKPT_RETURN_IF_ERROR(
        CheckKeys(*storage, "storage",
                  {"data_dir", "chunk_bytes", "reference_cache_bytes", "on_reference_miss",
                   "warm_cache_on_start", "sync_commits", "zstd_level",
                   "max_tensors_per_checkpoint", "max_models", "push_encoder_threads"}));
    auto& st = config.store;
    CKPT_RETURN_IF_ERROR(ReadString(*storage, "storage", "data_dir", st.data_dir));
    std::string miss;
    CKPT_RETURN_IF_ERROR(ReadString(*storage, "storage", "on_reference_miss", miss));
    if (miss == "keyframe") {
      st.on_reference_miss = StoreOptions::ReferenceMiss::kKeyframe;
    } else if (miss == "decode") {
      st.on_reference_miss = StoreOptions::ReferenceMiss::kDecode;
    } else if (!miss.empty()) {
      return Bad("storage.on_reference_miss", "must be \"keyframe\" or \"decode\"");
    }
    CKPT_RETURN_IF_ERROR(ReadInteger<uint64_t>(*storage, "storage", "chunk_bytes", 4096,
                                               uint64_t{256} << 20, st.chunk_bytes));
    CKPT_RETURN_IF_ERROR(ReadInteger<uint64_t>(*storage, "storage", "reference_cache_bytes", 0,
                                               uint64_t{1} << 40, st.reference_cache_bytes));
    CKPT_RETURN_IF_ERROR(ReadBool(*storage, "storage", "sync_commits", st.sync_commits));
    CKPT_RETURN_IF_ERROR(
        ReadBool(*storage, "storage", "warm_cache_on_start", config.warm_cache_on_start));
    CKPT_RETURN_IF_ERROR(ReadInteger<int>(*storage, "storage", "zstd_level", 1, 19, st.zstd_level));
    CKPT_RETURN_IF_ERROR(ReadInteger<size_t>(*storage, "storage", "push_encoder_threads", 1, 64,
                                             st.push_encoder_threads));
    CKPT_RETURN_IF_ERROR(ReadInteger<uint32_t>(*storage, "storage", "max_tensors_per_checkpoint", 1,
                                               1u << 24, st.max_tensors_per_checkpoint));
    CKPT_RETURN_IF_ERROR(ReadInteger<uint64_t>(*storage, "storage", "max_models", 0,
                                               uint64_t{1} << 40, st.max_models));
  } else if (root.contains("storage")) {
    return Bad("storage", "must be a table");
  }

  if (const toml::table* cluster = root["cluster"].as_table()) {
    CKPT_RETURN_IF_ERROR(CheckKeys(
        *cluster, "cluster",
        {"ceph_conf", "client_name", "pool", "namespace", "lease_seconds", "advertise_url"}));
    ClusterOptions c;
    CKPT_RETURN_IF_ERROR(ReadString(*cluster, "cluster", "ceph_conf", c.conf_file));
    CKPT_RETURN_IF_ERROR(ReadString(*cluster, "cluster", "client_name", c.client_name));
    CKPT_RETURN_IF_ERROR(ReadString(*cluster, "cluster", "pool", c.pool));
    CKPT_RETURN_IF_ERROR(ReadString(*cluster, "cluster", "namespace", c.object_namespace));
    CKPT_RETURN_IF_ERROR(ReadString(*cluster, "cluster", "advertise_url", c.advertise_url));
    if (const toml::node* lease = cluster->get("lease_seconds")) {
      auto v = lease->value<double>();
      if (!v || !(*v >= 1 && *v <= 3600)) {
        return Bad("cluster.lease_seconds", "must be a number of seconds in [1, 3600]");
      }
      c.lease = std::chrono::milliseconds(static_cast<int64_t>(*v * 1000));
    }
    if (!c.conf_file.empty()) {
      if (c.pool.empty()) return Bad("cluster.pool", "must not be empty");
      if (c.advertise_url.empty()) {
        return Bad("cluster.advertise_url",
                   "is required with a cluster: the URL other daemons redirect writes to (for "
                   "example \"http://10.0.0.5:8420\")");
      }
      config.store.cluster = std::move(c);
    }
  } else if (root.contains("cluster")) {
    return Bad("cluster", "must be a table");
  }

  if (const toml::table* codec = root["codec"].as_table()) {
    CKPT_RETURN_IF_ERROR(CheckKeys(*codec, "codec", {"keyframe_every"}));
    CKPT_RETURN_IF_ERROR(ReadInteger<uint32_t>(*codec, "codec", "keyframe_every", 0,
                                               CodecPolicy::kMaxKeyframeEvery,
                                               config.store.default_policy.keyframe_every));
  } else if (root.contains("codec")) {
    return Bad("codec", "must be a table");
  }

  if (const toml::table* retention = root["retention"].as_table()) {
    CKPT_RETURN_IF_ERROR(
        CheckKeys(*retention, "retention",
                  {"interval_seconds", "after_push", "rebase_min_dead_fraction", "default"}));
    auto& r = config.retention;
    CKPT_RETURN_IF_ERROR(ReadInteger<int64_t>(*retention, "retention", "interval_seconds", 0,
                                              7 * 86400, r.interval_seconds));
    CKPT_RETURN_IF_ERROR(ReadBool(*retention, "retention", "after_push", r.after_push));
    if (const toml::node* fraction = retention->get("rebase_min_dead_fraction")) {
      auto v = fraction->value<double>();
      if (!v || !(*v >= 0 && *v <= 100)) {
        return Bad("retention.rebase_min_dead_fraction", "must be a number in [0, 100]");
      }
      r.rebase_min_dead_fraction = *v;
    }
    if (const toml::node* policy = retention->get("default")) {
      const toml::table* table = policy->as_table();
      if (!table) return Bad("retention.default", "must be a table such as { keep_last = 10 }");
      std::ostringstream json;
      json << toml::json_formatter{*table};
      auto parsed = RetentionPolicy::FromJson(json.str());
      if (!parsed.ok()) return Bad("retention.default", parsed.status().message());
      config.store.default_retention = *parsed;
    }
  } else if (root.contains("retention")) {
    return Bad("retention", "must be a table");
  }

  if (const toml::table* auth = root["auth"].as_table()) {
    CKPT_RETURN_IF_ERROR(CheckKeys(*auth, "auth", {"tokens"}));
    if (const toml::node* tokens = auth->get("tokens")) {
      const toml::array* list = tokens->as_array();
      if (!list) return Bad("auth.tokens", "must be an array of tables ([[auth.tokens]])");
      config.tokens.clear();
      for (size_t i = 0; i < list->size(); ++i) {
        const std::string where = "auth.tokens[" + std::to_string(i) + "]";
        const toml::table* t = list->get(i)->as_table();
        if (!t) return Bad(where, "must be a table with name, sha256, scope, model_prefix");
        CKPT_RETURN_IF_ERROR(CheckKeys(*t, where, {"name", "sha256", "scope", "model_prefix"}));
        api::TokenGrant grant;
        std::string scope = "read";
        CKPT_RETURN_IF_ERROR(ReadString(*t, where, "name", grant.name));
        CKPT_RETURN_IF_ERROR(ReadString(*t, where, "sha256", grant.sha256_hex));
        CKPT_RETURN_IF_ERROR(ReadString(*t, where, "scope", scope));
        CKPT_RETURN_IF_ERROR(ReadString(*t, where, "model_prefix", grant.model_prefix));
        const auto parsed = api::ScopeFromName(scope);
        if (!parsed) return Bad(where + ".scope", "must be \"read\", \"write\" or \"admin\"");
        grant.scope = *parsed;
        config.tokens.push_back(std::move(grant));
      }
      auto check = api::Authorizer::Create(config.tokens);
      if (!check.ok()) return Bad("auth.tokens", check.status().message());
    }
  } else if (root.contains("auth")) {
    return Bad("auth", "must be a table");
  }

  if (const toml::table* log = root["log"].as_table()) {
    CKPT_RETURN_IF_ERROR(CheckKeys(*log, "log", {"level", "format"}));
    CKPT_RETURN_IF_ERROR(ReadString(*log, "log", "level", config.log_level));
    std::string format = "text";
    CKPT_RETURN_IF_ERROR(ReadString(*log, "log", "format", format));
    if (format != "text" && format != "json")
      return Bad("log.format", "must be \"text\" or \"json\"");
    config.server.json_logs = format == "json";
  } else if (root.contains("log")) {
    return Bad("log", "must be a table");
  }
  return Status::Ok();
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
