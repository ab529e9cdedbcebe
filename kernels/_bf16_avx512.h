/* AVX-512 BF16 helpers shared by the kernels' vdpbf16ps paths (_paged_prefill_bf16.c,
 * _paged_decode_bf16.c). Include only where the compiler is GCC ≥ 10 on x86-64: every
 * function carries the TGT target attribute (no -march in the build), and a caller runs
 * them only after __builtin_cpu_supports("avx512bf16") said yes. */
#ifndef KERNELS_BF16_AVX512_H
#define KERNELS_BF16_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define TGT __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))

/* 2^x for x <= 0: 2^n × p(f), f in [−0.5, 0.5], p of degree 6; x <= −160 (masked scores,
 * −inf included) gives exactly 0 through scalef's underflow. */
TGT static inline __m512 exp2v(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-160.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.5403530393381606e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076284772e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108664821580e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650695910071e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718055994531e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* The 4 bytes at p (a bf16 pair) in every 32-bit lane. */
TGT static inline __m512i bcast32(const void *p) {
    uint32_t x;
    memcpy(&x, p, sizeof x);
    return _mm512_set1_epi32((int)x);
}

/* Indices for _mm512_permutex2var_epi16(x, idx, y) that pair words of two rows of 32 bf16:
 * lane k of the result is (x[base + k], y[base + k]). base 0 gives dims 0–15, base 16
 * dims 16–31: the layout vdpbf16ps sums over two keys (x the first). */
TGT static inline __m512i pair_words_idx(int base) {
    uint16_t idx[32];
    for (int k = 0; k < 16; k++)
        idx[2 * k] = (uint16_t)(base + k), idx[2 * k + 1] = (uint16_t)(32 + base + k);
    return _mm512_loadu_si512(idx);
}

#endif
