// ckpt ls: the models, or the versions of one.
#include <cstdio>

#include "command.h"
#include "output.h"

namespace ckpt::cli {
namespace {

using nlohmann::json;

// How a lossy version is coded, in a few characters, from the model's policy now: "lossy ±5e-3"
// (absolute bound), "lossy rel 1e-3" (relative to the range), "lossy pw 0.3" (pointwise), with
// a "+" when overrides give some tensors other rules.
std::string LossyCoding(const json& policy) {
  std::string text = "lossy";
  char value[32];
  if (policy.contains("max_abs_error")) {
    std::snprintf(value, sizeof value, " ±%g", policy["max_abs_error"].get<double>());
  } else if (policy.contains("max_rel_error")) {
    std::snprintf(value, sizeof value, " rel %g", policy["max_rel_error"].get<double>());
  } else if (policy.contains("max_pointwise_rel_error")) {
    std::snprintf(value, sizeof value, " pw %g", policy["max_pointwise_rel_error"].get<double>());
  } else {
    value[0] = '\0';
  }
  text += value;
  if (policy.contains("overrides") && !policy["overrides"].empty()) text += "+";
  return text;
}

class ListCommand final : public Command {
 public:
  explicit ListCommand(CLI::App& app) {
    auto* c = Define(app, "ls", "list the models, or the versions of MODEL");
    c->add_option("MODEL", model_, "model whose versions to list");
  }

  int Run(Session& session) override {
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    return model_.empty() ? ListModels(session, **client) : ListVersions(session, **client);
  }

 private:
  int ListModels(Session& session, Client& client) {
    auto models = client.ListModels();
    if (!models.ok()) return Fail(models.status());
    if (session.json()) {
      json out = json::array();
      for (const auto& m : *models) {
        out.push_back({{"name", m.name},
                       {"latest_version", m.latest_version ? json(*m.latest_version) : json()},
                       {"version_count", m.version_count},
                       {"raw_bytes", m.raw_bytes},
                       {"stored_bytes", m.stored_bytes}});
      }
      PrintJson(out);
      return kExitOk;
    }
    Table table({{"MODEL"},
                 {"LATEST", true},
                 {"VERSIONS", true},
                 {"RAW", true},
                 {"STORED", true},
                 {"RATIO", true}});
    for (const auto& m : *models) {
      table.AddRow({m.name, m.latest_version ? std::to_string(*m.latest_version) : "-",
                    std::to_string(m.version_count), HumanBytes(m.raw_bytes),
                    HumanBytes(m.stored_bytes), Ratio(m.raw_bytes, m.stored_bytes)});
    }
    table.Print();
    if (table.empty()) std::printf("(no models yet: ckpt push MODEL VERSION FILE)\n");
    return kExitOk;
  }

  int ListVersions(Session& session, Client& client) {
    auto versions = client.ListVersions(model_);
    if (!versions.ok()) return Fail(versions.status());
    if (session.json()) {
      json out = json::array();
      for (const auto& v : *versions) {
        out.push_back({{"version", v.version},
                       {"kind", v.kind},
                       {"lossy", v.lossy},
                       {"raw_bytes", v.raw_bytes},
                       {"stored_bytes", v.stored_bytes},
                       {"created_at", v.created_at},
                       {"sha256", v.sha256},
                       {"dropped_tensors", v.dropped_tensors},
                       {"tags", v.tags},
                       {"metrics", v.metrics}});
      }
      PrintJson(out);
      return kExitOk;
    }
    std::string lossy = "lossy";
    bool any_lossy = false;
    for (const auto& v : *versions) any_lossy |= v.lossy;
    if (any_lossy) {
      if (auto policy = client.GetPolicy(model_); policy.ok()) {
        lossy = LossyCoding(json::parse(*policy, nullptr, false));
      }
    }
    Table table({{"VERSION", true},
                 {"KIND"},
                 {"CODING"},
                 {"RAW", true},
                 {"STORED", true},
                 {"CREATED (UTC)"},
                 {"SHA256"},
                 {"TAGS, METRICS"}});
    bool any_dropped = false;
    for (const auto& v : *versions) {
      std::string extra;
      for (const auto& name : v.tags) extra += (extra.empty() ? "" : " ") + name;
      for (const auto& [name, value] : v.metrics) {
        char item[160];
        std::snprintf(item, sizeof item, "%s%s=%g", extra.empty() ? "" : " ", name.c_str(), value);
        extra += item;
      }
      std::string kind = v.kind;
      if (v.dropped_tensors > 0) {
        kind += "*";
        any_dropped = true;
      }
      table.AddRow({std::to_string(v.version), kind, v.lossy ? lossy : "exact",
                    HumanBytes(v.raw_bytes), HumanBytes(v.stored_bytes), ShortTime(v.created_at),
                    ShortHash(v.sha256), extra});
    }
    table.Print();
    if (any_lossy) {
      std::printf("lossy: every element within the bound of the model's policy (ckpt policy %s)\n",
                  model_.c_str());
    }
    if (any_dropped) {
      std::printf("*: retention's tensor rules dropped some tensors (ckpt ls %s --json)\n",
                  model_.c_str());
    }
    return kExitOk;
  }

  std::string model_;
};

}  // namespace

std::unique_ptr<Command> AddListCommand(CLI::App& app) {
  return std::make_unique<ListCommand>(app);
}

}  // namespace ckpt::cli
