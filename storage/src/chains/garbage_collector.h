// Garbage collection of one model: removes the data of deleted versions, re-encoding (rebasing)
// kept versions whose delta chains run through it, so that deleting versions frees their space.
//
// A rebase never changes what a version restores to: the kept version's chunks are decoded
// through their old chain and re-encoded bit-exactly, as a lossless delta against the nearest
// older kept version on the same chain, or as a keyframe when there is none. The rebased version
// gets a new manifest under a fresh seq; every manifest that took its deltas against the old one
// is pointed at the new one (same reconstruction, so their payloads stay valid), and one synced
// batch makes the switch and removes what it made unneeded (the old manifest, dead ones no chain
// runs through any more). A crash before that batch leaves chunks above the committed next_seq,
// which recovery removes; after it, nothing.
//
// Tensors coded lossily are not rebased: re-encoding their reconstruction exactly costs more than
// the deltas it would free, so deleted versions their chains run through stay (reported as
// retained) until the chain ends (keyframe_every / keyframe_budget) and nothing needs them.
//
// Not thread-safe: the caller holds the model's lock for the whole collection.
#pragma once

#include "chains/model_chains.h"
#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"
#include "context/store_context.h"

namespace ckpt {

// Collects `chains.model`'s garbage; `chains` is updated to what is stored afterwards.
Result<GcReport> CollectModelGarbage(const StoreContext& ctx, ModelChains& chains,
                                     const GcOptions& options);

}  // namespace ckpt
