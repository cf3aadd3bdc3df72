// Transcendental functions that are part of the lossy payload format: the log quantizer's powers
// of two and the cosine quantizer's levels are computed by the decoder, so they must be the same
// bits on every build and machine, which libm does not promise. Pure functions.
#pragma once

namespace ckpt::lossy {

// 2^y with a fixed sequence of IEEE double operations (floor, a degree-18 Taylor polynomial of
// e^(f ln 2) for the fraction f by Horner's rule, ldexp), so every build computes the same bits.
// 0 below 2^-1100, +Inf above 2^1100.
double DeterministicExp2(double y);

// cos(x) for x in [0, pi] with a fixed sequence of IEEE double operations (no libm, no FMA: the
// codec is compiled with -ffp-contract=off), so every build computes the same bits.
double DeterministicCos(double x);

}  // namespace ckpt::lossy
