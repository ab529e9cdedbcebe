/* The AVX-512 BF16 item path of the paged-decode kernel (see _paged_decode.c).
 *
 * For bfloat16 pools with head_dim a multiple of 32. An item (sequence b, KV head g, keys
 * [t0, t1)) walks its keys 16 at a time, so that keys are lanes:
 *
 * - Q·Kᵀ: each query row's bf16 values are held in registers as they are (pairs), each
 *   key's row is read in place from its pool block, and `vdpbf16ps` sums their products
 *   into one accumulator per key (16 lanes of partial sums); the 16 accumulators are then
 *   reduced and transposed together into one vector of 16 scores (45 shuffles and adds,
 *   not 16 horizontal sums).
 * - softmax: per row and per 16 keys, one maximum and one rescale (online softmax in
 *   float32, base 2: scores scaled by scale × log2(e)); the sum is kept lane-wise and
 *   reduced once at the end; lanes past the last key are −inf, so they weigh 0.
 * - P·V: P is rounded to bf16 by round-to-nearest-even (as the prefill path and ATen's
 *   flash kernel feed their bf16 P·V), so consecutive keys form the pairs `vdpbf16ps`
 *   sums: two V rows are interleaved word by word in registers (two permutes per 32 dims,
 *   shared by every row of the group) and each row adds P[r, t:t+2]·V[t:t+2, d] into its
 *   float32 accumulator, which is rescaled by the softmax's correction as it is loaded.
 *
 * Every row of the group shares each pass over the keys, so K and V rows are read from
 * memory once per item (then from L1). Only this file's functions are compiled for AVX-512
 * BF16 (a target attribute, no -march); _paged_decode.c calls them only when
 * __builtin_cpu_supports says the CPU has it.
 */
#include <math.h>
#include <string.h>

#include "_paged_decode.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#include "_bf16_avx512.h"

#define KC 16 /* keys per chunk: the lanes of one score vector */
#define RG 8  /* query rows per P·V pass (2 accumulators each, all in registers) */

int pd_bf16_path_built(void) { return 1; }

/* Lane 4k + s of the result = the sum of the 16 lanes of a[4s + k] (the pairings below
 * leave the 4 × 4 transpose), so the caller stores key i's accumulator in slot
 * slot_of_key[i] and lane i is key i. */
TGT static inline __m512 sum_lanes16(const __m512 a[16]) {
    __m512 c[8], e[4], f[2];
    for (int i = 0; i < 8; i++) /* 256-bit halves: [a.lo + a.hi | b.lo + b.hi] */
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* 128-bit quarters: one per key */
        e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++) /* within quarters: two lanes per key */
        f[i] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * i], e[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(e[2 * i], e[2 * i + 1], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], 0x88), _mm512_shuffle_ps(f[0], f[1], 0xDD));
}

/* Which accumulator slot key k goes to so that sum_lanes16 puts it in lane k. */
static const int slot_of_key[KC] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

/* Scores of one query row (qv: its D/32 vectors of bf16 pairs) against the 16 key rows. */
TGT static inline __attribute__((always_inline)) __m512
qk_row(const __m512i *qv, const uint16_t *const *krow, const int64_t D) {
    __m512 a[KC];
#pragma GCC unroll 16
    for (int k = 0; k < KC; k++) {
        const uint16_t *kr = krow[k];
        __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)qv[0],
                                    (__m512bh)_mm512_loadu_si512(kr));
        for (int64_t v = 1; v < D / 32; v++)
            s = _mm512_dpbf16_ps(s, (__m512bh)qv[v], (__m512bh)_mm512_loadu_si512(kr + 32 * v));
        a[slot_of_key[k]] = s;
    }
    return sum_lanes16(a);
}

/* Rows [r0, r0 + rn) of the group, dims [d0, d0 + 32): acc ← acc × alpha + P·V over the
 * chunk's `pairs` key pairs (pp[r][i]: row r's P of keys 2i, 2i + 1 as a bf16 pair). */
TGT static inline __attribute__((always_inline)) void
pv_rows(float *acc, const float *alpha, const uint32_t (*pp)[KC / 2],
        const uint16_t *const *vrow, int64_t pairs, int64_t d0, int64_t r0, int64_t rn,
        const int64_t D, __m512i lo_idx, __m512i hi_idx) {
    __m512 a[RG][2];
#pragma GCC unroll 8
    for (int r = 0; r < RG; r++)
        if (r < rn) {
            const __m512 al = _mm512_set1_ps(alpha[r0 + r]);
            a[r][0] = _mm512_mul_ps(_mm512_loadu_ps(acc + (r0 + r) * D + d0), al);
            a[r][1] = _mm512_mul_ps(_mm512_loadu_ps(acc + (r0 + r) * D + d0 + 16), al);
        } else {
            a[r][0] = a[r][1] = _mm512_setzero_ps(); /* unused; keeps the compiler sure */
        }
    for (int64_t i = 0; i < pairs; i++) {
        const __m512i x = _mm512_loadu_si512(vrow[2 * i] + d0);
        const __m512i y = _mm512_loadu_si512(vrow[2 * i + 1] + d0);
        const __m512bh lo = (__m512bh)_mm512_permutex2var_epi16(x, lo_idx, y);
        const __m512bh hi = (__m512bh)_mm512_permutex2var_epi16(x, hi_idx, y);
#pragma GCC unroll 8
        for (int r = 0; r < RG; r++)
            if (r < rn) {
                const __m512bh p = (__m512bh)_mm512_set1_epi32((int)pp[r0 + r][i]);
                a[r][0] = _mm512_dpbf16_ps(a[r][0], lo, p);
                a[r][1] = _mm512_dpbf16_ps(a[r][1], hi, p);
            }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RG; r++)
        if (r < rn) {
            _mm512_storeu_ps(acc + (r0 + r) * D + d0, a[r][0]);
            _mm512_storeu_ps(acc + (r0 + r) * D + d0 + 16, a[r][1]);
        }
}

/* Where an item's walk through its block table stands: key t, in table entry bi at offset
 * off of pool block blk. */
typedef struct {
    int64_t t, t1, bi, off, blk, brow;
} cursor_t;

static inline cursor_t cursor_at(const job_t *j, int64_t b, int64_t t0, int64_t t1) {
    cursor_t c = {.t = t0, .t1 = t1, .bi = t0 / j->block_tokens,
                  .off = t0 % j->block_tokens, .blk = 0, .brow = b * j->table_stride};
    if (t0 < t1) c.blk = read_index(j->tables, c.brow + c.bi, j->index64);
    return c;
}

/* Prefetch distance, in chunks, and into L2: a step's pools far exceed the caches, an item's
 * rows are kv_heads × head_dim apart in randomly placed blocks (the hardware prefetchers
 * stop at each 4 KiB page), and the L1's few miss buffers cannot hold 16 keys' worth. 4
 * chunks ahead to L2 was the best of 1–12 ahead to L1 or L2 (bench/RESULTS.md). */
#define PF_DIST 4
#define RING (PF_DIST + 1)

/* The K and V rows of KV head g for the next (up to) 16 keys, padded with the last one;
 * returns how many are real (0: the item's keys are done). One table read per block
 * crossed, none past the item's last key. */
static inline __attribute__((always_inline)) int64_t
fill_rows(const job_t *j, cursor_t *c, int64_t g, const int64_t D, const uint16_t **krow,
          const uint16_t **vrow) {
    const int64_t n = c->t1 - c->t < KC ? c->t1 - c->t : KC;
    if (n <= 0) return 0;
    const int64_t bt = j->block_tokens, row = j->kv_heads * D;
    for (int64_t i = 0; i < n; i++) {
        const int64_t e = (c->blk * bt + c->off) * row + g * D;
        krow[i] = (const uint16_t *)j->k + e;
        vrow[i] = (const uint16_t *)j->v + e;
        if (++c->off == bt && c->t + i + 1 < c->t1) {
            c->off = 0;
            c->blk = read_index(j->tables, c->brow + ++c->bi, j->index64);
        }
    }
    for (int64_t i = n; i < KC; i++) krow[i] = krow[n - 1], vrow[i] = vrow[n - 1];
    c->t += n;
    return n;
}

/* Prefetch the n K and V rows of a chunk into L2. */
static inline __attribute__((always_inline)) void
prefetch_rows(const uint16_t *(*rows)[KC], int64_t n, const int64_t D) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < D; d += 32) {
            _mm_prefetch((const char *)(rows[0][i] + d), _MM_HINT_T1);
            _mm_prefetch((const char *)(rows[1][i] + d), _MM_HINT_T1);
        }
}

/* The item with D a compile-time constant where pd_item_bf16 calls it (64, 128, 256). */
TGT static inline __attribute__((always_inline)) void
item_impl(const job_t *j, int64_t b, int64_t g, int64_t t0, int64_t t1, float *part,
          const int64_t D) {
    const int64_t G = j->heads / j->kv_heads;
    const __m512 c = _mm512_set1_ps(j->scale * 1.44269504088896341f);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lo_idx = pair_words_idx(0), hi_idx = pair_words_idx(16);
    float acc[MAX_GROUP * MAX_DIM] __attribute__((aligned(64)));
    uint32_t pp[MAX_GROUP][KC / 2] __attribute__((aligned(64)));
    __m512 lsum[MAX_GROUP];
    float m[MAX_GROUP], alpha[MAX_GROUP];
    memset(acc, 0, (size_t)(G * D) * sizeof(float));
    for (int64_t r = 0; r < G; r++) m[r] = -INFINITY, lsum[r] = _mm512_setzero_ps();
    /* Row pointers of the chunk being computed and of the PF_DIST after it, whose rows are
     * prefetched when their pointers are found. */
    const uint16_t *rows[RING][2][KC]; /* [chunk % RING][K/V][key] */
    int64_t cnt[RING];
    cursor_t cur = cursor_at(j, b, t0, t1);
    for (int s = 0; s < PF_DIST; s++) {
        cnt[s] = fill_rows(j, &cur, g, D, rows[s][0], rows[s][1]);
        prefetch_rows(rows[s], cnt[s], D);
    }
    for (int64_t ci = 0;; ci++) {
        const int slot = (int)(ci % RING), ahead = (int)((ci + PF_DIST) % RING);
        cnt[ahead] = fill_rows(j, &cur, g, D, rows[ahead][0], rows[ahead][1]);
        prefetch_rows(rows[ahead], cnt[ahead], D);
        const int64_t n = cnt[slot];
        if (n == 0) break;
        const uint16_t *const *krow = rows[slot][0], *const *vrow = rows[slot][1];
        const __mmask16 valid = (__mmask16)((1u << n) - 1u);
        for (int64_t r = 0; r < G; r++) {
            const uint16_t *q = (const uint16_t *)j->q + b * j->q_stride_b
                                + (g * G + r) * j->q_stride_h;
            __m512i qv[MAX_DIM / 32];
            for (int64_t v = 0; v < D / 32; v++) qv[v] = _mm512_loadu_si512(q + 32 * v);
            __m512 x = _mm512_mul_ps(qk_row(qv, krow, D), c);
            x = _mm512_mask_blend_ps(valid, ninf, x);
            const float cm = _mm512_reduce_max_ps(x);
            const float mn = cm > m[r] ? cm : m[r];
            /* m[r] = −inf before the first chunk: exp2v gives alpha 0, and mn is finite
             * (every chunk has a key). */
            const __m512 al = exp2v(_mm512_set1_ps(m[r] - mn));
            const __m512 p = exp2v(_mm512_sub_ps(x, _mm512_set1_ps(mn)));
            lsum[r] = _mm512_fmadd_ps(lsum[r], al, p);
            alpha[r] = _mm512_cvtss_f32(al);
            m[r] = mn;
            _mm256_store_si256((__m256i *)pp[r], (__m256i)_mm512_cvtneps_pbh(p));
        }
        const int64_t pairs = (n + 1) / 2;
        for (int64_t d0 = 0; d0 < D; d0 += 32)
            for (int64_t r0 = 0; r0 < G; r0 += RG)
                pv_rows(acc, alpha, (const uint32_t (*)[KC / 2])pp, vrow, pairs, d0, r0,
                        G - r0 < RG ? G - r0 : RG, D, lo_idx, hi_idx);
    }
    for (int64_t r = 0; r < G; r++) {
        const float l = _mm512_reduce_add_ps(lsum[r]);
        write_row(j, b, g * G + r, acc + r * D, m[r] * 0.69314718055994531f, l,
                  part ? part + r * (D + 2) : NULL);
    }
}

TGT void pd_item_bf16(const job_t *j, int64_t b, int64_t g, int64_t t0, int64_t t1,
                      float *part) {
    switch (j->dim) {
    case 64: item_impl(j, b, g, t0, t1, part, 64); return;
    case 128: item_impl(j, b, g, t0, t1, part, 128); return;
    case 256: item_impl(j, b, g, t0, t1, part, 256); return; /* Gemma 3 */
    default: item_impl(j, b, g, t0, t1, part, j->dim);
    }
}

#else /* no AVX-512 BF16 path in this build: the portable path serves every call */

int pd_bf16_path_built(void) { return 0; }

void pd_item_bf16(const job_t *j, int64_t b, int64_t g, int64_t t0, int64_t t1, float *part) {
    (void)j, (void)b, (void)g, (void)t0, (void)t1, (void)part;
}

#endif
