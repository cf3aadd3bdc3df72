// CopyModel: one model moved between stores as it is stored (its records and chunk records,
// nothing decoded or re-encoded), so that a store on a local disk can move into a bucket or a
// pool, and back, without pushing again (ckptd copy-store). Internal to storage/.
#pragma once

#include <string>

#include "ckpt/storage/checkpoint_store.h"
#include "context/store_context.h"

namespace ckpt {

// Copies `model` from the store of `from` into the store of `to`, where it must not exist
// (FailedPrecondition). Every chunk record its manifests list is written first; one commit then
// makes the model visible with every version, tag and policy, so an interrupted copy leaves
// nothing visible (its chunks are orphans garbage collection removes). DataLoss when the source
// lacks a chunk record a manifest lists. REQUIRES: the model's write lock in both stores.
Result<ModelCopyReport> CopyModel(const StoreContext& from, const StoreContext& to,
                                  const std::string& model);

}  // namespace ckpt
