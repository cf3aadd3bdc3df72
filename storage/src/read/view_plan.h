// What a restore of part of a version sends (RestoreSelection): which stored tensors, which box
// of each, and the header of the body made for them. Shared by the restore that decodes the
// part (restore_view.h) and the encoded pull that sends its chunk records (encoded_restore.h).
// Internal to storage/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/base/safetensors.h"
#include "ckpt/base/tensor_slices.h"
#include "ckpt/storage/checkpoint_store.h"
#include "records/records.h"

namespace ckpt {

// One tensor of the part: a box of a stored tensor.
struct ViewTensor {
  uint32_t tensor = 0;  // in the manifest
  TensorBox box;
  bool whole = false;  // the box is the whole stored tensor
};

struct ViewPlan {
  std::vector<ViewTensor> tensors;  // body order
  std::string raw_header;           // of the part's body: length prefix and JSON
  uint64_t body_bytes = 0;          // the part's body, header included
};

// The part `selection` (not whole, no byte range) names of version `version`, stored as
// `record` with manifest `manifest`. InvalidArgument for rank >= ranks, a selection that names
// no tensor or a box outside its tensor; NotFound for a box of a tensor the version does not
// hold, or tensors retention dropped.
Result<ViewPlan> PlanView(const ManifestRecord& manifest, const VersionRecord& record,
                          uint64_t version, const RestoreSelection& selection);

// The stored header of a version (its body's header as pushed or assembled).
Result<SafetensorsHeader> StoredHeaderOf(const VersionRecord& record);

}  // namespace ckpt
