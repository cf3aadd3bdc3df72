// Reading a push's target (push_target.h).
#include "write/push_target.h"

#include <algorithm>

namespace ckpt {

Result<PushTarget> ReadPushTarget(const StoreContext& ctx, ModelWriter& writer,
                                  const ModelName& model, uint64_t version) {
  PushTarget target;
  target.model = model.str();
  target.version = version;
  const std::string& name = target.model;
  rocksdb::ReadOptions ro;
  CKPT_ASSIGN_OR_RETURN(target.model_record,
                        ctx.GetRecord<ModelRecord>(ro, ctx.models, name, "model record"));
  const std::optional<ModelRecord>& record = target.model_record;
  if (record && record->has_versions && version <= record->latest_version) {
    return Status::FailedPrecondition(
        "version " + std::to_string(version) + " must be greater than the latest version " +
        std::to_string(record->latest_version) + " of model '" + name + "'");
  }
  if (!record) CKPT_RETURN_IF_ERROR(writer.CheckModelLimit());
  CKPT_ASSIGN_OR_RETURN(target.state,
                        ctx.GetRecord<CodecStateRecord>(ro, ctx.codec_state, name, "codec state"));
  const CodecPolicy& default_policy = ctx.options->default_policy;
  target.policy = default_policy;
  if (record && !record->policy_json.empty()) {
    CKPT_ASSIGN_OR_RETURN(target.policy,
                          CodecPolicy::FromJson(record->policy_json, default_policy));
  }
  CKPT_ASSIGN_OR_RETURN(const RetentionPolicy retention,
                        record ? writer.RetentionOf(*record)
                               : Result<RetentionPolicy>(ctx.options->default_retention));
  target.retention_deletes = !retention.KeepsEverything();
  target.retention = retention;
  target.seq = std::max(target.state ? target.state->next_seq : 1, ctx.backend->SeqFloor(name));
  return target;
}

}  // namespace ckpt
