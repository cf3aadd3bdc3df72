// ckpt policy and ckpt retention: a model's codec and retention policies.
#include <algorithm>
#include <cstdio>
#include <set>

#include "command.h"
#include "output.h"

namespace ckpt::cli {
namespace {

using nlohmann::json;

// A policy document as FIELD / VALUE rows; each entry of a list of objects (overrides,
// tensor_rules) on a row of its own.
void PrintPolicy(const json& policy) {
  Table table({{"FIELD"}, {"VALUE"}});
  for (const auto& [field, value] : policy.items()) {
    if (field == "warnings") continue;
    if (value.is_array() && !value.empty() && value[0].is_object()) {
      for (size_t i = 0; i < value.size(); ++i) {
        table.AddRow({field + "[" + std::to_string(i) + "]", CellText(value[i])});
      }
    } else {
      table.AddRow({field, CellText(value)});
    }
  }
  table.Print();
}

// Prints the server's warnings about a stored policy on stderr.
void PrintWarnings(const json& answer) {
  if (!answer.contains("warnings")) return;
  for (const auto& w : answer["warnings"])
    std::fprintf(stderr, "ckpt: warning: %s\n", CellText(w).c_str());
}

class PolicyCommand final : public Command {
 public:
  explicit PolicyCommand(CLI::App& app) {
    auto* c = Define(
        app, "policy",
        "show MODEL's codec policy, or change it: the fields given are merged into the stored "
        "policy (fields not given keep their values); applies from the next push");
    c->add_option("MODEL", model_, "model name")->required();
    c->add_option("JSON", json_text_,
                  "fields to change, e.g. '{\"mode\":\"lossy\",\"max_abs_error\":1e-3}' or "
                  "'{\"keyframe_every\":8}' (docs/api.md lists every field)");
  }

  int Run(Session& session) override {
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    auto answer = ParseJsonAnswer(json_text_.empty() ? (*client)->GetPolicy(model_)
                                                     : (*client)->SetPolicy(model_, json_text_));
    if (!answer.ok()) return Fail(answer.status());
    PrintWarnings(*answer);
    if (session.json()) {
      PrintJson(*answer);
    } else {
      PrintPolicy(*answer);
    }
    return kExitOk;
  }

 private:
  std::string model_, json_text_;
};

// The versions a retention report deletes, and the tensors it drops, as "version:tensor".
std::set<std::string> Removals(const json& report) {
  std::set<std::string> out;
  for (const auto& v : report.value("deleted", json::array())) out.insert(v.dump());
  for (const auto& d : report.value("tensors_dropped", json::array())) {
    for (const auto& t : d.value("tensors", json::array())) {
      out.insert(d.value("version", json()).dump() + ":" + CellText(t));
    }
  }
  return out;
}

// A retention report (preview or apply) as a table of the versions and what happens to each.
void PrintRetentionReport(const json& report) {
  const bool dry_run = report.value("dry_run", true);
  std::map<uint64_t, std::vector<std::string>> rows;
  for (const auto& v : report.value("deleted", json::array())) {
    rows[v.get<uint64_t>()] = {dry_run ? "would delete" : "deleted", ""};
  }
  for (const auto& k : report.value("kept", json::array())) {
    std::string why;
    for (const auto& reason : k.value("kept_by", json::array())) {
      why += (why.empty() ? "" : ", ") + CellText(reason);
    }
    rows[k.value("version", uint64_t{0})] = {"keep", why};
  }
  for (const auto& d : report.value("tensors_dropped", json::array())) {
    auto& row = rows[d.value("version", uint64_t{0})];
    const size_t n = d.value("tensors", json::array()).size();
    if (row.size() < 2) row = {"keep", ""};
    row[0] += ", " + std::string(dry_run ? "would drop " : "dropped ") + std::to_string(n) +
              " tensor" + (n == 1 ? "" : "s");
  }
  Table table({{"VERSION", true}, {"ACTION"}, {"KEPT BY"}});
  for (const auto& [version, row] : rows) table.AddRow({std::to_string(version), row[0], row[1]});
  table.Print();
  for (const auto& p : report.value("problems", json::array())) {
    std::printf("problem: %s\n", CellText(p).c_str());
  }
  if (report.contains("gc")) {
    const json& gc = report["gc"];
    std::printf("freed %s; %llu kept version(s) re-encoded\n",
                HumanBytes(gc.value("bytes_freed", uint64_t{0})).c_str(),
                static_cast<unsigned long long>(gc.value("versions_rebased", uint64_t{0})));
  }
}

class RetentionCommand final : public Command {
 public:
  explicit RetentionCommand(CLI::App& app) {
    auto* c = Define(
        app, "retention",
        "show MODEL's retention policy; or replace it with JSON (rules not given are removed; "
        "retention runs after every push and periodically, so if the new policy would delete "
        "versions or tensors the stored one keeps, it is refused without --yes); or --preview "
        "what a policy would delete; or --apply the stored policy now");
    c->add_option("MODEL", model_, "model name")->required();
    c->add_option("JSON", json_text_,
                  "a whole policy, e.g. '{\"keep_last\":5,\"keep_every\":1000}'; with --preview, "
                  "evaluated instead of the stored one (not stored)");
    auto* preview =
        c->add_flag("--preview", preview_,
                    "list what the stored policy (or JSON) would delete; deletes nothing");
    auto* apply = c->add_flag("--apply", apply_,
                              "apply the stored policy now: delete what it does not keep and "
                              "reclaim the space");
    preview->excludes(apply);
    c->add_flag("--yes", yes_,
                "store a policy that deletes versions or tensors the stored policy keeps");
  }

  int Run(Session& session) override {
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    Client& c = **client;
    if (apply_ && !json_text_.empty()) {
      return Usage(
          "--apply applies the stored policy; to apply another, store it first (ckpt "
          "retention " +
          model_ + " JSON), or see what it would delete with --preview JSON");
    }
    if (preview_ || apply_) {
      auto report = ParseJsonAnswer(c.ApplyRetention(model_, preview_, json_text_));
      if (!report.ok()) return Fail(report.status());
      if (session.json()) {
        PrintJson(*report);
      } else {
        PrintRetentionReport(*report);
      }
      return kExitOk;
    }
    if (json_text_.empty()) {
      auto policy = ParseJsonAnswer(c.GetRetention(model_));
      if (!policy.ok()) return Fail(policy.status());
      if (session.json()) {
        PrintJson(*policy);
      } else if (policy->empty()) {
        std::printf("no rules: every version is kept\n");
      } else {
        PrintPolicy(*policy);
      }
      return kExitOk;
    }
    return Replace(session, c);
  }

 private:
  // Stores the new policy, unless its next pass would remove what the stored one keeps and
  // --yes is not given (the model may have no versions yet: then nothing is at stake).
  int Replace(Session& session, Client& c) {
    auto now = ParseJsonAnswer(c.ApplyRetention(model_, true, {}));
    if (!now.ok() && now.status().code() != StatusCode::kNotFound) return Fail(now.status());
    // A model not created yet has nothing to delete; the policy is checked when it is stored.
    Result<json> next = json::object();
    std::vector<std::string> more;
    if (now.ok()) {
      next = ParseJsonAnswer(c.ApplyRetention(model_, true, json_text_));
      if (!next.ok()) return Fail(next.status());
      const std::set<std::string> before = Removals(*now);
      for (const std::string& r : Removals(*next)) {
        if (!before.contains(r)) more.push_back(r);
      }
    }
    if (!more.empty() && !yes_) {
      std::string list;
      for (size_t i = 0; i < more.size() && i < 8; ++i) list += (i ? ", " : "") + more[i];
      if (more.size() > 8) list += ", … (" + std::to_string(more.size()) + " in all)";
      const bool tensors = std::any_of(more.begin(), more.end(), [](const std::string& r) {
        return r.find(':') != std::string::npos;
      });
      return Fail(Status::FailedPrecondition(
          "the new policy's next pass would delete what the stored policy keeps (" + list +
          (tensors ? "; VERSION:TENSOR for dropped tensors" : "") +
          "): add --yes to store it, or --preview it"));
    }
    auto stored = ParseJsonAnswer(c.SetRetention(model_, json_text_));
    if (!stored.ok()) return Fail(stored.status());
    if (session.json()) {
      PrintJson(*stored);
      return kExitOk;
    }
    PrintPolicy(*stored);
    const size_t deletes = next->value("deleted", json::array()).size();
    const std::string hint =
        deletes > 0 ? " (ckpt retention " + model_ + " --preview lists them)" : "";
    std::printf("stored; the next pass deletes %zu version(s)%s\n", deletes, hint.c_str());
    return kExitOk;
  }

  std::string model_, json_text_;
  bool preview_ = false, apply_ = false, yes_ = false;
};

}  // namespace

std::unique_ptr<Command> AddPolicyCommand(CLI::App& app) {
  return std::make_unique<PolicyCommand>(app);
}
std::unique_ptr<Command> AddRetentionCommand(CLI::App& app) {
  return std::make_unique<RetentionCommand>(app);
}

}  // namespace ckpt::cli
