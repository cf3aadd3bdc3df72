// The upload spool in the cluster's pool (backends/upload_spool.h): every daemon of the cluster
// stores shards of any upload there and reads every upload's state, so a rank sends its shard
// to any daemon and only the commit goes through the model's writer. Internal to storage/; layout
// in docs/format.md ("RADOS pool").
//
//   uploads                           the index: omap key "<model>\0<version>" per upload
//   upload/<model>/<version>          the upload's object; its omap: "record" (JSON, format 1),
//                                     "committing" (u64 BE 0, or the token of the commit in
//                                     progress), "shard.<i>" (JSON: attempt, body_bytes,
//                                     sha256, stored_at_ms) per stored shard, "attempt.<id>"
//                                     (u64 BE: its pieces begun, or empty) per attempt begun
//   upload/<model>/<version>/<id>/<n> piece n of attempt <id>'s body (fixed-size
//                                     pieces, below the OSDs' largest object)
//
// An attempt is registered before its first byte is written and its pieces are removed with the
// upload, so an attempt that a killed daemon left behind is no orphan. A shard is published by one
// guarded operation on the upload's object: refused while "committing" is set, so the shards a
// commit reads stay the upload's until it ends.
#pragma once

#include <memory>
#include <rados/librados.hpp>

#include "backends/upload_spool.h"

namespace ckpt {

// A spool in `io`'s pool and namespace (the IoCtx is duplicated; the connection behind it must
// outlive the spool).
std::unique_ptr<UploadSpool> NewRadosUploadSpool(librados::IoCtx& io);

}  // namespace ckpt
