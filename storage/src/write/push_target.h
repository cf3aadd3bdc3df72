// PushTarget: where a push goes and what it deltas against, read under the model's lock when the
// push begins. Internal to storage/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/storage/codec_policy.h"
#include "ckpt/storage/retention.h"
#include "records/records.h"

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

}  // namespace ckpt
