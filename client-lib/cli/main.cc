// ckpt: command-line client for ckptd. `ckpt --help` lists the commands, `ckpt COMMAND --help`
// each one's arguments.
//
// The server comes from --server or $CKPT_SERVER (default http://127.0.0.1:8420; https:// with
// --cacert or $CKPT_CACERT for a private CA; several daemons of one Ceph deployment separated by
// commas: each request goes to the first that answers, writes follow redirects), a bearer token
// (daemons with authorization) from $CKPT_TOKEN or --token-file (never a command-line argument,
// where other users could read it in the process list). Output is a table for people, or JSON
// with --json; a progress bar is drawn on stderr when it is a terminal. Any error prints one
// line and exits non-zero.
#include <malloc.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <vector>

#include "ckpt/client/client.h"
#include "ckpt/version.h"
#include "command.h"

int main(int argc, char** argv) {
  using namespace ckpt::cli;
  // A command lives for one transfer: memory it frees stays in the process for the next chunk
  // instead of going back to the kernel, which would map and zero it again (per-chunk buffers of
  // the codec are megabytes, above malloc's default mmap threshold).
  // The threshold is the largest every glibc accepts (half its arena heap); the trim threshold,
  // which turns off the automatic raise of the mmap threshold, is only set once that one took.
  if (mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1) mallopt(M_TRIM_THRESHOLD, 1 << 30);
  CLI::App app{"ckpt — client for the ckptd checkpoint store"};
  app.require_subcommand(1);
  // The environment's values count when set and not empty.
  const auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
  };
  std::string server = env("CKPT_SERVER");
  if (server.empty()) server = "http://127.0.0.1:8420";
  app.add_option("--server", server,
                 "ckptd base URL, or several of one deployment separated by commas (default: "
                 "$CKPT_SERVER, else http://127.0.0.1:8420)");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "file holding the bearer token (without it: the token held in $CKPT_TOKEN, if "
                 "set)");
  std::string ca_file, client_cert, client_key;
  app.add_option("--cacert", ca_file,
                 "https://: PEM file of the CAs the server certificate must chain to "
                 "(default: $CKPT_CACERT, else the system's)");
  app.add_option("--cert", client_cert, "https://: client certificate (PEM), if the server asks");
  app.add_option("--key", client_key, "https://: the client certificate's private key (PEM)");
  bool json = false;
  app.add_flag("--json", json, "print JSON for scripts instead of tables");
  app.set_version_flag("--version", std::string("ckpt ") + ckpt::kVersionString);

  std::vector<std::unique_ptr<Command>> commands;
  for (auto add :
       {AddPushCommand, AddPullCommand, AddListCommand, AddRemoveCommand, AddTagCommand,
        AddPolicyCommand, AddRetentionCommand, AddGcCommand, AddScrubCommand, AddBackupCommand}) {
    commands.push_back(add(app));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);
    return Usage(e.what());  // one line, exit 2, whatever CLI11 found wrong
  }

  ckpt::ClientOptions options;
  options.server = server;
  if (ca_file.empty()) ca_file = env("CKPT_CACERT");
  options.ca_file = ca_file;
  options.client_cert_file = client_cert;
  options.client_key_file = client_key;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in || !std::getline(in, options.token) || options.token.empty()) {
      std::cerr << "ckpt: cannot read a token from '" << token_file << "'\n";
      return kExitUsage;
    }
  } else {
    options.token = env("CKPT_TOKEN");
  }
  Session session(std::move(options), json, isatty(STDERR_FILENO) != 0);
  for (auto& command : commands) {
    if (command->parsed()) return command->Run(session);
  }
  return kExitUsage;
}
