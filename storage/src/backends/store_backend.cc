// What every backend shares (store_backend.h).
#include "backends/store_backend.h"

namespace ckpt {

ChunkSet ChunkSet::Of(uint64_t seq, const ManifestRecord& manifest) {
  ChunkSet set;
  set.seq = seq;
  for (const ManifestTensor& t : manifest.tensors) set.chunk_counts.push_back(t.chunk_count);
  return set;
}

}  // namespace ckpt
