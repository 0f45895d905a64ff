/* The example engine's q8_0 cache rows, as llama.cpp's q8_0 (ggml's block_q8_0): blocks of
 * kQ8Block values, each held as one scale and kQ8Block 8-bit integers. */
#ifndef KVDIFF_EXAMPLE_Q8_0_H_
#define KVDIFF_EXAMPLE_Q8_0_H_

#include <stdint.h>

enum { kQ8Block = 32 }; /* values per block, as llama.cpp's QK8_0 */

/* Replaces the n values of `row` (n a multiple of kQ8Block) by what a q8_0 cache gives back:
 * per block, d = max|x| / 127, q = round(x / d) in [-127, 127], read back as q * d.
 * scale_of_first_block (TEST-ONLY, the example's fault=q8-scale): every block is read back with
 * the scale of the row's first block, as a dequantizer that indexes its scales by row instead of
 * by block. */
void q8_0_round_trip(float* row, int64_t n, int scale_of_first_block);

#endif /* KVDIFF_EXAMPLE_Q8_0_H_ */
