/* The AVX-512 BF16 item path of the paged-prefill kernel (see _paged_prefill.c).
 *
 * For bfloat16 pools with head_dim a multiple of 32. Rows are lanes: an item's 48 rows are
 * three 16-lane vectors.
 *
 * - Q·Kᵀ: Q is stored once per item as [dim/2][row] bf16 pairs; each key's row is read in
 *   place and every pair of it broadcast, so `vdpbf16ps` adds Q[r, 2p:2p+2]·K[t, 2p:2p+2]
 *   into the lanes of key t (8 keys × 3 row vectors = 24 accumulators per pass). No K copy.
 * - softmax: scores scaled by scale × log2(e), masked only in tiles the diagonal or a
 *   window's edge cuts, max / exp2 / sums lane-wise in float32.
 * - P·V: P rounded to bf16 by round-to-nearest-even (as ATen's flash kernel feeds its
 *   bf16 P·V GEMM) and paired over keys; the tile's V rows are interleaved two keys at a
 *   time into a small scratch ([KT/2][dim] pairs, two permutes per 32 dims), so
 *   `vdpbf16ps` adds P[r, t:t+2]·V[t:t+2, d] into an accumulator of dim d (8 dims × 3 row
 *   vectors per pass), rescaled by the softmax's correction as it is loaded.
 *
 * Only this file's functions are compiled for AVX-512 BF16 (a target attribute, no -march):
 * _paged_prefill.c calls them only when __builtin_cpu_supports says the CPU has it.
 */
#include <math.h>

#include "_paged_prefill.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#include "_bf16_avx512.h"

#define RV (ROWS / 16)
#define KB 8 /* keys per Q·Kᵀ pass, dims per P·V pass */

int pf_bf16_path_built(void) { return 1; }

/* s[i][r] = Q[r]·K[t0 + i] for the n keys whose rows start at krow[i]. */
TGT static void qk_tile(const uint32_t *qp, const uint16_t *const *krow, int64_t n,
                        int64_t pairs, float *s) {
    for (int64_t k0 = 0; k0 < n; k0 += KB) {
        const uint16_t *kr[KB];
        for (int k = 0; k < KB; k++) kr[k] = krow[k0 + k < n ? k0 + k : n - 1];
        __m512 acc[KB][RV];
#pragma GCC unroll 8
        for (int k = 0; k < KB; k++)
            for (int v = 0; v < RV; v++) acc[k][v] = _mm512_setzero_ps();
        for (int64_t p = 0; p < pairs; p++) {
            __m512i qv[RV];
            for (int v = 0; v < RV; v++) qv[v] = _mm512_load_si512(qp + p * ROWS + 16 * v);
#pragma GCC unroll 8
            for (int k = 0; k < KB; k++) {
                __m512bh kk = (__m512bh)bcast32(kr[k] + 2 * p);
                for (int v = 0; v < RV; v++)
                    acc[k][v] = _mm512_dpbf16_ps(acc[k][v], (__m512bh)qv[v], kk);
            }
        }
        for (int k = 0; k < KB && k0 + k < n; k++)
            for (int v = 0; v < RV; v++) _mm512_store_ps(s + (k0 + k) * ROWS + 16 * v, acc[k][v]);
    }
}

/* Online-softmax update of one tile: scores become P (padded to an even key count with
 * zeros), m and l advance, alpha receives the rescaling of the old accumulator. */
TGT static void softmax_tile(const pjob_t *j, const pbounds_t *bd, int64_t t0, int64_t n,
                             float *s, float *m, float *l, float *alpha) {
    const __m512 c = _mm512_set1_ps(j->scale * 1.44269504088896341f);
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    const int masked = pf_tile_masked(j, bd, t0, n);
    const __m512i win = _mm512_set1_epi32((int)(j->window > 0 ? j->window : 0));
    for (int v = 0; v < RV; v++) {
        const __m512i pos = _mm512_loadu_si512(bd->pos + 16 * v);
        __m512 mold = _mm512_load_ps(m + 16 * v), mx = mold;
        for (int64_t i = 0; i < n; i++) {
            __m512 x = _mm512_mul_ps(_mm512_load_ps(s + i * ROWS + 16 * v), c);
            if (masked) {
                __m512i t = _mm512_set1_epi32((int)(t0 + i));
                __mmask16 vis = _mm512_cmp_epi32_mask(t, pos, _MM_CMPINT_LE);
                if (j->window > 0)
                    vis &= _mm512_cmp_epi32_mask(_mm512_sub_epi32(pos, t), win, _MM_CMPINT_LT);
                x = _mm512_mask_blend_ps(vis, ninf, x);
            }
            _mm512_store_ps(s + i * ROWS + 16 * v, x);
            mx = _mm512_max_ps(mx, x);
        }
        /* A row that has seen no key yet keeps m = −inf; subtract 0 instead (no NaN). */
        __m512 ms = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mx, ninf, _CMP_EQ_OQ), mx,
                                         _mm512_setzero_ps());
        __m512 a = exp2v(_mm512_sub_ps(mold, ms)), sum = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i++) {
            __m512 p = exp2v(_mm512_sub_ps(_mm512_load_ps(s + i * ROWS + 16 * v), ms));
            _mm512_store_ps(s + i * ROWS + 16 * v, p);
            sum = _mm512_add_ps(sum, p);
        }
        if (n & 1) _mm512_store_ps(s + n * ROWS + 16 * v, _mm512_setzero_ps());
        _mm512_store_ps(l + 16 * v, _mm512_fmadd_ps(_mm512_load_ps(l + 16 * v), a, sum));
        _mm512_store_ps(m + 16 * v, mx);
        _mm512_store_ps(alpha + 16 * v, a);
    }
}

/* pp[i][r] = (P[r, 2i], P[r, 2i+1]) as bf16, for the n keys of a tile. */
TGT static void pair_p(const float *s, int64_t n, uint32_t *pp) {
    uint16_t ilv[32];
    for (int k = 0; k < 16; k++) ilv[2 * k] = (uint16_t)k, ilv[2 * k + 1] = (uint16_t)(16 + k);
    const __m512i ilv_v = _mm512_loadu_si512(ilv);
    for (int64_t i = 0; i < (n + 1) / 2; i++)
        for (int v = 0; v < RV; v++) {
            __m512bh b = _mm512_cvtne2ps_pbh(_mm512_load_ps(s + (2 * i + 1) * ROWS + 16 * v),
                                             _mm512_load_ps(s + 2 * i * ROWS + 16 * v));
            _mm512_store_si512(pp + i * ROWS + 16 * v,
                               _mm512_permutexvar_epi16(ilv_v, (__m512i)b));
        }
}

/* vp[i][d] = (V[2i, d], V[2i+1, d]) for the n keys whose rows start at vrow[i]. */
TGT static void pair_v(const uint16_t *const *vrow, int64_t n, int64_t D, uint32_t *vp) {
    const __m512i lo_v = pair_words_idx(0), hi_v = pair_words_idx(16);
    for (int64_t i = 0; i < (n + 1) / 2; i++) {
        const uint16_t *a = vrow[2 * i], *b = vrow[2 * i + 1 < n ? 2 * i + 1 : 2 * i];
        for (int64_t d = 0; d < D; d += 32) {
            __m512i x = _mm512_loadu_si512(a + d), y = _mm512_loadu_si512(b + d);
            _mm512_store_si512(vp + i * D + d, _mm512_permutex2var_epi16(x, lo_v, y));
            _mm512_store_si512(vp + i * D + d + 16, _mm512_permutex2var_epi16(x, hi_v, y));
        }
    }
}

/* o[d][r] = o[d][r] × alpha[r] + Σ_t P[r, t] V[t, d] over the tile's key pairs. */
TGT static void pv_tile(const uint32_t *pp, const uint32_t *vp, int64_t pairs, int64_t D,
                        const float *alpha, float *o) {
    __m512 al[RV];
    for (int v = 0; v < RV; v++) al[v] = _mm512_load_ps(alpha + 16 * v);
    for (int64_t d0 = 0; d0 < D; d0 += KB) {
        __m512 acc[KB][RV];
#pragma GCC unroll 8
        for (int k = 0; k < KB; k++)
            for (int v = 0; v < RV; v++)
                acc[k][v] = _mm512_mul_ps(_mm512_load_ps(o + (d0 + k) * ROWS + 16 * v), al[v]);
        for (int64_t i = 0; i < pairs; i++) {
            __m512i pv[RV];
            for (int v = 0; v < RV; v++) pv[v] = _mm512_load_si512(pp + i * ROWS + 16 * v);
#pragma GCC unroll 8
            for (int k = 0; k < KB; k++) {
                __m512bh vv = (__m512bh)_mm512_set1_epi32((int)vp[i * D + d0 + k]);
                for (int v = 0; v < RV; v++)
                    acc[k][v] = _mm512_dpbf16_ps(acc[k][v], (__m512bh)pv[v], vv);
            }
        }
#pragma GCC unroll 8
        for (int k = 0; k < KB; k++)
            for (int v = 0; v < RV; v++) _mm512_store_ps(o + (d0 + k) * ROWS + 16 * v, acc[k][v]);
    }
}

/* An item's row tiles share each key tile: its K rows are read (and its V rows paired)
 * once for all of them while they are in L1. */
TGT void pf_item_bf16(const pjob_t *j, const pitem_t *it, float *scr) {
    const int64_t D = j->dim, pairs = D / 2;
    const int64_t nt = (it->r1 - it->r0 + ROWS - 1) / ROWS;
    uint32_t *vp = (uint32_t *)scr;                 /* [KT/2][D] */
    float *s = (float *)(vp + (KT / 2) * D);        /* [KT][ROWS] */
    uint32_t *pp = (uint32_t *)(s + KT * ROWS);     /* [KT/2][ROWS] */
    uint32_t *qp[RT];                               /* per tile [D/2][ROWS] */
    float *o[RT];                                   /* per tile [D][ROWS] */
    float m[RT][ROWS] __attribute__((aligned(64))), l[RT][ROWS] __attribute__((aligned(64)));
    float alpha[ROWS] __attribute__((aligned(64)));
    const uint16_t *krow[KT], *vrow[KT];
    pitem_t sub[RT];
    pbounds_t bd[RT];
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t k = 0; k < nt; k++) {
        qp[k] = (uint32_t *)(pp + (KT / 2) * ROWS) + k * 3 * pairs * ROWS;
        o[k] = (float *)(qp[k] + pairs * ROWS);
        sub[k] = pf_sub_item(it, k);
        pf_bounds(j, &sub[k], &bd[k]);
        lo = bd[k].lo < lo ? bd[k].lo : lo;
        hi = bd[k].hi > hi ? bd[k].hi : hi;
        for (int64_t r = 0; r < ROWS; r++) {
            int64_t rr = r < bd[k].n ? r : bd[k].n - 1;
            const uint16_t *q = (const uint16_t *)j->q + pf_q_offset(j, &sub[k], rr);
            for (int64_t p = 0; p < pairs; p++) memcpy(qp[k] + p * ROWS + r, q + 2 * p, 4);
            m[k][r] = -INFINITY;
            l[k][r] = 0.0f;
        }
        memset(o[k], 0, (size_t)(D * ROWS) * sizeof(float));
    }
    for (int64_t t0 = lo; t0 < hi; t0 += KT) {
        const int64_t n = hi - t0 < KT ? hi - t0 : KT;
        for (int64_t i = 0; i < n; i++) {
            int64_t off = pf_key_offset(j, it->b, it->g, t0 + i);
            krow[i] = (const uint16_t *)j->k + off;
            vrow[i] = (const uint16_t *)j->v + off;
        }
        int paired = 0;
        for (int64_t k = 0; k < nt; k++) {
            if (t0 >= bd[k].hi || t0 + n <= bd[k].lo) continue; /* no row of it sees these */
            qk_tile(qp[k], krow, n, pairs, s);
            softmax_tile(j, &bd[k], t0, n, s, m[k], l[k], alpha);
            pair_p(s, n, pp);
            if (!paired) pair_v(vrow, n, D, vp), paired = 1;
            pv_tile(pp, vp, (n + 1) / 2, D, alpha, o[k]);
        }
    }
    for (int64_t k = 0; k < nt; k++) pf_write_rows(j, &sub[k], o[k], l[k], bd[k].n);
}

#else /* no AVX-512 BF16 path in this build: the portable path serves every call */

int pf_bf16_path_built(void) { return 0; }

void pf_item_bf16(const pjob_t *j, const pitem_t *it, float *scratch) {
    (void)j, (void)it, (void)scratch;
}

#endif
