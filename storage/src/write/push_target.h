// PushTarget: where a push goes and what it deltas against, read under the model's lock when the
// push begins (and without it for a client's plan). Internal to storage/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/base/model_name.h"
#include "ckpt/storage/codec_policy.h"
#include "ckpt/storage/retention.h"
#include "context/store_context.h"
#include "records/records.h"
#include "write/model_writer.h"

namespace ckpt {

struct PushTarget {
  std::string model;
  uint64_t version = 0;
  uint64_t seq = 0;  // the manifest the push writes
  CodecPolicy policy;
  bool retention_deletes = false;           // the model's retention policy has rules
  RetentionPolicy retention;                // the model's, for its tensor rules' chain limits
  std::optional<ModelRecord> model_record;  // none: the push creates the model
  std::optional<CodecStateRecord> state;    // none: no reference, every tensor a keyframe
};

// Where a push of `version` of `model` goes, read now: FailedPrecondition when the version is
// not above the latest, or the model would exceed storage.max_models.
Result<PushTarget> ReadPushTarget(const StoreContext& ctx, ModelWriter& writer,
                                  const ModelName& model, uint64_t version);

}  // namespace ckpt
