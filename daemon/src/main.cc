// ckptd: the checkpoint storage daemon. Wires config, store, background retention and HTTP
// server together and handles signals: SIGINT/SIGTERM stop accepting, let in-flight requests
// finish (up to server.shutdown_grace_seconds), flush and close RocksDB, and exit 0.
//
// `ckptd gc` is the offline form of POST /v1/admin/gc: with the daemon stopped, it applies every
// model's retention policy, reclaims the space and prints one JSON report per model. `ckptd
// scrub` is the offline form of POST /v1/admin/scrub, `ckptd backup --to DIR` of POST
// /v1/admin/backup; `ckptd restore-backup --from DIR --data-dir NEW` brings a backup back.
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "background_runner.h"
#include "cache_warmer.h"
#include "ckpt/api/http_server.h"
#include "ckpt/daemon/config.h"
#include "ckpt/storage/checkpoint_store.h"
#include "ckpt/storage/maintenance_service.h"
#include "ckpt/version.h"
#include "health_watcher.h"
#include "upload_expirer.h"

namespace {

// The JSON log line's fields after time and level: a message that is itself a JSON object (the
// request log with json_logs) contributes its members; any other becomes "msg", escaped.
class JsonFields final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    std::string out;
    if (text.size() >= 2 && text.front() == '{' && text.back() == '}') {
      out = std::string(text.substr(1, text.size() - 2));
    } else {
      out = "\"msg\":" + nlohmann::json(std::string(text))
                             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    dest.append(out.data(), out.data() + out.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonFields>();
  }
};

using ckpt::daemon::DaemonConfig;

int Fail(const ckpt::Status& status) {
  std::cerr << "ckptd: " << status.ToLogString() << "\n";
  return 2;
}

ckpt::Status WriteReadyFile(const std::string& path, uint16_t port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    if (!out) return ckpt::Status::IoError("cannot write ready file '" + tmp + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return ckpt::Status::IoError("cannot rename ready file: " + ec.message());
  return ckpt::Status::Ok();
}

// Opens the existing store for an offline command: a data directory without one is an error
// (a mistyped --data-dir must not check, and report on, an empty store made there). The daemon
// holds RocksDB's lock while it runs.
ckpt::Result<std::unique_ptr<ckpt::CheckpointStore>> OpenOffline(const DaemonConfig& config) {
  ckpt::StoreOptions options = config.store;
  options.create_if_missing = false;
  auto store = ckpt::CheckpointStore::Open(options);
  if (!store.ok()) {
    if (store.status().code() != ckpt::StatusCode::kIoError) return store.status();
    return store.status().WithContext(
        "opening the store (is ckptd running on it? then use the /v1/admin endpoints)");
  }
  return store;
}

// Offline garbage collection: every model, full reclamation; one JSON line per model.
int RunOfflineGc(const DaemonConfig& config) {
  auto store = OpenOffline(config);
  if (!store.ok()) return Fail(store.status());
  auto pass = ckpt::MaintenanceService(store->get()).CollectAll(std::chrono::milliseconds(0));
  if (!pass.ok()) return Fail(pass.status());
  for (const ckpt::GcPassReport::Model& model : pass->models) {
    if (model.status.ok()) {
      std::cout << ckpt::api::RetentionReportJson(model.report) << "\n";
    } else {
      std::cerr << "ckptd gc: model '" << model.name << "': " << model.status.ToLogString() << "\n";
    }
  }
  if (auto s = (*store)->Flush(); !s.ok()) return Fail(s);
  std::cerr << "ckptd gc: " << pass->models.size() << " model(s), " << pass->deleted_versions
            << " version(s) deleted, " << pass->bytes_freed << " bytes freed\n";
  return pass->failures() == 0 ? 0 : 1;
}

// Offline scrub: every model; one JSON line per model. Exit 0 if all are clean, 1 if not.
int RunOfflineScrub(const DaemonConfig& config) {
  auto store = OpenOffline(config);
  if (!store.ok()) return Fail(store.status());
  auto pass = ckpt::MaintenanceService(store->get()).ScrubAll();
  if (!pass.ok()) return Fail(pass.status());
  size_t damaged = 0;
  for (const ckpt::ScrubReport& report : pass->models) {
    if (!report.clean()) ++damaged;
    std::cout << ckpt::api::ScrubReportJson(report) << "\n";
  }
  std::cerr << "ckptd scrub: " << pass->models.size() << " model(s), " << damaged
            << " with problems\n";
  return damaged == 0 ? 0 : 1;
}

// Offline backup of the whole store into `to`; prints the backup's JSON.
int RunOfflineBackup(const DaemonConfig& config, const std::string& to) {
  auto store = OpenOffline(config);
  if (!store.ok()) return Fail(store.status());
  auto backup = ckpt::MaintenanceService(store->get()).Backup(to);
  if (!backup.ok()) return Fail(backup.status());
  std::cout << ckpt::api::BackupResultJson(*backup) << "\n";
  return 0;
}

// Copies the models of the store (all, or `only`) into the store `to_config` describes; one JSON
// line per model. A model the destination holds already is skipped (so a copy cut short can be
// run again). Exit 0 when every model was copied or skipped, 1 if one failed.
int RunCopyStore(const DaemonConfig& config, const std::string& to_config,
                 const std::vector<std::string>& only) {
  DaemonConfig destination_config;
  if (auto s = ckpt::daemon::ApplyTomlFile(to_config, destination_config); !s.ok()) return Fail(s);
  auto source = OpenOffline(config);
  if (!source.ok()) return Fail(source.status().WithContext("the source store"));
  std::error_code ec;
  std::filesystem::create_directories(destination_config.store.data_dir, ec);
  auto destination = ckpt::CheckpointStore::Open(destination_config.store);
  if (!destination.ok()) return Fail(destination.status().WithContext("the destination store"));
  std::vector<std::string> models = only;
  if (models.empty()) {
    auto listed = (*source)->ListModels();
    if (!listed.ok()) return Fail(listed.status());
    for (const ckpt::ModelInfo& m : *listed) models.push_back(m.name);
  }
  size_t copied = 0, skipped = 0, failed = 0;
  for (const std::string& model : models) {
    auto report = (*source)->CopyModelTo(model, **destination);
    nlohmann::json line = {{"model", model}};
    if (report.ok()) {
      ++copied;
      line["copied"] = {
          {"versions", report->versions}, {"chunks", report->chunks}, {"bytes", report->bytes}};
    } else if (report.status().code() == ckpt::StatusCode::kFailedPrecondition &&
               (*destination)->GetModel(model).ok()) {
      ++skipped;
      line["skipped"] = report.status().message();
    } else {
      ++failed;
      line["error"] = report.status().message();
    }
    std::cout << line.dump() << "\n";
  }
  if (auto s = (*destination)->Flush(); !s.ok()) return Fail(s);
  std::cerr << "ckptd copy-store: " << copied << " model(s) copied, " << skipped
            << " already in the destination, " << failed << " failed\n";
  return failed == 0 ? 0 : 1;
}

// Restores the newest backup in `from` into a new data directory and checks that it opens.
int RunRestoreBackup(const DaemonConfig& config, const std::string& from) {
  if (auto s = ckpt::CheckpointStore::RestoreBackup(from, config.store.data_dir); !s.ok()) {
    return Fail(s);
  }
  auto store = ckpt::CheckpointStore::Open(config.store);
  if (!store.ok()) return Fail(store.status().WithContext("opening the restored store"));
  auto models = (*store)->ListModels();
  if (!models.ok()) return Fail(models.status());
  uint64_t versions = 0;
  for (const auto& m : *models) versions += m.version_count;
  std::cerr << "ckptd restore-backup: " << models->size() << " model(s), " << versions
            << " version(s) restored into " << config.store.data_dir << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
#ifdef __GLIBC__
  // The daemon's large buffers (chunks, decoded references, the reference cache's entries) are
  // allocated on one thread and freed on another: a push encodes on its own thread, restores
  // decode ahead on theirs. With glibc's default of 8 arenas per core, memory freed into one
  // arena is not reused by threads of the others; two arenas keep the peak well lower at the
  // same throughput (docs/design.md, "Concurrency").
  mallopt(M_ARENA_MAX, 2);
#endif
  CLI::App app{"ckptd — storage daemon for versioned deep-learning checkpoints"};
  std::string config_path, listen, data_dir, log_level, ready_file;
  bool show_version = false;
  app.add_option("--config", config_path, "TOML config file (see config/ckptd.toml)");
  app.add_option("--listen", listen,
                 "HOST:PORT to listen on (overrides server.listen; default 127.0.0.1:8420)");
  app.add_option("--data-dir", data_dir,
                 "data directory (overrides storage.data_dir; default ./data, relative to the "
                 "working directory)");
  app.add_option("--log-level", log_level,
                 "trace|debug|info|warn|error (overrides log.level; default info)");
  app.add_option("--ready-file", ready_file,
                 "write the bound port to this file once accepting connections and the cache "
                 "warm-up (storage.warm_cache_on_start) has finished");
  app.add_flag("--version", show_version, "print the version and exit");
  // The offline commands work on an existing store, which the daemon must not be serving (it
  // holds the database's lock). Each lists --data-dir and --config in its own help; the main
  // options (--log-level) apply to them too.
  const auto add_store_options = [&](CLI::App* command, const std::string& data_dir_help) {
    command->add_option("--data-dir", data_dir, data_dir_help);
    command->add_option("--config", config_path,
                        "TOML config file whose storage.data_dir is used without --data-dir");
    command->fallthrough();
  };
  const std::string existing_store =
      "data directory of an existing store (overrides storage.data_dir; default ./data; a "
      "directory without a store is an error, exit 2)";
  CLI::App* gc = app.add_subcommand(
      "gc",
      "offline: apply every model's retention policy and reclaim space, then exit; deletes the "
      "versions the stored policies do not keep. Prints one JSON report per model");
  add_store_options(gc, existing_store);
  CLI::App* scrub = app.add_subcommand(
      "scrub",
      "offline: read and verify every stored chunk, restore every version, report per "
      "model (one JSON line each); exit 1 if anything is damaged");
  add_store_options(scrub, existing_store);
  std::string backup_to, backup_from;
  CLI::App* backup = app.add_subcommand(
      "backup",
      "offline: a consistent backup of the store into --to (while the daemon runs, use "
      "POST /v1/admin/backup)");
  backup->add_option("--to", backup_to, "backup directory (created with its parents if missing)")
      ->required();
  add_store_options(backup, existing_store);
  CLI::App* restore_backup = app.add_subcommand(
      "restore-backup", "restore the newest backup in --from into --data-dir (new or empty)");
  restore_backup->add_option("--from", backup_from, "backup directory (must exist)")->required();
  add_store_options(restore_backup,
                    "the new (or empty) data directory to restore into; this or --config's "
                    "storage.data_dir is required");
  std::string copy_to;
  std::vector<std::string> copy_models;
  CLI::App* copy_store = app.add_subcommand(
      "copy-store",
      "offline: copy the store's models, as stored (nothing re-encoded), into the store another "
      "config file describes: a local store into an S3 bucket or a Ceph pool, or back. Models "
      "the destination holds already are skipped; nothing is deleted on either side. One JSON "
      "line per model");
  copy_store->add_option("--to-config", copy_to, "TOML config file of the destination store")
      ->required();
  copy_store->add_option("--model", copy_models, "copy only this model (repeatable)");
  add_store_options(copy_store,
                    "data directory of the source store (overrides storage.data_dir; a source "
                    "on S3 or RADOS is the store --config describes)");
  CLI11_PARSE(app, argc, argv);
  if (show_version) {
    std::cout << "ckptd " << ckpt::kVersionString << "\n";
    return 0;
  }

  DaemonConfig config;
  if (!config_path.empty()) {
    if (auto s = ckpt::daemon::ApplyTomlFile(config_path, config); !s.ok()) return Fail(s);
  }
  if (!listen.empty()) {
    if (auto s = ckpt::daemon::ApplyListen(listen, config); !s.ok()) return Fail(s);
  }
  if (!data_dir.empty()) config.store.data_dir = data_dir;
  if (!log_level.empty()) config.log_level = log_level;
  if (!ready_file.empty()) config.ready_file = ready_file;

  const auto level = spdlog::level::from_str(config.log_level);
  if (level == spdlog::level::off && config.log_level != "off") {
    return Fail(ckpt::Status::InvalidArgument("unknown log level '" + config.log_level + "'"));
  }
  spdlog::set_level(level);
  if (config.server.json_logs) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonFields>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l",%*})");
    spdlog::set_formatter(std::move(formatter));
  } else {
    spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  }
  if (gc->parsed()) return RunOfflineGc(config);
  if (scrub->parsed()) return RunOfflineScrub(config);
  if (backup->parsed()) return RunOfflineBackup(config, backup_to);
  if (copy_store->parsed()) return RunCopyStore(config, copy_to, copy_models);
  if (restore_backup->parsed()) {
    if (data_dir.empty() && config_path.empty()) {
      return Fail(ckpt::Status::InvalidArgument(
          "restore-backup needs --data-dir (a new directory), or --config naming one"));
    }
    return RunRestoreBackup(config, backup_from);
  }

  if (auto s = ckpt::daemon::CheckListenerIsProtected(config); !s.ok()) return Fail(s);
  if (!config.tokens.empty()) {
    auto authorizer = ckpt::api::Authorizer::Create(config.tokens);
    if (!authorizer.ok()) return Fail(authorizer.status());
    config.server.authorizer =
        std::make_shared<const ckpt::api::Authorizer>(std::move(authorizer).value());
    spdlog::info("authorization on: {} token(s)", config.tokens.size());
  }

  // Block the shutdown signals in every thread; the main thread waits for them below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::error_code ec;
  std::filesystem::create_directories(config.store.data_dir, ec);
  if (ec) {
    return Fail(ckpt::Status::IoError("cannot create data directory '" + config.store.data_dir +
                                      "': " + ec.message()));
  }
  config.store.engine_log = [](std::string_view line) { spdlog::warn("rocksdb: {}", line); };
  auto store = ckpt::CheckpointStore::Open(config.store);
  if (!store.ok()) return Fail(store.status());
  auto health_watcher = std::make_unique<ckpt::daemon::HealthWatcher>(store->get());
  auto upload_expirer =
      std::make_unique<ckpt::daemon::UploadExpirer>(store->get(), config.store.upload_expiry);
  auto background_runner = std::make_unique<ckpt::daemon::BackgroundRunner>(
      store->get(), config.retention, config.rearrange_latest, config.rearrange_delay);
  config.server.on_versions_changed = [runner = background_runner.get()](const std::string& model) {
    runner->VersionsChanged(model);
  };
  auto server = ckpt::api::HttpServer::Start(config.server, store->get());
  if (!server.ok()) return Fail(server.status());
  spdlog::info("ckptd {} listening on {}:{} with data in {}", ckpt::kVersionString,
               config.server.address, (*server)->port(), config.store.data_dir);
  // Requests are served from here on. The ready file (for supervisors and tests) is written once
  // the reference cache holds each model's latest version again, or at once without warm-up.
  const uint16_t port = (*server)->port();
  std::unique_ptr<ckpt::daemon::CacheWarmer> warmer;
  if (config.warm_cache_on_start) {
    warmer = std::make_unique<ckpt::daemon::CacheWarmer>(
        store->get(), config.store.reference_cache_bytes,
        [&config, port](const ckpt::daemon::WarmupResult&) {
          if (config.ready_file.empty()) return;
          if (auto s = WriteReadyFile(config.ready_file, port); !s.ok()) {
            spdlog::error("{}", s.ToLogString());
          }
        });
    warmer->Start();
  } else if (!config.ready_file.empty()) {
    if (auto s = WriteReadyFile(config.ready_file, port); !s.ok()) return Fail(s);
  }

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("received signal {}, shutting down", signal_number);
  warmer.reset();  // stops a warm-up still running
  (*server)->Shutdown();
  server->reset();
  background_runner.reset();  // finishes the pass in progress
  health_watcher.reset();
  upload_expirer.reset();
  if (auto s = (*store)->Flush(); !s.ok())
    spdlog::error("flush on shutdown failed: {}", s.ToLogString());
  store->reset();
  spdlog::info("ckptd stopped cleanly");
  return 0;
}
