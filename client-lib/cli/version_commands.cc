// ckpt rm and ckpt tag: commands on one version (or, rm, a whole model).
#include <cstdio>

#include "command.h"
#include "output.h"

namespace ckpt::cli {
namespace {

class RemoveCommand final : public Command {
 public:
  explicit RemoveCommand(CLI::App& app) {
    auto* c = Define(
        app, "rm",
        "delete VERSION of MODEL (other versions restore exactly as before; a tagged version "
        "is refused until untagged), or with no VERSION the whole model and every version, "
        "which needs --yes");
    c->add_option("MODEL", model_, "model name")->required();
    c->add_option("VERSION", version_, "version number, 'latest' or 'tag:NAME'");
    c->add_flag("--yes", yes_, "confirm deleting the whole model");
  }

  int Run(Session& session) override {
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    if (version_.empty()) {
      if (!yes_) {
        return Fail(Status::InvalidArgument(
            "'ckpt rm " + model_ +
            "' deletes the whole model and every version: add --yes to do it, or give a VERSION"));
      }
      if (auto s = (*client)->DeleteModel(model_); !s.ok()) return Fail(s);
      if (session.json()) {
        PrintJson({{"deleted_model", model_}});
      } else {
        std::printf("deleted model %s\n", model_.c_str());
      }
      return kExitOk;
    }
    auto number = (*client)->ResolveVersion(model_, version_);
    if (!number.ok()) return Fail(number.status());
    if (auto s = (*client)->DeleteVersion(model_, *number); !s.ok()) return Fail(s);
    if (session.json()) {
      PrintJson({{"model", model_}, {"deleted_version", *number}});
    } else {
      std::printf("deleted %s@%llu\n", model_.c_str(), static_cast<unsigned long long>(*number));
    }
    return kExitOk;
  }

 private:
  std::string model_, version_;
  bool yes_ = false;
};

class TagCommand final : public Command {
 public:
  explicit TagCommand(CLI::App& app) {
    auto* c =
        Define(app, "tag",
               "tag VERSION of MODEL as TAG (a tagged version is pinned: retention keeps it; a tag "
               "held by another version moves), or --remove the tag");
    c->add_option("MODEL", model_, "model name")->required();
    c->add_option("VERSION", version_, "version number, 'latest' or 'tag:NAME'")->required();
    c->add_option("TAG", tag_, "tag name")->required();
    c->add_flag("--remove", remove_, "remove TAG from VERSION instead");
  }

  int Run(Session& session) override {
    auto client = session.client();
    if (!client.ok()) return Fail(client.status());
    auto number = (*client)->ResolveVersion(model_, version_);
    if (!number.ok()) return Fail(number.status());
    auto s = remove_ ? (*client)->RemoveTag(model_, *number, tag_)
                     : (*client)->SetTag(model_, *number, tag_);
    if (!s.ok()) return Fail(s);
    if (session.json()) {
      PrintJson({{"model", model_}, {"version", *number}, {"tag", tag_}, {"removed", remove_}});
    } else {
      std::printf("%s %s@%llu %s\n", remove_ ? "untagged" : "tagged", model_.c_str(),
                  static_cast<unsigned long long>(*number), tag_.c_str());
    }
    return kExitOk;
  }

 private:
  std::string model_, version_, tag_;
  bool remove_ = false;
};

}  // namespace

std::unique_ptr<Command> AddRemoveCommand(CLI::App& app) {
  return std::make_unique<RemoveCommand>(app);
}
std::unique_ptr<Command> AddTagCommand(CLI::App& app) { return std::make_unique<TagCommand>(app); }

}  // namespace ckpt::cli
