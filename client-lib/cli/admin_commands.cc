// ckpt gc, ckpt scrub and ckpt backup: the server's administrative passes (admin scope).
#include <cstdio>

#include "command.h"
#include "output.h"

namespace ckpt::cli {
namespace {

using nlohmann::json;

class GcCommand final : public Command {
 public:
  explicit GcCommand(CLI::App& app) {
    Define(app, "gc",
           "apply every model's stored retention policy now (deleting the versions "
           "it does not keep) and reclaim the space (admin)");
  }

  int Run(Session& session) override {
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    auto report = ParseJsonAnswer((*client)->CollectGarbage());
    if (!report.ok()) return Fail(report.status());
    if (session.json()) {
      PrintJson(*report);
      return kExitOk;
    }
    Table table({{"MODEL"},
                 {"DELETED", true},
                 {"FREED", true},
                 {"RECLAIMED", true},
                 {"RE-ENCODED", true},
                 {"NOTE"}});
    for (const auto& m : report->value("models", json::array())) {
      const json gc = m.value("gc", json::object());
      table.AddRow({m.value("model", ""), std::to_string(m.value("deleted", json::array()).size()),
                    HumanBytes(gc.value("bytes_freed", uint64_t{0})),
                    HumanBytes(gc.value("bytes_reclaimed", uint64_t{0})),
                    std::to_string(gc.value("versions_rebased", uint64_t{0})),
                    m.contains("error") ? CellText(m["error"]) : ""});
    }
    table.Print();
    std::printf("%llu version(s) deleted, %s freed; %s that earlier passes freed left the disk\n",
                static_cast<unsigned long long>(report->value("deleted_versions", uint64_t{0})),
                HumanBytes(report->value("bytes_freed", uint64_t{0})).c_str(),
                HumanBytes(report->value("bytes_reclaimed", uint64_t{0})).c_str());
    return kExitOk;
  }
};

class ScrubCommand final : public Command {
 public:
  explicit ScrubCommand(CLI::App& app) {
    Define(app, "scrub",
           "read and verify every stored byte and restore every version (admin); "
           "exit 1 if anything is damaged");
  }

  int Run(Session& session) override {
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    auto report = ParseJsonAnswer((*client)->Scrub());
    if (!report.ok()) return Fail(report.status());
    const bool clean = report->value("clean", false);
    if (session.json()) {
      PrintJson(*report);
      return clean ? kExitOk : kExitFailed;
    }
    Table table({{"MODEL"},
                 {"STATE"},
                 {"VERSIONS", true},
                 {"CHUNKS", true},
                 {"BYTES", true},
                 {"DAMAGED VERSIONS"}});
    std::vector<std::string> problems;
    for (const auto& m : report->value("models", json::array())) {
      const bool ok = m.value("clean", false);
      table.AddRow({m.value("model", ""), ok ? "clean" : "DAMAGED",
                    std::to_string(m.value("versions_checked", uint64_t{0})),
                    std::to_string(m.value("chunks_checked", uint64_t{0})),
                    HumanBytes(m.value("bytes_checked", uint64_t{0})),
                    CellText(m.value("damaged_versions", json::array()))});
      for (const auto& p : m.value("problems", json::array())) {
        problems.push_back(m.value("model", "") + ": " + CellText(p));
      }
    }
    table.Print();
    for (const std::string& p : problems) std::printf("problem: %s\n", p.c_str());
    std::printf("%s\n", clean ? "clean" : "damage found (see above)");
    return clean ? kExitOk : kExitFailed;
  }
};

class BackupCommand final : public Command {
 public:
  explicit BackupCommand(CLI::App& app) {
    auto* c = Define(
        app, "backup",
        "a consistent online backup of the whole store into DIR on the server (admin); DIR and "
        "its parents are created if missing; backups there accumulate, each restorable with "
        "ckptd restore-backup");
    c->add_option("DIR", dir_, "absolute path on the server")->required();
  }

  int Run(Session& session) override {
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    auto backup = ParseJsonAnswer((*client)->Backup(dir_));
    if (!backup.ok()) return Fail(backup.status());
    if (session.json()) {
      PrintJson(*backup);
      return kExitOk;
    }
    std::printf("backup %llu in %s: %llu files, %s, %s\n",
                static_cast<unsigned long long>(backup->value("backup_id", uint64_t{0})),
                backup->value("dir", "").c_str(),
                static_cast<unsigned long long>(backup->value("files", uint64_t{0})),
                HumanBytes(backup->value("size_bytes", uint64_t{0})).c_str(),
                ShortTime(backup->value("created_at", "")).c_str());
    return kExitOk;
  }

 private:
  std::string dir_;
};

}  // namespace

std::unique_ptr<Command> AddGcCommand(CLI::App& app) { return std::make_unique<GcCommand>(app); }
std::unique_ptr<Command> AddScrubCommand(CLI::App& app) {
  return std::make_unique<ScrubCommand>(app);
}
std::unique_ptr<Command> AddBackupCommand(CLI::App& app) {
  return std::make_unique<BackupCommand>(app);
}

}  // namespace ckpt::cli
