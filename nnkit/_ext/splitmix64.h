/* SplitMix64 (Steele, Lea and Flood 2014) for nnkit's C kernels (hopfield.pyx).

   The same generator as nnkit._ext.simd_math.splitmix64 (Numba, CPU and CUDA) and
   nnkit._random.splitmix64 (NumPy): output k + 1 of the generator seeded with s is
   mix(s + (k + 1) * gamma), so a seed gives the same stream in every implementation. */
#ifndef NNKIT_SPLITMIX64_H
#define NNKIT_SPLITMIX64_H

#include <stdint.h>

#define NNKIT_SPLITMIX64_GAMMA 0x9E3779B97F4A7C15ULL

/* The next output of the generator whose state is *state; advances the state. */
static inline uint64_t nnkit_splitmix64_next(uint64_t *state) {
    uint64_t z = (*state += NNKIT_SPLITMIX64_GAMMA);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

#endif
