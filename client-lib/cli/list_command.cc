// ckpt ls: the models, or the versions of one.
#include <algorithm>
#include <cstdio>
#include <map>

#include "command.h"
#include "output.h"

namespace ckpt::cli {
namespace {

using nlohmann::json;

// The bounds a lossy version's tensors were stored with, from its detail: the largest absolute
// bound and the largest pointwise-relative one (0 where no tensor has one).
struct Bounds {
  double absolute = 0;
  double pointwise = 0;
};

Bounds BoundsOf(const json& detail) {
  Bounds b;
  for (const auto& t : detail.value("tensors", json::array())) {
    if (t.value("codec", "") != "lossy") continue;
    b.absolute = std::max(b.absolute, t.value("max_abs_error", 0.0));
    b.pointwise = std::max(b.pointwise, t.value("max_pointwise_rel_error", 0.0));
  }
  return b;
}

// "±0.005", "±50%" (pointwise), both, or "lossy" when the detail names no bound.
std::string BoundsText(const Bounds& b) {
  char text[64] = "";
  if (b.absolute > 0 && b.pointwise > 0) {
    std::snprintf(text, sizeof text, "±%g ±%g%%", b.absolute, b.pointwise * 100);
  } else if (b.absolute > 0) {
    std::snprintf(text, sizeof text, "±%g", b.absolute);
  } else if (b.pointwise > 0) {
    std::snprintf(text, sizeof text, "±%g%%", b.pointwise * 100);
  } else {
    return "lossy";
  }
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
    // Each lossy version's own bounds (the policy may have changed since it was pushed).
    std::map<uint64_t, Bounds> bounds;
    for (const auto& v : *versions) {
      if (!v.lossy) continue;
      auto detail = ParseJsonAnswer(client.VersionDetail(model_, v.version));
      if (!detail.ok()) return Fail(detail.status());
      bounds[v.version] = BoundsOf(*detail);
    }
    if (session.json()) {
      json out = json::array();
      for (const auto& v : *versions) {
        json item = {{"version", v.version},
                     {"kind", v.kind},
                     {"lossy", v.lossy},
                     {"raw_bytes", v.raw_bytes},
                     {"stored_bytes", v.stored_bytes},
                     {"created_at", v.created_at},
                     {"sha256", v.sha256},
                     {"pushed_sha256", v.pushed_sha256},
                     {"tensor_count", v.tensor_count},
                     {"dropped_tensors", v.dropped_tensors},
                     {"tags", v.tags},
                     {"metrics", v.metrics},
                     {"labels", v.labels}};
        if (auto b = bounds.find(v.version); b != bounds.end()) {
          if (b->second.absolute > 0) item["max_abs_error"] = b->second.absolute;
          if (b->second.pointwise > 0) item["max_pointwise_rel_error"] = b->second.pointwise;
        }
        out.push_back(std::move(item));
      }
      PrintJson(out);
      return kExitOk;
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
      table.AddRow({std::to_string(v.version), kind,
                    v.lossy ? BoundsText(bounds[v.version]) : "exact", HumanBytes(v.raw_bytes),
                    HumanBytes(v.stored_bytes), ShortTime(v.created_at), ShortHash(v.sha256),
                    extra});
    }
    table.Print();
    if (!bounds.empty()) {
      std::printf(
          "±x: lossy, every element within x of what was pushed; ±p%%: within p%% of its value\n");
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
