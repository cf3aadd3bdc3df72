// The ckpt CLI's subcommands: each registers its arguments on the parser and runs once parsed,
// against a Session that holds what every command shares.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/client/client.h"
#include "session.h"

namespace ckpt::cli {

// Exit codes of every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // the server or the input refused; a scrub found damage
inline constexpr int kExitUsage = 2;   // the command line is wrong (CLI11's own code too)

class Command {
 public:
  virtual ~Command() = default;
  // Runs the parsed command; returns the process's exit code.
  virtual int Run(Session& session) = 0;
  // Whether the command line named this command.
  bool parsed() const { return subcommand_ != nullptr && subcommand_->parsed(); }

 protected:
  // Adds the command's subcommand to `app` (once, from the constructor). Options after the
  // command's own, such as --json, go to the main parser.
  CLI::App* Define(CLI::App& app, const std::string& name, const std::string& description) {
    subcommand_ = app.add_subcommand(name, description);
    subcommand_->fallthrough();
    subcommand_->footer(
        "Every command also takes ckpt's own options (ckpt --help): --json (JSON for "
        "scripts), --server URL, --token-file, --cacert, --cert, --key.");
    return subcommand_;
  }

 private:
  CLI::App* subcommand_ = nullptr;
};

// Prints "ckpt: <message> (<CODE>)" on stderr and returns kExitFailed.
int Fail(const Status& status);
// Prints "ckpt: <message>" on stderr and returns kExitUsage: arguments that do not go together.
int Usage(const std::string& message);

// The JSON document of a Client call that answers JSON text (its error as it is).
Result<nlohmann::json> ParseJsonAnswer(const Result<std::string>& text);

// Each adds its subcommand to `app`; the command runs if that subcommand is the one parsed.
std::unique_ptr<Command> AddPushCommand(CLI::App& app);
std::unique_ptr<Command> AddPullCommand(CLI::App& app);
std::unique_ptr<Command> AddListCommand(CLI::App& app);
std::unique_ptr<Command> AddRemoveCommand(CLI::App& app);
std::unique_ptr<Command> AddTagCommand(CLI::App& app);
std::unique_ptr<Command> AddPolicyCommand(CLI::App& app);
std::unique_ptr<Command> AddRetentionCommand(CLI::App& app);
std::unique_ptr<Command> AddGcCommand(CLI::App& app);
std::unique_ptr<Command> AddScrubCommand(CLI::App& app);
std::unique_ptr<Command> AddBackupCommand(CLI::App& app);

}  // namespace ckpt::cli
