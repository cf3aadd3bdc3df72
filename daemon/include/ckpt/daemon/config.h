// DaemonConfig: everything ckptd can be configured with, from config/ckptd.toml and flags.
//
// Every option is documented in config/ckptd.toml (the example file lists all of them).
// Flags override the file: --listen, --data-dir, --log-level.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/api/auth.h"
#include "ckpt/api/http_server.h"
#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"

namespace ckpt::daemon {

// Background retention ([retention]): passes over every model and after pushes.
struct RetentionOptions {
  // Between passes over every model; zero disables them (passes after pushes still run).
  // Default: 600 s.
  std::chrono::seconds interval{600};
  // Run a pass for a model after each of its pushes. Default: true.
  bool after_push = true;
  // GcOptions::rebase_min_dead_fraction of the automatic passes. Default: 0.5.
  double rebase_min_dead_fraction = 0.5;
};

struct DaemonConfig {
  api::HttpServerOptions server;
  StoreOptions store;
  std::string log_level = "info";
  // If set, the bound port is written to this file once the daemon accepts connections (for
  // tests and supervisors that start ckptd on port 0).
  std::string ready_file;
  // Restore each model's latest version at start-up (in the background, smallest first, within
  // store.reference_cache_bytes) so that `latest` and the next push find it in memory. The ready
  // file is written when that is done.
  bool warm_cache_on_start = true;
  // Rearrange each model's latest version after its pushes (CheckpointStore::RearrangeLatest),
  // in the background: the latest is then one decode away. Default: true.
  bool rearrange_latest = true;
  // How long after a model's last push its rearrangement (and after-push retention pass) starts:
  // a burst of pushes gets one pass at its end. Default: 1000 ms.
  std::chrono::milliseconds rearrange_delay{1000};
  // Background retention; the server-wide default policy is store.default_retention.
  RetentionOptions retention;

  // Bearer tokens ([[auth.tokens]]); none: authorization disabled (loopback listeners only).
  std::vector<api::TokenGrant> tokens;

  DaemonConfig() { store.data_dir = "./data"; }
};

// A key of the configuration file, as the one table of keys in config.cc lists it. Every key
// takes effect when ckptd starts; none changes while it runs (config/ckptd.toml says "Restart").
struct ConfigKey {
  std::string_view section;
  std::string_view key;
};
// Every key ApplyToml accepts, section by section.
std::vector<ConfigKey> ConfigKeys();

// Parses a TOML document into `config`, overriding only what the document sets. Unknown keys
// and wrong types are InvalidArgument naming the key.
Status ApplyToml(std::string_view toml_text, DaemonConfig& config);
// Reads and applies a TOML file.
Status ApplyTomlFile(const std::string& path, DaemonConfig& config);
// Parses "host:port" into the server options.
Status ApplyListen(std::string_view listen, DaemonConfig& config);
// Refuses (FailedPrecondition, saying what to do) a listener on a non-loopback address without
// tokens: the API would be open to the network.
Status CheckListenerIsProtected(const DaemonConfig& config);

}  // namespace ckpt::daemon
