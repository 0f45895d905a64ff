/* q8_0 cache rows (q8_0.h). The row keeps the values read back, which is all attention over a
 * q8_0 cache sees: storing the integers would save memory, not change a logit. d stays in
 * float32, where llama.cpp rounds it to float16 (a relative 2^-11 more on every value, which the
 * q8_0 tolerance profile, measured on llama.cpp, covers). */
#include "q8_0.h"

#include <math.h>

void q8_0_round_trip(float* row, int64_t n, int scale_of_first_block) {
  float first_d = 0.0f;
  for (int64_t b = 0; b < n; b += kQ8Block) {
    float amax = 0.0f;
    for (int64_t i = b; i < b + kQ8Block; i++) amax = fmaxf(amax, fabsf(row[i]));
    const float d = amax / 127.0f, inv_d = d > 0.0f ? 1.0f / d : 0.0f;
    if (b == 0) first_d = d;
    const float read_d = scale_of_first_block ? first_d : d; /* THE BUG when set (test-only) */
    for (int64_t i = b; i < b + kQ8Block; i++) row[i] = roundf(row[i] * inv_d) * read_d;
  }
}
