// Byte-plane transposition of fixed-size elements: the layout the lossless codec compresses
// (the exponent bytes of floats together, then each mantissa byte). Internal to codec/.
#pragma once

#include <cstdint>
#include <span>

namespace ckpt {

// Byte p of element i of `in` (n = in.size() / planes elements of `planes` bytes) goes to
// out[p * n + i], XORed with the same byte of `ref` (element layout) when `ref` is not null.
// planes other than 2, 4 and 8 copy (XORed). `out` holds in.size() bytes and aliases neither.
void SplitPlanes(std::span<const uint8_t> in, const uint8_t* ref, uint32_t planes, uint8_t* out);
// The inverse: `in` in plane layout, `ref` and `out` in element layout.
void MergePlanes(std::span<const uint8_t> in, const uint8_t* ref, uint32_t planes, uint8_t* out);

}  // namespace ckpt
