/* The x86-64 instruction sets nnkit's C kernels are built for, one source compiled per
 * set with GCC/Clang target attributes and chosen at run time by the CPU's features
 * (gemm_packed.h, scan_rows.h). Elsewhere (other CPUs, other compilers) only the baseline
 * build exists and nnkit_isa_level() is 0. */

#ifndef NNKIT_ISA_TARGETS_H
#define NNKIT_ISA_TARGETS_H

#if defined(__GNUC__) && defined(__x86_64__)
#define NNKIT_X86_64 1
#define NNKIT_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#define NNKIT_TARGET_AVX2 __attribute__((target("avx2,fma")))
#endif

/* 2: AVX-512F, 1: AVX2 + FMA, 0: the baseline */
static inline int nnkit_isa_level(void)
{
#ifdef NNKIT_X86_64
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    return 0;
}

static inline const char *nnkit_isa_name(int level)
{
    return level == 2 ? "avx512" : level == 1 ? "avx2" : "baseline";
}

#endif
