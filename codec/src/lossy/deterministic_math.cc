// Deterministic exp2 and cos (deterministic_math.h).
#include "lossy/deterministic_math.h"

#include <cmath>
#include <limits>

namespace ckpt::lossy {

double DeterministicExp2(double y) {
  if (!(y > -1100)) return 0.0;
  if (!(y < 1100)) return std::numeric_limits<double>::infinity();
  const double i = std::floor(y);
  const double u = (y - i) * 0.69314718055994530942;  // in [0, ln 2)
  // e^u = sum u^k / k!, k <= 18 (truncation error < 2e-19 for u < ln 2), by Horner's rule.
  double sum = 1.0 / 6402373705728000.0;  // 1/18!
  double factorial = 6402373705728000.0;
  for (int k = 17; k >= 0; --k) {
    factorial /= static_cast<double>(k + 1);  // k! exactly (all are exact in double up to 18!)
    sum = sum * u + 1.0 / factorial;
  }
  return std::ldexp(sum, static_cast<int>(i));
}

double DeterministicCos(double x) {
  // Reduce to t in [0, pi/4] with cos or sin by symmetry, then Taylor polynomials (degree 20 and
  // 21, error < 1e-19 there) evaluated by Horner's rule in a fixed order.
  const double pi = 3.14159265358979323846;
  double sign = 1;
  if (x > pi / 2) {
    x = pi - x;
    sign = -1;
  }
  static constexpr double kCos[] = {1.0,
                                    -1.0 / 2,
                                    1.0 / 24,
                                    -1.0 / 720,
                                    1.0 / 40320,
                                    -1.0 / 3628800,
                                    1.0 / 479001600,
                                    -1.0 / 87178291200.0,
                                    1.0 / 20922789888000.0,
                                    -1.0 / 6402373705728000.0,
                                    1.0 / 2432902008176640000.0};
  static constexpr double kSin[] = {1.0,
                                    -1.0 / 6,
                                    1.0 / 120,
                                    -1.0 / 5040,
                                    1.0 / 362880,
                                    -1.0 / 39916800,
                                    1.0 / 6227020800.0,
                                    -1.0 / 1307674368000.0,
                                    1.0 / 355687428096000.0,
                                    -1.0 / 121645100408832000.0,
                                    1.0 / 51090942171709440000.0};
  auto horner = [](const double* c, double t2) {
    double sum = c[10];
    for (int k = 9; k >= 0; --k) sum = sum * t2 + c[k];
    return sum;
  };
  if (x <= pi / 4) return sign * horner(kCos, x * x);
  const double t = pi / 2 - x;
  return sign * (t * horner(kSin, t * t));
}

}  // namespace ckpt::lossy
