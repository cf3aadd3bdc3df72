// Dropping tensors from a stored version: what retention's tensor rules do to the optimizer
// state of older versions. The version then restores without those tensors, as a valid
// safetensors body of its own: the header lists the tensors that remain, packed in body order,
// with the pushed metadata; every remaining tensor restores to exactly the bytes it did before.
// The dropped tensors' chunks stay until garbage collection finds no chain running through
// them (garbage_collector.h).
//
// Thread-compatible: called by the holder of the model's lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "context/store_context.h"
#include "records/records.h"

namespace ckpt {

// The record of version `version` of `model` (stored as `record`, its manifest `manifest`) with
// the tensors `drop` (manifest indices) dropped as well: header, body size, the restored body's
// SHA-256 (computed by restoring the version, which checks the old one), and the lossy flag.
// Writes nothing.
Result<VersionRecord> WithTensorsDropped(const StoreContext& ctx, const std::string& model,
                                         uint64_t version, const VersionRecord& record,
                                         const ManifestRecord& manifest,
                                         const std::vector<uint32_t>& drop);

}  // namespace ckpt
