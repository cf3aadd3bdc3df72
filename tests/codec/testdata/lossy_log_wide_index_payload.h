// A log-quantizer keyframe (pointwise eps 1e-7, 128 F64 elements: every tenth 1e-300, the rest
// 1 + 1e-3 sin(i)) written by the encoder before 2026-11-30, whose mode centre was pulled so far
// by the tiny elements that the symbols of the others exceeded what that release's decoder
// accepted ("symbol out of table": the version could not be restored). Later decoders accept
// every symbol an encoder has written and must decode it to the bytes the encoder reconstructed
// (their hash, as Fnv1a in lossy_codec_test.cc computes it).
#pragma once

#include <cstdint>

namespace ckpt::golden {

inline constexpr uint64_t kLogWideIndexKeyframeFnv = 4931031835399007895ull;
inline constexpr const char* kLogWideIndexKeyframeHex =
    "010501020048afbc9af2d77a3e80000000000000000d000000b0010000b7cc5fea0f5d933e02527417eb59f3f8c21f6e"
    "a50159f3f8c21f6ea50159f3f8c21f6ea50159f3f8c21f6ea50159f3f8c21f6ea50159f3f8c21f6ea50159f3f8c21f6e"
    "a50159f3f8c21f6ea50159f3f8c21f6ea50159f3f8c21f6ea50159f3f8c21f6ea50159f3f8c21f6ea50159f3f8c21f6e"
    "a5017170a2536e9de8149c233a55ce874ec5e3a1533986e89420263ae5ef894ee94ea2532478e8944c203a253e894e15"
    "7ca2536098e89483213a558e874e09f4a1539b8ee81401273a25b8884e95eca153fc79e81446223a15a9894e6979a253"
    "f890e8d4ad1f3a953c884ec959a253339fe8d480253a1535884e35e1a1531b7fe8145e243af5e7894e5522a253c579e8"
    "54db1e3a75c0884e2d71a253499de81486233ab5ca874e2de4a153c498e854bc273a9536894e0d03a2532578e8945f20"
    "3a2543894e417ca2531d98e854331e3ad5d3874ecd3ba253a49de894f4263a95b2884eddeba153227ae8145c223af5e3"
    "894e8d42a253757ee8941b1e3ab541884ef15aa253319fe8d46d253a1530884e81fda153cc91e854a5273af59f894ef9"
    "20a253a379e8d4e71e3af5c5884ee171a253c08de8d41c1f3a6592874e911ba2530599e894b8273a8531894ee901a253"
    "2778e89420253aa5f1894e615fa2536685e8d42d1e3a95d7874e293da253c69de814e8263a95ac874e29e9a153c889e8"
    "54c0263a35e2894e3541a253347ee8941f1e3ad546884eb97ca2536b95e894ac203a9583874e95fea1532092e8d4aa27"
    "3a01010239e01c5aa0030b0000006e1eaa0cf8790845cb67e0";

}  // namespace ckpt::golden
