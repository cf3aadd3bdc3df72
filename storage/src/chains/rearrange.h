// Rearranging a model's newest versions so that the latest is one decode away: a push stores
// the new version as deltas against the one before (the closed loop needs the reference's
// reconstruction, and a delta is what keeps the store small); this pass then re-encodes the
// latest version exactly as keyframes and the version before as deltas against them, so the
// chains run backwards from the newest version (as git packs keep the newest object whole and
// rdiff-backup a mirror plus reverse increments). A restore of the latest, and the next push's
// reference after a restart, then decodes one payload per chunk. See
// CheckpointStore::RearrangeLatest for which tensors qualify.
//
// The rewritten versions get new manifests under fresh seqs, switched in one synced batch as
// garbage collection's rebases are, with the removal of the manifests they replace: a crash
// before it leaves chunks above the committed next_seq (removed at open), after it nothing.
//
// Not thread-safe: the caller holds the model's lock for the whole pass.
#pragma once

#include <cstdint>
#include <functional>

#include "chains/model_chains.h"
#include "ckpt/base/status.h"
#include "ckpt/storage/checkpoint_store.h"
#include "context/store_context.h"

namespace ckpt {

// The seqs [begin, end) that held every manifest a pass replaced (begin == end: none), and the
// stored bytes removed with them. Seqs in between may belong to manifests that stay.
struct ReplacedSeqs {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t bytes_removed = 0;
  // A pass that wrote and then gave up (stepped aside, failed): the seqs [begin, end) of the
  // records it discarded, whose space the same reclaim gives back.
  uint64_t discarded_begin = 0;
  uint64_t discarded_end = 0;
};

// Rearranges `chains.model`'s latest version; `chains` is updated to what is stored afterwards.
// The replaced manifests are removed in the switch's batch; StoreBackend::ReclaimRemovedChunks
// over `*replaced` then gives their space back.
// No version's chunks need more than `max_decodes` payload decodes afterwards. `yield` is asked
// between chunks: true abandons the pass (its chunks discarded, their seqs in `*replaced`) with
// Aborted.
Result<RearrangeReport> RearrangeLatest(const StoreContext& ctx, ModelChains& chains,
                                        uint32_t max_decodes, const std::function<bool()>& yield,
                                        ReplacedSeqs* replaced);

}  // namespace ckpt
