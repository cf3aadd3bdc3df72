// Byte-plane transposition: the vectorized paths against the byte-by-byte definition, for every
// element size, lengths around the 16-element steps, with and without a reference.
#include "byte_planes.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace ckpt {
namespace {

// The definition: byte p of element i <-> out[p * n + i], XORed with ref's byte.
std::vector<uint8_t> SplitByDefinition(const std::vector<uint8_t>& in, const uint8_t* ref,
                                       uint32_t planes) {
  std::vector<uint8_t> out(in.size());
  const bool transposed = planes == 2 || planes == 4 || planes == 8;
  const size_t n = in.size() / planes;
  for (size_t i = 0; i < in.size(); ++i) {
    const size_t to = transposed ? (i % planes) * n + i / planes : i;
    out[to] = in[i] ^ (ref ? ref[i] : 0);
  }
  return out;
}

TEST(BytePlanesTest, SplitAndMergeFollowTheDefinitionAndInvertEachOther) {
  std::mt19937 rng(7);
  for (uint32_t planes : {1u, 2u, 3u, 4u, 8u}) {
    for (size_t elements : {0, 1, 15, 16, 17, 31, 32, 33, 100, 1000, 4099}) {
      std::vector<uint8_t> in(elements * planes), ref(in.size());
      for (auto& b : in) b = static_cast<uint8_t>(rng());
      for (auto& b : ref) b = static_cast<uint8_t>(rng());
      for (const uint8_t* r :
           {static_cast<const uint8_t*>(nullptr), static_cast<const uint8_t*>(ref.data())}) {
        SCOPED_TRACE("planes " + std::to_string(planes) + ", elements " + std::to_string(elements) +
                     (r ? ", with a reference" : ""));
        std::vector<uint8_t> split(in.size());
        SplitPlanes(in, r, planes, split.data());
        ASSERT_EQ(split, SplitByDefinition(in, r, planes));
        std::vector<uint8_t> merged(in.size());
        MergePlanes(split, r, planes, merged.data());
        ASSERT_EQ(merged, in);
      }
    }
  }
}

}  // namespace
}  // namespace ckpt
