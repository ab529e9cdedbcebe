/* Shared by the paged-decode kernel's two item paths (_paged_decode.c: module, schedule,
 * split merge and the portable path; _paged_decode_bf16.c: the AVX-512 BF16 path). */
#ifndef KERNELS_PAGED_DECODE_H
#define KERNELS_PAGED_DECODE_H

#include <stdint.h>

#include "_bf16.h"

enum { DT_F32 = 0, DT_BF16 = 1 };

/* The largest query group and head_dim the stack buffers take (the wrapper delegates
 * anything larger to the torch backend). */
#define MAX_GROUP 16
#define MAX_DIM 256

typedef struct {
    const void *q;
    const void *k;
    const void *v;
    void *out;
    const void *tables;
    const void *lens;
    const void *kv_start; /* NULL: none */
    float *partial;       /* [items][group][dim + 2]: acc, max, sum; NULL when splits == 1 */
    int64_t q_stride_b, q_stride_h; /* in elements */
    int64_t table_stride;           /* in elements */
    int64_t batch, heads, kv_heads, dim, block_tokens, window; /* window 0: none */
    int64_t splits;
    int dtype, index64;
    int fast; /* items take the AVX-512 BF16 path */
    float scale;
} job_t;

static inline int64_t read_index(const void *p, int64_t i, int index64) {
    return index64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

/* The visible key range [lo, hi) of sequence b. */
static inline void key_range(const job_t *j, int64_t b, int64_t *lo, int64_t *hi) {
    int64_t len = read_index(j->lens, b, j->index64);
    int64_t start = j->kv_start ? read_index(j->kv_start, b, j->index64) : 0;
    if (j->window > 0 && len - j->window > start) start = len - j->window;
    if (start < 0) start = 0;
    *lo = start;
    *hi = len;
}

/* Writes one query row's result: acc / l in the output's dtype (zeros when l is 0: no
 * visible key), or (acc, m, l) into `part` (m in natural-log units) for the split merge. */
static inline void write_row(const job_t *j, int64_t b, int64_t h, const float *acc, float m,
                             float l, float *part) {
    const int64_t D = j->dim;
    if (part) {
        memcpy(part, acc, (size_t)D * sizeof(float));
        part[D] = m;
        part[D + 1] = l;
        return;
    }
    float inv = l > 0.0f ? 1.0f / l : 0.0f;
    int64_t o = (b * j->heads + h) * D;
    if (j->dtype == DT_BF16) {
        uint16_t *out = (uint16_t *)j->out + o;
        for (int64_t d = 0; d < D; d++) out[d] = f32_to_bf16(acc[d] * inv);
    } else {
        float *out = (float *)j->out + o;
        for (int64_t d = 0; d < D; d++) out[d] = acc[d] * inv;
    }
}

/* The AVX-512 BF16 item (bfloat16, dim a multiple of 32): query group g of sequence b over
 * keys [t0, t1); `part` as for write_row. pd_bf16_path_built is 0 when this build lacks it. */
int pd_bf16_path_built(void);
void pd_item_bf16(const job_t *j, int64_t b, int64_t g, int64_t t0, int64_t t1, float *part);

#endif
