// ckpt: command-line client for ckptd.
//
//   ckpt push MODEL VERSION FILE        push a safetensors file
//       [--shards N [--retries R]]      as N shards over N connections, each retried
//   ckpt pull MODEL VERSION|latest -o FILE   restore a version (verified by SHA-256)
//       [--tensors GLOB,...] [--rank I --of M]   or only some tensors / a rank's part
//   ckpt ls [MODEL]                     list models, or the versions of one model
//   ckpt rm MODEL [VERSION]             delete a version, or the whole model
//   ckpt policy MODEL [JSON]            show or set a model's codec policy
//
// The server comes from --server or $CKPT_SERVER (default http://127.0.0.1:8420; https:// with
// --cacert or $CKPT_CACERT for a private CA; several daemons of one Ceph deployment separated by
// commas: each request goes to the first that answers, writes follow redirects), a bearer token
// (daemons with authorization) from $CKPT_TOKEN or --token-file (never a command-line argument,
// where other users could read it in the process list). A progress
// bar is drawn on stderr when it is a terminal. Any error prints one line and exits non-zero.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "ckpt/client/client.h"
#include "ckpt/version.h"

namespace {

using Clock = std::chrono::steady_clock;

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// Draws "[=====>     ]  45%  1.2 GiB / 2.7 GiB  310.4 MiB/s" on stderr, at most 10 times/s.
class ProgressBar {
 public:
  void Update(uint64_t done, uint64_t total) {
    const auto now = Clock::now();
    if (done != total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = seconds > 0 ? static_cast<double>(done) / seconds : 0;
    constexpr int kWidth = 30;
    const double fraction = total ? static_cast<double>(done) / static_cast<double>(total) : 0;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < kWidth) bar += '>';
    bar.resize(kWidth, ' ');
    std::fprintf(stderr, "\r[%s] %3d%%  %s / %s  %s/s ", bar.c_str(),
                 static_cast<int>(fraction * 100), HumanBytes(done).c_str(),
                 HumanBytes(total).c_str(), HumanBytes(static_cast<uint64_t>(rate)).c_str());
    drawn_ = true;
  }
  ~ProgressBar() {
    if (drawn_) std::fprintf(stderr, "\n");
  }

 private:
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_{};
  bool drawn_ = false;
};

int Fail(const ckpt::Status& status) {
  std::cerr << "ckpt: " << status.message() << " (" << ckpt::StatusCodeName(status.code()) << ")\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckpt — client for the ckptd checkpoint store"};
  app.require_subcommand(1);
  std::string server = "http://127.0.0.1:8420";
  if (const char* env = std::getenv("CKPT_SERVER")) server = env;
  app.add_option(
      "--server", server,
      "ckptd base URL, or several separated by commas (default $CKPT_SERVER or " + server + ")");
  std::string token_file;
  app.add_option("--token-file", token_file,
                 "file holding the bearer token (default: $CKPT_TOKEN, if set)");
  std::string ca_file, client_cert, client_key;
  app.add_option("--cacert", ca_file,
                 "https://: PEM file of the CAs the server certificate must chain to "
                 "(default: $CKPT_CACERT, else the system's)");
  app.add_option("--cert", client_cert, "https://: client certificate (PEM), if the server asks");
  app.add_option("--key", client_key, "https://: the client certificate's private key (PEM)");
  bool show_version = false;
  app.set_version_flag("--version", std::string("ckpt ") + ckpt::kVersionString);
  (void)show_version;

  std::string model, version, file, json_text;
  uint64_t version_number = 0;
  auto* push = app.add_subcommand("push", "push a safetensors file as MODEL at VERSION");
  push->add_option("MODEL", model)->required();
  push->add_option("VERSION", version_number)->required();
  push->add_option("FILE", file)->required()->check(CLI::ExistingFile);
  std::vector<std::string> metrics, labels, tags;
  push->add_option("--metric", metrics, "NAME=NUMBER, a metric of this version (repeatable)");
  push->add_option("--label", labels, "NAME=TEXT, a label of this version (repeatable)");
  push->add_option("--tag", tags, "tag this version (repeatable; a tag moves if held)");
  ckpt::ShardedPushOptions sharded;
  sharded.shards = 0;
  push->add_option("--shards", sharded.shards,
                   "send the file as N shards over N connections at once (large tensors cut "
                   "by rows); the version appears when the last is stored")
      ->check(CLI::Range(1, 65536));
  push->add_option("--retries", sharded.retries,
                   "with --shards: attempts after the first per shard, for network errors, 5xx "
                   "and a busy model (default 3)")
      ->check(CLI::Range(0, 100));

  auto* pull = app.add_subcommand("pull", "restore a version (or latest) to a file");
  pull->add_option("MODEL", model)->required();
  pull->add_option("VERSION", version, "version number, 'latest' or 'tag:NAME'")->required();
  std::string hf_dir;
  uint64_t hf_max_bytes = 5'000'000'000;
  auto* output = pull->add_option("-o,--output", file, "output file ('-' for stdout)");
  auto* hf = pull->add_option("--hf-dir", hf_dir,
                              "write the Hugging Face view instead: DIR/model.safetensors."
                              "index.json and the files it lists");
  output->excludes(hf);
  pull->add_option("--max-shard-bytes", hf_max_bytes,
                   "with --hf-dir: the largest file (default 5000000000)");
  ckpt::PullOptions part;
  pull->add_option("--tensors", part.tensors,
                   "only tensors matching these patterns ('*', '?'; comma-separated or repeated)")
      ->delimiter(',');
  pull->add_option("--rank", part.rank, "with --of: the part of rank RANK of a resharded view");
  pull->add_option("--of", part.ranks, "with --rank: the number of ranks to reshard for");

  auto* ls = app.add_subcommand("ls", "list models, or the versions of MODEL");
  ls->add_option("MODEL", model);

  auto* rm = app.add_subcommand("rm", "delete a version, or the whole model");
  rm->add_option("MODEL", model)->required();
  rm->add_option("VERSION", version);

  auto* policy = app.add_subcommand("policy", "show or set the codec policy of MODEL");
  policy->add_option("MODEL", model)->required();
  policy->add_option("JSON", json_text,
                     "fields to change, e.g. '{\"mode\":\"lossy\",\"max_abs_error\":1e-3}' or "
                     "'{\"keyframe_every\":8}' (docs/api.md lists every field)");

  std::string tag_name;
  bool remove_tag = false;
  auto* tag = app.add_subcommand("tag", "tag (pin) VERSION of MODEL as TAG, or --remove it");
  tag->add_option("MODEL", model)->required();
  tag->add_option("VERSION", version_number)->required();
  tag->add_option("TAG", tag_name)->required();
  tag->add_flag("--remove", remove_tag, "remove the tag instead");

  bool preview = false, apply = false;
  auto* retention = app.add_subcommand(
      "retention", "show or set the retention policy of MODEL; --preview or --apply it now");
  retention->add_option("MODEL", model)->required();
  retention->add_option("JSON", json_text,
                        "a policy, e.g. '{\"keep_last\":5,\"keep_every\":1000}' (with "
                        "--preview: evaluated instead of the stored one)");
  retention->add_flag("--preview", preview, "list what the policy would delete, delete nothing");
  retention->add_flag("--apply", apply, "apply the stored policy now and reclaim the space");

  auto* gc = app.add_subcommand("gc", "apply every model's retention and reclaim space (admin)");
  auto* scrub = app.add_subcommand(
      "scrub", "verify every stored byte and version (admin); exit 1 if anything is damaged");
  std::string backup_dir;
  auto* backup = app.add_subcommand("backup", "online backup into DIR on the server (admin)");
  backup->add_option("DIR", backup_dir, "absolute path on the server")->required();

  CLI11_PARSE(app, argc, argv);

  ProgressBar bar;
  ckpt::ClientOptions options;
  options.server = server;
  if (ca_file.empty()) {
    if (const char* env = std::getenv("CKPT_CACERT")) ca_file = env;
  }
  options.ca_file = ca_file;
  options.client_cert_file = client_cert;
  options.client_key_file = client_key;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in || !std::getline(in, options.token) || options.token.empty()) {
      std::cerr << "ckpt: cannot read a token from '" << token_file << "'\n";
      return 2;
    }
  } else if (const char* env = std::getenv("CKPT_TOKEN")) {
    options.token = env;
  }
  if (isatty(STDERR_FILENO)) {
    options.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
  }
  auto client = ckpt::Client::Create(options);
  if (!client.ok()) return Fail(client.status());

  if (*push) {
    ckpt::PushMetadata metadata;
    for (const std::string& item : metrics) {
      const size_t eq = item.find('=');
      char* end = nullptr;
      const double value = eq == std::string::npos ? 0 : std::strtod(item.c_str() + eq + 1, &end);
      if (eq == std::string::npos || end == item.c_str() + eq + 1 || *end != '\0') {
        return Fail(ckpt::Status::InvalidArgument("--metric '" + item + "' must be NAME=NUMBER"));
      }
      metadata.metrics[item.substr(0, eq)] = value;
    }
    for (const std::string& item : labels) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos) {
        return Fail(ckpt::Status::InvalidArgument("--label '" + item + "' must be NAME=TEXT"));
      }
      metadata.labels[item.substr(0, eq)] = item.substr(eq + 1);
    }
    metadata.tags = tags;
    if (push->count("--retries") > 0 && sharded.shards == 0) {
      return Fail(ckpt::Status::InvalidArgument("--retries goes with --shards"));
    }
    auto r = sharded.shards > 0
                 ? client->PushFileSharded(model, version_number, file, sharded, metadata)
                 : client->PushFile(model, version_number, file, metadata);
    if (!r.ok()) return Fail(r.status());
    std::printf("pushed %s@%llu  %s  raw %s  stored %s  sha256 %s\n", r->model.c_str(),
                static_cast<unsigned long long>(r->version), r->kind.c_str(),
                HumanBytes(r->raw_bytes).c_str(), HumanBytes(r->stored_bytes).c_str(),
                r->sha256.c_str());
    return 0;
  }
  if (*pull) {
    if (!hf_dir.empty()) {
      auto files = client->PullHfDir(model, version, hf_dir, hf_max_bytes);
      if (!files.ok()) return Fail(files.status());
      for (const std::string& f : *files) std::fprintf(stderr, "wrote %s\n", f.c_str());
      return 0;
    }
    if (file.empty())
      return Fail(ckpt::Status::InvalidArgument("pull needs -o FILE or --hf-dir DIR"));
    if ((pull->count("--rank") > 0) != (pull->count("--of") > 0)) {
      return Fail(ckpt::Status::InvalidArgument("--rank and --of go together"));
    }
    auto r = client->PullToFile(model, version, file, part);
    if (!r.ok()) return Fail(r.status());
    if (file != "-") {
      std::fprintf(stderr, "pulled %s@%llu  %s  sha256 %s%s\n", model.c_str(),
                   static_cast<unsigned long long>(r->version), HumanBytes(r->bytes).c_str(),
                   r->sha256.c_str(), r->verified ? " (verified)" : "");
    }
    return 0;
  }
  if (*ls) {
    if (model.empty()) {
      auto models = client->ListModels();
      if (!models.ok()) return Fail(models.status());
      std::printf("%-32s %12s %9s %12s %12s %7s\n", "MODEL", "LATEST", "VERSIONS", "RAW", "STORED",
                  "RATIO");
      for (const auto& m : *models) {
        std::printf("%-32s %12s %9llu %12s %12s %6.2fx\n", m.name.c_str(),
                    m.latest_version ? std::to_string(*m.latest_version).c_str() : "-",
                    static_cast<unsigned long long>(m.version_count),
                    HumanBytes(m.raw_bytes).c_str(), HumanBytes(m.stored_bytes).c_str(),
                    m.stored_bytes ? static_cast<double>(m.raw_bytes) / m.stored_bytes : 0.0);
      }
      return 0;
    }
    auto versions = client->ListVersions(model);
    if (!versions.ok()) return Fail(versions.status());
    std::printf("%-20s %-9s %12s %12s %-25s %-64s %s\n", "VERSION", "KIND", "RAW", "STORED",
                "CREATED", "SHA256", "TAGS / METRICS");
    for (const auto& v : *versions) {
      std::string extra;
      for (const auto& name : v.tags) extra += (extra.empty() ? "" : " ") + name;
      for (const auto& [name, value] : v.metrics) {
        char item[160];
        std::snprintf(item, sizeof item, "%s%s=%g", extra.empty() ? "" : " ", name.c_str(), value);
        extra += item;
      }
      std::printf("%-20llu %-9s %12s %12s %-25s %-64s %s\n",
                  static_cast<unsigned long long>(v.version), v.kind.c_str(),
                  HumanBytes(v.raw_bytes).c_str(), HumanBytes(v.stored_bytes).c_str(),
                  v.created_at.c_str(), v.sha256.c_str(), extra.c_str());
    }
    return 0;
  }
  if (*rm) {
    if (version.empty()) {
      if (auto s = client->DeleteModel(model); !s.ok()) return Fail(s);
      std::printf("deleted model %s\n", model.c_str());
      return 0;
    }
    if (version.find_first_not_of("0123456789") != std::string::npos || version.size() > 20) {
      return Fail(ckpt::Status::InvalidArgument("VERSION must be a decimal number"));
    }
    if (auto s = client->DeleteVersion(model, std::stoull(version)); !s.ok()) return Fail(s);
    std::printf("deleted %s@%s\n", model.c_str(), version.c_str());
    return 0;
  }
  if (*policy) {
    auto r = json_text.empty() ? client->GetPolicy(model) : client->SetPolicy(model, json_text);
    if (!r.ok()) return Fail(r.status());
    std::printf("%s\n", r->c_str());
    return 0;
  }
  if (*tag) {
    auto s = remove_tag ? client->RemoveTag(model, version_number, tag_name)
                        : client->SetTag(model, version_number, tag_name);
    if (!s.ok()) return Fail(s);
    std::printf("%s %s@%llu %s\n", remove_tag ? "untagged" : "tagged", model.c_str(),
                static_cast<unsigned long long>(version_number), tag_name.c_str());
    return 0;
  }
  if (*retention) {
    ckpt::Result<std::string> r = preview || apply
                                      ? client->ApplyRetention(model, preview, json_text)
                                  : json_text.empty() ? client->GetRetention(model)
                                                      : client->SetRetention(model, json_text);
    if (!r.ok()) return Fail(r.status());
    std::printf("%s\n", r->c_str());
    return 0;
  }
  if (*gc || *scrub || *backup) {
    auto r = *gc ? client->CollectGarbage() : *scrub ? client->Scrub() : client->Backup(backup_dir);
    if (!r.ok()) return Fail(r.status());
    std::printf("%s\n", r->c_str());
    if (*scrub && r->find("\"clean\":false") != std::string::npos) return 1;
    return 0;
  }
  return 0;
}
