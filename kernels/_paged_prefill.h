/* Shared by the paged-prefill kernel's two item paths (_paged_prefill.c: module, schedule
 * and the portable path; _paged_prefill_bf16.c: the AVX-512 BF16 path). */
#ifndef KERNELS_PAGED_PREFILL_H
#define KERNELS_PAGED_PREFILL_H

#include <stdint.h>
#include <string.h>

#include "_bf16.h"

enum { PF_F32 = 0, PF_BF16 = 1 };

/* A work item is ROWS query rows of one (sequence, KV head): the rows of (b, g) are its
 * chunk's tokens × the G query heads sharing KV head g, flattened as token × G + head, so a
 * tile folds the group into its rows and positions never decrease along it. 48 rows are
 * three 16-lane vectors, the register blocking of the AVX-512 path. */
#define ROWS 48
/* Keys per tile (a tile may span pool blocks: each key's row is found through the table). */
#define KT 32
/* An item holds up to RT consecutive row tiles of one (sequence, KV head), and the fast
 * path runs all of them on each key tile while its K/V rows are in L1: a long prefix is
 * then streamed from memory once per RT tiles (a 6 K-token sequence's K and V rows
 * of one KV head are ~1.5 MiB at head_dim 64, more than L2). */
#define RT 4

typedef struct {
    const void *q, *k, *v;
    void *out;                       /* [tokens, heads, dim], contiguous, q's dtype */
    const void *tables;              /* int32 or int64, rows table_stride apart */
    const int64_t *cu, *lens, *kv_start; /* kv_start NULL: none */
    int64_t q_stride_t, q_stride_h;  /* elements */
    int64_t table_stride;
    int64_t heads, kv_heads, dim, block_tokens, window; /* window 0: none */
    int dtype, index64;
    float scale;
} pjob_t;

typedef struct {
    int64_t b, g, r0, r1; /* rows [r0, r1) of (b, g), r1 - r0 <= RT × ROWS */
    int64_t cost;         /* rows × visible keys, for the schedule's order */
} pitem_t;

/* What an item needs to know of its rows: their positions, the keys they may see. */
typedef struct {
    int64_t lo, hi;          /* keys [lo, hi) are visible to at least one row */
    int64_t first, last;     /* positions of the first and last row */
    int32_t pos[ROWS];       /* position of each row (padding rows repeat the last) */
    int64_t n;               /* real rows */
} pbounds_t;

static inline int64_t pf_index(const void *p, int64_t i, int index64) {
    return index64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

static inline void pf_bounds(const pjob_t *j, const pitem_t *it, pbounds_t *bd) {
    const int64_t G = j->heads / j->kv_heads;
    const int64_t qlen = j->cu[it->b + 1] - j->cu[it->b], len = j->lens[it->b];
    const int64_t base = len - qlen;
    bd->n = it->r1 - it->r0;
    for (int64_t r = 0; r < ROWS; r++) {
        int64_t rr = r < bd->n ? it->r0 + r : it->r1 - 1;
        bd->pos[r] = (int32_t)(base + rr / G);
    }
    bd->first = bd->pos[0];
    bd->last = bd->pos[bd->n - 1];
    int64_t lo = j->kv_start ? j->kv_start[it->b] : 0;
    if (j->window > 0 && bd->first - j->window + 1 > lo) lo = bd->first - j->window + 1;
    bd->lo = lo < 0 ? 0 : lo;
    bd->hi = bd->last + 1;
}

/* Element offset of key t's row for KV head g (K and V pools share the layout). */
static inline int64_t pf_key_offset(const pjob_t *j, int64_t b, int64_t g, int64_t t) {
    const int64_t bt = j->block_tokens;
    int64_t blk = pf_index(j->tables, b * j->table_stride + t / bt, j->index64);
    return ((blk * bt + t % bt) * j->kv_heads + g) * j->dim;
}

/* Whether key tile [t0, t0 + n) needs a per-row mask (the diagonal, a window's edge). */
static inline int pf_tile_masked(const pjob_t *j, const pbounds_t *bd, int64_t t0, int64_t n) {
    return t0 + n - 1 > bd->first || (j->window > 0 && bd->last - t0 >= j->window);
}

/* Element offset of row r's query (and, times dim, its output row index). */
static inline int64_t pf_q_offset(const pjob_t *j, const pitem_t *it, int64_t r) {
    const int64_t G = j->heads / j->kv_heads, rr = it->r0 + r;
    return (j->cu[it->b] + rr / G) * j->q_stride_t + (it->g * G + rr % G) * j->q_stride_h;
}

static inline int64_t pf_out_offset(const pjob_t *j, const pitem_t *it, int64_t r) {
    const int64_t G = j->heads / j->kv_heads, rr = it->r0 + r;
    return ((j->cu[it->b] + rr / G) * j->heads + it->g * G + rr % G) * j->dim;
}


/* Scratch floats an item path needs per thread for head_dim D (the larger of the two):
 * per row tile Q and the accumulator, per key tile the K/V rows or pairs and the scores. */
static inline int64_t pf_scratch_floats(int64_t D) {
    return RT * 2 * D * ROWS + (int64_t)KT * D + 2 * (int64_t)KT * ROWS + 256;
}

/* Row tile k of a multi-tile item, as an item of its own. */
static inline pitem_t pf_sub_item(const pitem_t *it, int64_t k) {
    pitem_t sub = *it;
    sub.r0 = it->r0 + k * ROWS;
    sub.r1 = sub.r0 + ROWS < it->r1 ? sub.r0 + ROWS : it->r1;
    return sub;
}

/* Final rows: out = o[d][r] / l[r], in the output's dtype. */
static inline void pf_write_rows(const pjob_t *j, const pitem_t *it, const float *o,
                                 const float *l, int64_t n) {
    const int64_t D = j->dim;
    for (int64_t r = 0; r < n; r++) {
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f; /* no visible key: zeros */
        int64_t off = pf_out_offset(j, it, r);
        if (j->dtype == PF_BF16) {
            uint16_t *dst = (uint16_t *)j->out + off;
            for (int64_t d = 0; d < D; d++) dst[d] = f32_to_bf16(o[d * ROWS + r] * inv);
        } else {
            float *dst = (float *)j->out + off;
            for (int64_t d = 0; d < D; d++) dst[d] = o[d * ROWS + r] * inv;
        }
    }
}

/* The AVX-512 BF16 path (bfloat16, dim a multiple of 32); 0 when this build lacks it. */
int pf_bf16_path_built(void);
void pf_item_bf16(const pjob_t *j, const pitem_t *it, float *scratch);

#endif
