// ckpt push and ckpt pull.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>

#include "command.h"
#include "output.h"

namespace ckpt::cli {
namespace {

using nlohmann::json;

// Where encoded pushes and pulls keep the references of `client`'s server:
// $XDG_CACHE_HOME/ckpt/references/HOST-PORT, or ~/.cache/ckpt/references/HOST-PORT. Host names
// are lower-cased, as the Python client's are, so that both find the same references.
std::string ReferenceDirFor(const Client& client) {
  std::string cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    cache = std::string(xdg) + "/ckpt";
  } else {
    const char* home = std::getenv("HOME");
    cache = std::string(home != nullptr ? home : ".") + "/.cache/ckpt";
  }
  const ServerEndpoint& server = client.endpoints().front();
  std::string host = server.host;
  std::transform(host.begin(), host.end(), host.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return cache + "/references/" + host + "-" + server.port;
}

class PushCommand final : public Command {
 public:
  explicit PushCommand(CLI::App& app) {
    auto* c = Define(app, "push", "push a safetensors file as MODEL at VERSION");
    c->add_option("MODEL", model_, "model name")->required();
    c->add_option("VERSION", version_, "version number, above the model's latest")->required();
    c->add_option("FILE", file_, "safetensors file")->required()->check(CLI::ExistingFile);
    c->add_option("--metric", metrics_, "NAME=NUMBER, a metric of this version (repeatable)");
    c->add_option("--label", labels_, "NAME=TEXT, a label of this version (repeatable)");
    c->add_option("--tag", tags_, "tag this version (repeatable; a tag moves if held)");
    sharded_.shards = 0;
    c->add_option("--connections", sharded_.shards,
                  "send the file over N connections at once, as N shards (large tensors cut by "
                  "rows); the version appears when the last is stored and restores the same "
                  "tensors in a sharded version's layout, not the file's bytes (default: one "
                  "connection); "
                  "with --encoded, each shard is coded here against the "
                  "same shard of the last version (kept as MODEL.rankI-of-N in the reference "
                  "directory)")
        ->check(CLI::Range(1, 65536));
    c->add_flag("--encoded", encoded_,
                "code the file here, as the server would, and send only what is stored (its "
                "deltas need the model's latest version: kept from this machine's last encoded "
                "push, or pulled first)");
    reference_dir_ = c->add_option("--reference-dir", encoded_options_.reference_dir,
                                   "with --encoded: where the restored body of each model's last "
                                   "push is kept (default: ~/.cache/ckpt/references/HOST-PORT, "
                                   "under $XDG_CACHE_HOME if set)");
    threads_ = c->add_option("--threads", encoded_options_.threads,
                             "with --encoded: encoder threads, per shard with --connections "
                             "(default: the machine's cores, shared by the shards)")
                   ->check(CLI::Range(1, 1024));
    retries_ = c->add_option("--retries", sharded_.retries,
                             "with --connections: attempts after the first per shard, for "
                             "network errors, 5xx and a busy model (default 3)")
                   ->check(CLI::Range(0, 100));
  }

  int Run(Session& session) override {
    PushMetadata metadata;
    for (const std::string& item : metrics_) {
      const size_t eq = item.find('=');
      char* end = nullptr;
      const double value = eq == std::string::npos ? 0 : std::strtod(item.c_str() + eq + 1, &end);
      if (eq == std::string::npos || end == item.c_str() + eq + 1 || *end != '\0') {
        return Usage("--metric '" + item + "' must be NAME=NUMBER");
      }
      metadata.metrics[item.substr(0, eq)] = value;
    }
    for (const std::string& item : labels_) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos) {
        return Usage("--label '" + item + "' must be NAME=TEXT");
      }
      metadata.labels[item.substr(0, eq)] = item.substr(eq + 1);
    }
    metadata.tags = tags_;
    if (!encoded_ && threads_->count() > 0) return Usage("--threads goes with --encoded");
    if (!encoded_ && reference_dir_->count() > 0) {
      return Usage("--reference-dir goes with --encoded");
    }
    if (retries_->count() > 0 && sharded_.shards == 0) {
      return Usage("--retries goes with --connections");
    }
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    if (encoded_ && encoded_options_.reference_dir.empty()) {
      encoded_options_.reference_dir = ReferenceDirFor(**client);
    }
    if (encoded_ && sharded_.shards > 0) sharded_.encoded = encoded_options_;
    auto r = sharded_.shards > 0
                 ? (*client)->PushFileSharded(model_, version_, file_, sharded_, metadata)
             : encoded_
                 ? (*client)->PushFileEncoded(model_, version_, file_, encoded_options_, metadata)
                 : (*client)->PushFile(model_, version_, file_, metadata);
    session.progress().Clear();
    if (!r.ok()) return Fail(r.status());
    if (session.json()) {
      PrintJson({{"model", r->model},
                 {"version", r->version},
                 {"kind", r->kind},
                 {"lossy", r->lossy},
                 {"raw_bytes", r->raw_bytes},
                 {"stored_bytes", r->stored_bytes},
                 {"created_at", r->created_at},
                 {"tensor_count", r->tensor_count},
                 {"tags", r->tags},
                 {"metrics", r->metrics},
                 {"labels", r->labels},
                 {"sha256", r->sha256},
                 {"pushed_sha256", r->pushed_sha256},
                 {"sent_bytes", r->sent_bytes},
                 {"encoded", r->encoded},
                 {"reference", r->reference},
                 {"reference_note", r->reference_note}});
      return kExitOk;
    }
    // The file's own hash (what sha256sum prints); a lossy version restores to other bytes,
    // whose hash `ckpt ls` shows.
    const std::string pushed_sha = r->pushed_sha256.empty() ? r->sha256 : r->pushed_sha256;
    std::string restores;
    if (!r->sha256.empty() && r->sha256 != pushed_sha) {
      restores = " (the file's; restores to " + ShortHash(r->sha256) + ")";
    }
    std::printf("pushed %s@%llu  %s%s  raw %s  stored %s (%s)  sha256 %s%s\n", r->model.c_str(),
                static_cast<unsigned long long>(r->version), r->kind.c_str(),
                r->lossy ? " lossy" : "", HumanBytes(r->raw_bytes).c_str(),
                HumanBytes(r->stored_bytes).c_str(), Ratio(r->raw_bytes, r->stored_bytes).c_str(),
                ShortHash(pushed_sha).c_str(), restores.c_str());
    if (r->encoded) {
      const std::string note = r->reference_note.empty() ? "" : " (" + r->reference_note + ")";
      std::printf("coded here: sent %s%s%s\n", HumanBytes(r->sent_bytes).c_str(),
                  r->reference.empty() ? "" : (", reference " + r->reference).c_str(),
                  note.c_str());
    } else if (encoded_) {
      std::printf("coded by the server: %s\n", r->reference_note.c_str());
    }
    return kExitOk;
  }

 private:
  bool encoded_ = false;
  EncodedPushOptions encoded_options_;
  std::string model_, file_;
  uint64_t version_ = 0;
  std::vector<std::string> metrics_, labels_, tags_;
  ShardedPushOptions sharded_;
  CLI::Option* retries_ = nullptr;
  CLI::Option* threads_ = nullptr;
  CLI::Option* reference_dir_ = nullptr;
};

class PullCommand final : public Command {
 public:
  explicit PullCommand(CLI::App& app) {
    auto* c = Define(app, "pull",
                     "restore a version to a file, verified by SHA-256; an interrupted pull keeps "
                     "FILE.partial and the same command resumes it");
    c->add_option("MODEL", model_, "model name")->required();
    c->add_option("VERSION", version_, "version number, 'latest' or 'tag:NAME'")->required();
    auto* output = c->add_option(
        "-o,--output", file_,
        "output file ('-' for stdout, not with --encoded); this or --hf-dir is required");
    auto* hf = c->add_option("--hf-dir", hf_dir_,
                             "write the Hugging Face view instead: DIR/model.safetensors."
                             "index.json and the files it lists");
    output->excludes(hf);
    c->add_option("--max-shard-bytes", hf_max_bytes_,
                  "with --hf-dir: the largest file (default 5000000000)");
    c->add_option("--tensors", part_.tensors,
                  "only tensors matching these patterns ('*', '?'; comma-separated or repeated)")
        ->delimiter(',');
    rank_ = c->add_option("--rank", part_.rank,
                          "with --world-size: the part rank RANK holds of a resharded view");
    world_size_ = c->add_option("--world-size", part_.ranks,
                                "with --rank: the number of ranks to reshard for");
    c->add_flag("--encoded", encoded_,
                "receive the stored records and decode them here (the wire carries the stored "
                "bytes); with a reconstruction of an earlier version held, only the deltas "
                "after it; with --tensors or --rank, the records of the chunks holding that "
                "part (the reconstruction held is neither used nor replaced)");
    reference_dir_ = c->add_option(
        "--reference-dir", encoded_options_.reference_dir,
        "with --encoded: where the restored body of each model's last version pushed or pulled "
        "is kept (a pull of an older version than the one kept leaves it; default: "
        "~/.cache/ckpt/references/HOST-PORT, under $XDG_CACHE_HOME if set)");
    threads_ = c->add_option("--threads", encoded_options_.threads,
                             "with --encoded: decoder threads (default: the machine's cores)")
                   ->check(CLI::Range(1, 1024));
  }

  int Run(Session& session) override {
    if (encoded_ && !hf_dir_.empty()) {
      return Usage("--encoded pulls into a file (-o FILE), not a Hugging Face view");
    }
    if (!encoded_ && reference_dir_->count() > 0) {
      return Usage("--reference-dir goes with --encoded");
    }
    if (!encoded_ && threads_->count() > 0) return Usage("--threads goes with --encoded");
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    if (!hf_dir_.empty()) {
      auto files = (*client)->PullHfDir(model_, version_, hf_dir_, hf_max_bytes_);
      session.progress().Clear();
      if (!files.ok()) return Fail(files.status());
      if (session.json()) {
        PrintJson({{"files", *files}});
      } else {
        for (const std::string& f : *files) std::printf("wrote %s\n", f.c_str());
      }
      return kExitOk;
    }
    if (file_.empty()) return Usage("pull needs -o FILE or --hf-dir DIR");
    if ((rank_->count() > 0) != (world_size_->count() > 0)) {
      return Usage("--rank and --world-size go together");
    }
    if (encoded_ && file_ == "-") return Usage("--encoded pulls into a file, not stdout");
    if (encoded_ && encoded_options_.reference_dir.empty()) {
      encoded_options_.reference_dir = ReferenceDirFor(**client);
    }
    auto r = encoded_ ? (*client)->PullEncoded(model_, version_, file_, encoded_options_, part_)
                      : (*client)->PullToFile(model_, version_, file_, part_);
    session.progress().Clear();
    if (!r.ok()) return Fail(r.status());
    if (file_ == "-") return kExitOk;  // stdout holds the body
    if (session.json()) {
      PrintJson({{"model", model_},
                 {"version", r->version},
                 {"file", file_},
                 {"restored_bytes", r->bytes},
                 {"bytes", r->bytes},  // restored_bytes' first name, kept for scripts
                 {"sha256", r->sha256},
                 {"verified", r->verified},
                 {"resumed_bytes", r->resumed_bytes},
                 {"encoded", encoded_},
                 {"received_bytes", encoded_ ? r->received_bytes : r->bytes - r->resumed_bytes},
                 {"since_version", r->since_version}});
      return kExitOk;
    }
    std::string resumed;
    if (r->resumed_bytes > 0) resumed = "  resumed after " + HumanBytes(r->resumed_bytes);
    std::printf("pulled %s@%llu to %s  %s  sha256 %s%s%s\n", model_.c_str(),
                static_cast<unsigned long long>(r->version), file_.c_str(),
                HumanBytes(r->bytes).c_str(), ShortHash(r->sha256).c_str(),
                r->verified ? " (verified)" : "", resumed.c_str());
    if (encoded_) {
      std::string since;
      if (r->since_version == r->version) {
        since = ", the version held already";
      } else if (r->since_version > 0) {
        since = ", coded against version " + std::to_string(r->since_version) + " held here";
      }
      std::printf("decoded here: received %s%s\n", HumanBytes(r->received_bytes).c_str(),
                  since.c_str());
    }
    return kExitOk;
  }

 private:
  bool encoded_ = false;
  EncodedPullOptions encoded_options_;
  std::string model_, version_, file_, hf_dir_;
  uint64_t hf_max_bytes_ = 5'000'000'000;
  PullOptions part_;
  CLI::Option* rank_ = nullptr;
  CLI::Option* world_size_ = nullptr;
  CLI::Option* reference_dir_ = nullptr;
  CLI::Option* threads_ = nullptr;
};

}  // namespace

std::unique_ptr<Command> AddPushCommand(CLI::App& app) {
  return std::make_unique<PushCommand>(app);
}
std::unique_ptr<Command> AddPullCommand(CLI::App& app) {
  return std::make_unique<PullCommand>(app);
}

}  // namespace ckpt::cli
