/* Paged prefill attention on the CPU, reading K/V rows where they lie in the pool.
 *
 * Ragged chunks: q[cu[b]:cu[b+1]] are the last tokens of sequence b, whose lens[b] tokens
 * (the chunk included) are in the pool. A work item is a tile of ROWS query rows of one
 * (sequence, KV head): the chunk's tokens × the query heads sharing that KV head, flattened
 * token-major, so each K/V row read serves every head of the group. The item walks the keys
 * its rows may see, [max(kv_start, first − window + 1), last + 1), in tiles of KT keys
 * found through the block table (a tile may span pool blocks), with an online softmax in
 * float32 (base 2: exp2 of pre-scaled scores), and masks only the tiles the diagonal or a
 * window edge cuts.
 *
 * Layout inside an item: rows are the vector lanes. Scores are [key][row] and the output
 * accumulator [dim][row], so the softmax's max, sums and rescaling are lane-wise (no
 * horizontal reductions) and K/V rows are read in place as broadcast scalars.
 *
 * Two item paths: pf_item_bf16 (_paged_prefill_bf16.c; AVX-512 BF16 dot products, for
 * bfloat16 with head_dim a multiple of 32, when the CPU has the instructions) and the
 * portable item_generic below (plain C that GCC vectorises over the rows, compiled for
 * AVX-512, AVX2 and a default through target_clones; float32 and every other case).
 *
 * Threads: an OpenMP team of at most omp_get_max_threads() (torch's per-thread ICV, see
 * kernels/threads.py), items in descending cost order under a dynamic schedule (causal
 * tiles are uneven). The module links libgomp.so.1, the runtime torch has loaded.
 *
 * The caller (kernels/cpu_paged/prefill.py) has validated every argument; this file trusts
 * them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "_paged_prefill.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

#define LOG2E 1.44269504088896341f

/* 2^x for x <= 0 in float32, vectorisable: 2^n × p(f), f = x − n in [−0.5, 0.5], p of
 * degree 6 (relative error ~1e-7). x below −126 (and NaN, from −inf − −inf when a row has
 * seen no key yet) gives exactly 0. */
static inline float exp2_neg(float x) {
    float xc = x > -126.0f ? x : -127.0f;
    float n = __builtin_floorf(xc + 0.5f);
    float f = xc - n;
    float p = 1.5403530393381606e-4f;
    p = p * f + 1.3333558146428443e-3f;
    p = p * f + 9.6181291076284772e-3f;
    p = p * f + 5.5504108664821580e-2f;
    p = p * f + 2.4022650695910071e-1f;
    p = p * f + 6.9314718055994531e-1f;
    p = p * f + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23; /* n = −127: the bits of +0 */
    float s;
    memcpy(&s, &bits, sizeof s);
    return p * s;
}

/* Rows [0, n) of a key (or value) tile as float32 rows of D, converted once. */
static inline void load_rows(float *restrict dst, const pjob_t *j, const void *pool,
                             const int64_t *off, int64_t n) {
    const int64_t D = j->dim;
    for (int64_t i = 0; i < n; i++) {
        if (j->dtype == PF_BF16) {
            const uint16_t *src = (const uint16_t *)pool + off[i];
            for (int64_t d = 0; d < D; d++) dst[i * D + d] = bf16_to_f32(src[d]);
        } else {
            memcpy(dst + i * D, (const float *)pool + off[i], (size_t)D * sizeof(float));
        }
    }
}

/* The portable path for one row tile: any dtype the module takes, any head_dim. */
CLONES static void tile_generic(const pjob_t *j, const pitem_t *it, float *scr) {
    const int64_t D = j->dim;
    float *restrict qt = scr;            /* [D][ROWS], scaled to base 2 */
    float *restrict o = qt + D * ROWS;   /* [D][ROWS] */
    float *restrict kf = o + D * ROWS;   /* [KT][D] */
    float *restrict s = kf + KT * D;     /* [KT][ROWS] */
    float m[ROWS], l[ROWS], alpha[ROWS];
    int64_t off[KT];
    pbounds_t bd;
    pf_bounds(j, it, &bd);
    const float c = j->scale * LOG2E;
    for (int64_t r = 0; r < ROWS; r++) {
        int64_t qo = pf_q_offset(j, it, r < bd.n ? r : bd.n - 1);
        for (int64_t d = 0; d < D; d++) {
            float x = j->dtype == PF_BF16 ? bf16_to_f32(((const uint16_t *)j->q)[qo + d])
                                          : ((const float *)j->q)[qo + d];
            qt[d * ROWS + r] = x * c;
            o[d * ROWS + r] = 0.0f;
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    for (int64_t t0 = bd.lo; t0 < bd.hi; t0 += KT) {
        const int64_t n = bd.hi - t0 < KT ? bd.hi - t0 : KT;
        for (int64_t i = 0; i < n; i++) off[i] = pf_key_offset(j, it->b, it->g, t0 + i);
        load_rows(kf, j, j->k, off, n);
        for (int64_t i = 0; i < n; i++) {
            float *restrict si = s + i * ROWS;
            for (int64_t r = 0; r < ROWS; r++) si[r] = 0.0f;
            for (int64_t d = 0; d < D; d++) {
                const float kd = kf[i * D + d];
                const float *restrict qd = qt + d * ROWS;
#pragma omp simd
                for (int64_t r = 0; r < ROWS; r++) si[r] += qd[r] * kd;
            }
        }
        if (pf_tile_masked(j, &bd, t0, n))
            for (int64_t i = 0; i < n; i++)
                for (int64_t r = 0; r < ROWS; r++) {
                    int64_t t = t0 + i, p = bd.pos[r];
                    if (t > p || (j->window > 0 && p - t >= j->window))
                        s[i * ROWS + r] = -INFINITY;
                }
        for (int64_t r = 0; r < ROWS; r++) {
            float mx = m[r];
            for (int64_t i = 0; i < n; i++) mx = s[i * ROWS + r] > mx ? s[i * ROWS + r] : mx;
            alpha[r] = exp2_neg(m[r] - mx);
            m[r] = mx;
            l[r] *= alpha[r];
        }
        for (int64_t i = 0; i < n; i++) {
#pragma omp simd
            for (int64_t r = 0; r < ROWS; r++) {
                float p = exp2_neg(s[i * ROWS + r] - m[r]);
                s[i * ROWS + r] = p;
                l[r] += p;
            }
        }
        for (int64_t d = 0; d < D; d++)
#pragma omp simd
            for (int64_t r = 0; r < ROWS; r++) o[d * ROWS + r] *= alpha[r];
        load_rows(kf, j, j->v, off, n);
        for (int64_t i = 0; i < n; i++) {
            const float *restrict pi = s + i * ROWS;
            for (int64_t d = 0; d < D; d++) {
                const float vd = kf[i * D + d];
                float *restrict od = o + d * ROWS;
#pragma omp simd
                for (int64_t r = 0; r < ROWS; r++) od[r] += pi[r] * vd;
            }
        }
    }
    pf_write_rows(j, it, o, l, bd.n);
}

static void item_generic(const pjob_t *j, const pitem_t *it, float *scr) {
    for (int64_t k = 0; it->r0 + k * ROWS < it->r1; k++) {
        pitem_t sub = pf_sub_item(it, k);
        tile_generic(j, &sub, scr);
    }
}

static int use_bf16_path(const pjob_t *j) {
    return j->dtype == PF_BF16 && j->dim % 32 == 0 && pf_bf16_path_built()
#if defined(__x86_64__) && defined(__GNUC__)
           && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")
#endif
        ;
}

static int by_cost_desc(const void *a, const void *b) {
    int64_t ca = ((const pitem_t *)a)->cost, cb = ((const pitem_t *)b)->cost;
    return ca < cb ? 1 : ca > cb ? -1 : 0;
}

/* Every (sequence, KV head, run of up to RT row tiles) with its cost, heaviest first. Runs
 * are shortened when long ones would leave fewer than ~8 items per thread. */
static pitem_t *make_items(const pjob_t *j, int64_t batch, int threads, int forced,
                           int64_t *count) {
    const int64_t G = j->heads / j->kv_heads;
    int64_t tiles = 0;
    for (int64_t b = 0; b < batch; b++)
        tiles += j->kv_heads * (((j->cu[b + 1] - j->cu[b]) * G + ROWS - 1) / ROWS);
    int64_t run = tiles / (8 * (int64_t)threads);
    if (forced > 0) run = forced;
    run = run < 1 ? 1 : run > RT ? RT : run;
    const int64_t span = run * ROWS;
    int64_t n = 0;
    for (int64_t b = 0; b < batch; b++)
        n += j->kv_heads * (((j->cu[b + 1] - j->cu[b]) * G + span - 1) / span);
    pitem_t *items = malloc((size_t)(n > 0 ? n : 1) * sizeof *items);
    if (!items) return NULL;
    int64_t k = 0;
    for (int64_t b = 0; b < batch; b++) {
        int64_t rows = (j->cu[b + 1] - j->cu[b]) * G;
        for (int64_t g = 0; g < j->kv_heads; g++)
            for (int64_t r0 = 0; r0 < rows; r0 += span) {
                pitem_t *it = &items[k++];
                it->b = b;
                it->g = g;
                it->r0 = r0;
                it->r1 = r0 + span < rows ? r0 + span : rows;
                it->cost = 0;
                for (int64_t t = 0; it->r0 + t * ROWS < it->r1; t++) {
                    pitem_t sub = pf_sub_item(it, t);
                    pbounds_t bd;
                    pf_bounds(j, &sub, &bd);
                    it->cost += (sub.r1 - sub.r0) * (bd.hi - bd.lo);
                }
            }
    }
    qsort(items, (size_t)n, sizeof *items, by_cost_desc);
    *count = n;
    return items;
}

/* 0, or 1 when a thread could not get its scratch (then the output is incomplete). */
static int run_items(const pjob_t *j, const pitem_t *items, int64_t n, int team, int fast) {
    const size_t floats = (size_t)pf_scratch_floats(j->dim);
    int failed = 0;
#pragma omp parallel num_threads(team) reduction(| : failed)
    {
        float *scr = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
        if (!scr) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++) {
            if (!scr) continue;
            if (fast) pf_item_bf16(j, &items[i], scr);
            else item_generic(j, &items[i], scr);
        }
        free(scr);
    }
    return failed;
}

static PyObject *py_paged_prefill(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long out, q, k, v, tables, cu, lens, kv_start;
    long long qst, qsh, tstride, batch, heads, kv_heads, dim, bt, window;
    int dtype, index64, threads, path, run;
    double scale;
    if (!PyArg_ParseTuple(args, "KKKKKKKKLLLLLLLLLiidiii", &out, &q, &k, &v, &tables, &cu,
                          &lens, &kv_start, &qst, &qsh, &tstride, &batch, &heads, &kv_heads,
                          &dim, &bt, &window, &dtype, &index64, &scale, &threads, &path, &run))
        return NULL;
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads || dim <= 0 || bt <= 0 || batch < 0 ||
        (dtype != PF_F32 && dtype != PF_BF16)) {
        PyErr_SetString(PyExc_ValueError, "paged_prefill: unsupported shape or dtype");
        return NULL;
    }
    pjob_t j = {
        .q = (const void *)(uintptr_t)q, .k = (const void *)(uintptr_t)k,
        .v = (const void *)(uintptr_t)v, .out = (void *)(uintptr_t)out,
        .tables = (const void *)(uintptr_t)tables, .cu = (const int64_t *)(uintptr_t)cu,
        .lens = (const int64_t *)(uintptr_t)lens,
        .kv_start = (const int64_t *)(uintptr_t)kv_start, .q_stride_t = qst,
        .q_stride_h = qsh, .table_stride = tstride, .heads = heads, .kv_heads = kv_heads,
        .dim = dim, .block_tokens = bt, .window = window, .dtype = dtype, .index64 = index64,
        .scale = (float)scale,
    };
    /* path: 0 the best this CPU runs, 1 the portable path (tests cover both). */
    int fast = path == 0 && use_bf16_path(&j);
    if (threads <= 0) threads = omp_get_max_threads();
    int64_t n = 0;
    pitem_t *items = make_items(&j, batch, threads, run, &n);
    if (!items) return PyErr_NoMemory();
    int team = n < threads ? (int)n : threads;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (n > 0) failed = run_items(&j, items, n, team < 1 ? 1 : team, fast);
    Py_END_ALLOW_THREADS
    free(items);
    if (failed) return PyErr_NoMemory();
    return PyBool_FromLong(fast);
}

static PyObject *py_bf16_path(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    pjob_t j = {.dtype = PF_BF16, .dim = 64};
    return PyBool_FromLong(use_bf16_path(&j));
}

static PyMethodDef methods[] = {
    {"paged_prefill", py_paged_prefill, METH_VARARGS,
     "paged_prefill(out, q, k_pool, v_pool, tables, cu, lens, kv_start, q_stride_t, "
     "q_stride_h, table_stride, batch, heads, kv_heads, head_dim, block_tokens, window, "
     "dtype, index64, scale, threads, path, tiles_per_item) on raw data pointers (cu, lens, "
     "kv_start int64; tiles_per_item 0: chosen here); returns whether the AVX-512 BF16 path ran. See kernels/cpu_paged/prefill.py."},
    {"bf16_path", py_bf16_path, METH_NOARGS,
     "Whether bfloat16 calls (head_dim a multiple of 32) take the AVX-512 BF16 path here."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_paged_prefill",
    "CPU paged prefill attention over a KV pool (kernels/cpu_paged).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__paged_prefill(void) { return PyModule_Create(&module); }
