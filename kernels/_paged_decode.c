/* Paged decode attention on the CPU, reading K/V blocks where they lie in the pool.
 *
 * One query token per sequence. A work item is (sequence, KV head, split of its keys): the
 * item's query group (the num_heads / kv_heads query heads that share the KV head) is
 * converted to float32 once, then the item walks its pool blocks through the block table
 * with an online softmax in float32, so each K and V row is read once per group and never
 * copied. A decode step has few items (batch × kv_heads), so when there are too few to keep
 * the threads busy a long sequence's keys are cut into splits, whose partial (max, sum,
 * accumulator) triples are merged at the end; otherwise the item writes its output directly.
 *
 * Threads: an OpenMP team of at most omp_get_max_threads() — the calling thread's ICV,
 * which torch.set_num_threads sets (kernels/threads.py pins it per engine thread). The
 * module links libgomp.so.1, the soname of the runtime torch ships and has already loaded
 * when this module is imported, so both share one runtime and one thread pool.
 *
 * Two item paths, both chosen at run time so that a shipped build never assumes the build
 * machine's CPU: on a CPU with AVX-512 BF16, bfloat16 calls with head_dim a multiple of 32
 * take _paged_decode_bf16.c (`vdpbf16ps` on the pool's rows in place, 16 keys per pass);
 * everything else takes the portable path below, plain C that GCC vectorises, compiled for
 * AVX-512, AVX2 and a portable default (target_clones). `path` 1 forces the portable one.
 *
 * The caller (kernels/cpu_paged/decode.py) has validated every argument: shapes, dtypes,
 * block ids inside the pool, lengths. This file trusts them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_paged_decode.h"

/* Scores are computed for at most this many keys at a time (a block is walked in chunks). */
#define CHUNK 32
/* Fewer keys than this per split are not worth a merge. */
#define MIN_SPLIT_TOKENS 256

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* exp(x) for x <= 0 in float32 (the softmax's arguments), written so that GCC vectorises
 * it: 2^n × p(r) with r = x − n ln 2, |r| <= ln2/2, p of degree 6 (relative error ~2e-7, as
 * libm's expf to float32 rounding); under −87 it is 0, as expf's underflow. */
static inline float exp_neg(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f,
                ln2_lo = -2.12194440e-4f;
    float xc = x < -87.0f ? -87.0f : x;
    float n = __builtin_floorf(xc * log2e + 0.5f);
    float r = xc - n * ln2_hi - n * ln2_lo;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < -87.0f ? 0.0f : p * scale;
}

/* Rows [0, n) of a chunk of keys (or values) as float32: the pool's own rows for float32,
 * else converted into `buf` once, so the loops over query rows below read plain floats. */
static inline __attribute__((always_inline)) const float *
chunk_rows(float *restrict buf, const void *pool, int64_t base, int64_t row, int64_t n,
           const int64_t D, const int bf16) {
    if (!bf16) return (const float *)pool + base; /* rows `row` apart */
    const uint16_t *src = (const uint16_t *)pool + base;
    for (int64_t i = 0; i < n; i++)
        for (int64_t d = 0; d < D; d++) buf[i * D + d] = bf16_to_f32(src[i * row + d]);
    return buf;
}

/* One item: query group (b, g) over keys [t0, t1) of its sequence. Writes the normalised
 * output, or (acc, max, sum) per query row into `part` when it is a split. D and the dtype
 * are constants where run_item calls this (always inlined), so the loops over head_dim are
 * unrolled and vectorised with no remainder. */
static inline __attribute__((always_inline)) void
item_impl(const job_t *j, int64_t b, int64_t g, int64_t t0, int64_t t1, float *part,
          const int64_t D, const int bf16) {
    const int64_t G = j->heads / j->kv_heads, bt = j->block_tokens;
    const int64_t row = j->kv_heads * D; /* elements between consecutive tokens */
    const int64_t stride = bf16 ? D : row; /* between rows of chunk_rows' result */
    float qf[MAX_GROUP][MAX_DIM], acc[MAX_GROUP][MAX_DIM];
    float m[MAX_GROUP], l[MAX_GROUP], s[MAX_GROUP][CHUNK];
    float buf[CHUNK * MAX_DIM];
    for (int64_t r = 0; r < G; r++) {
        const int64_t off = b * j->q_stride_b + (g * G + r) * j->q_stride_h;
        for (int64_t d = 0; d < D; d++) {
            float x = bf16 ? bf16_to_f32(((const uint16_t *)j->q)[off + d])
                           : ((const float *)j->q)[off + d];
            qf[r][d] = x * j->scale;
            acc[r][d] = 0.0f;
        }
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    const int64_t brow = b * j->table_stride;
    int64_t t = t0;
    while (t < t1) {
        int64_t blk = read_index(j->tables, brow + t / bt, j->index64);
        int64_t off = t % bt;
        int64_t n = bt - off;
        if (n > t1 - t) n = t1 - t;
        if (n > CHUNK) n = CHUNK;
        int64_t base = (blk * bt + off) * row + g * D; /* element offset of key t */
        const float *kr = chunk_rows(buf, j->k, base, row, n, D, bf16);
        for (int64_t r = 0; r < G; r++) {
            for (int64_t i = 0; i < n; i++) {
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < D; d++) dot += qf[r][d] * kr[i * stride + d];
                s[r][i] = dot;
            }
            float mx = m[r];
            for (int64_t i = 0; i < n; i++) mx = s[r][i] > mx ? s[r][i] : mx;
            float alpha = expf(m[r] - mx); /* m[r] = -inf the first time: alpha 0 */
            l[r] *= alpha;
            for (int64_t d = 0; d < D; d++) acc[r][d] *= alpha;
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < n; i++) {
                s[r][i] = exp_neg(s[r][i] - mx);
                sum += s[r][i];
            }
            l[r] += sum;
            m[r] = mx;
        }
        const float *vr = chunk_rows(buf, j->v, base, row, n, D, bf16);
        for (int64_t r = 0; r < G; r++)
            for (int64_t i = 0; i < n; i++) {
                const float p = s[r][i];
#pragma omp simd
                for (int64_t d = 0; d < D; d++) acc[r][d] += p * vr[i * stride + d];
            }
        t += n;
    }
    for (int64_t r = 0; r < G; r++)
        write_row(j, b, g * G + r, acc[r], m[r], l[r], part ? part + r * (D + 2) : NULL);
}

/* The item for this CPU (target_clones), with the common head dims (64, 128, 256) as
 * constants. */
CLONES static void run_item(const job_t *j, int64_t b, int64_t g, int64_t t0, int64_t t1,
                            float *part) {
    const int bf16 = j->dtype == DT_BF16;
    switch (j->dim) {
    case 64:
        if (bf16) item_impl(j, b, g, t0, t1, part, 64, 1);
        else item_impl(j, b, g, t0, t1, part, 64, 0);
        return;
    case 128:
        if (bf16) item_impl(j, b, g, t0, t1, part, 128, 1);
        else item_impl(j, b, g, t0, t1, part, 128, 0);
        return;
    case 256: /* Gemma 3 */
        if (bf16) item_impl(j, b, g, t0, t1, part, 256, 1);
        else item_impl(j, b, g, t0, t1, part, 256, 0);
        return;
    default:
        if (bf16) item_impl(j, b, g, t0, t1, part, j->dim, 1);
        else item_impl(j, b, g, t0, t1, part, j->dim, 0);
    }
}

/* Item `it` = ((b × kv_heads + g) × splits + sp): split sp of sequence b's visible keys. */
static void run_split(const job_t *j, int64_t it) {
    int64_t sp = it % j->splits, bg = it / j->splits;
    int64_t b = bg / j->kv_heads, g = bg % j->kv_heads;
    int64_t lo, hi;
    key_range(j, b, &lo, &hi);
    int64_t n = hi > lo ? hi - lo : 0;
    int64_t per = (n + j->splits - 1) / j->splits;
    int64_t t0 = lo + sp * per, t1 = t0 + per;
    if (t1 > hi) t1 = hi;
    if (t0 > t1) t0 = t1;
    float *part = j->partial
        ? j->partial + it * (j->heads / j->kv_heads) * (j->dim + 2) : NULL;
    if (j->fast) pd_item_bf16(j, b, g, t0, t1, part);
    else run_item(j, b, g, t0, t1, part);
}

/* Merge the splits of item group bg into the output through their maxima and sums. */
static void merge_group(const job_t *j, int64_t bg) {
    const int64_t D = j->dim, G = j->heads / j->kv_heads, S = j->splits;
    int64_t b = bg / j->kv_heads, g = bg % j->kv_heads;
    for (int64_t r = 0; r < G; r++) {
        float mx = -INFINITY;
        for (int64_t sp = 0; sp < S; sp++) {
            float ms = j->partial[((bg * S + sp) * G + r) * (D + 2) + D];
            mx = ms > mx ? ms : mx;
        }
        float acc[MAX_DIM] = {0}, l = 0.0f;
        for (int64_t sp = 0; sp < S; sp++) {
            const float *p = j->partial + ((bg * S + sp) * G + r) * (D + 2);
            if (p[D + 1] == 0.0f) continue; /* an empty split */
            float w = expf(p[D] - mx);
            l += w * p[D + 1];
            for (int64_t d = 0; d < D; d++) acc[d] += w * p[d];
        }
        write_row(j, b, g * G + r, acc, mx, l, NULL);
    }
}

/* How many splits per (sequence, KV head): one when the items already outnumber the
 * threads enough to balance, else enough to give each thread ~4 items, but never splits
 * shorter than MIN_SPLIT_TOKENS keys of the longest sequence. */
static int64_t choose_splits(const job_t *j, int threads) {
    int64_t items = j->batch * j->kv_heads;
    if (threads <= 1 || items >= 4 * (int64_t)threads) return 1;
    int64_t longest = 0;
    for (int64_t b = 0; b < j->batch; b++) {
        int64_t lo, hi;
        key_range(j, b, &lo, &hi);
        if (hi - lo > longest) longest = hi - lo;
    }
    int64_t want = (4 * (int64_t)threads + items - 1) / items;
    int64_t most = longest / MIN_SPLIT_TOKENS;
    if (want > most) want = most;
    return want < 1 ? 1 : want;
}

/* Whether bfloat16 calls with this head_dim may take the AVX-512 BF16 item path here. */
static int use_bf16_path(int dtype, int64_t dim) {
    return dtype == DT_BF16 && dim % 32 == 0 && pd_bf16_path_built()
#if defined(__x86_64__) && defined(__GNUC__)
           && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw")
#endif
        ;
}

static PyObject *py_paged_decode(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long out, q, k, v, tables, lens, kv_start;
    long long qsb, qsh, tstride, batch, heads, kv_heads, dim, bt, window, splits_forced;
    int dtype, index64, threads, path;
    double scale;
    if (!PyArg_ParseTuple(args, "KKKKKKKLLLLLLLLLiidiLi", &out, &q, &k, &v, &tables, &lens,
                          &kv_start, &qsb, &qsh, &tstride, &batch, &heads, &kv_heads, &dim,
                          &bt, &window, &dtype, &index64, &scale, &threads, &splits_forced,
                          &path))
        return NULL;
    if (heads <= 0 || kv_heads <= 0 || heads % kv_heads || heads / kv_heads > MAX_GROUP ||
        dim <= 0 || dim > MAX_DIM || bt <= 0 || batch < 0 || (dtype != DT_F32 && dtype != DT_BF16)) {
        PyErr_SetString(PyExc_ValueError, "paged_decode: unsupported shape or dtype");
        return NULL;
    }
    job_t j = {
        .q = (const void *)(uintptr_t)q, .k = (const void *)(uintptr_t)k,
        .v = (const void *)(uintptr_t)v, .out = (void *)(uintptr_t)out,
        .tables = (const void *)(uintptr_t)tables, .lens = (const void *)(uintptr_t)lens,
        .kv_start = (const void *)(uintptr_t)kv_start, .partial = NULL,
        .q_stride_b = qsb, .q_stride_h = qsh, .table_stride = tstride, .batch = batch,
        .heads = heads, .kv_heads = kv_heads, .dim = dim, .block_tokens = bt,
        .window = window, .splits = 1, .dtype = dtype, .index64 = index64,
        .scale = (float)scale,
        /* path: 0 the best this CPU runs, 1 the portable path (tests cover both). */
        .fast = path == 0 && use_bf16_path(dtype, dim),
    };
    if (threads <= 0) threads = omp_get_max_threads();
    j.splits = splits_forced > 0 ? splits_forced : choose_splits(&j, threads);
    int64_t groups = batch * kv_heads, items = groups * j.splits;
    if (items == 0) return PyBool_FromLong(j.fast);
    if (j.splits > 1) {
        j.partial = malloc((size_t)items * (size_t)(heads / kv_heads) * (size_t)(dim + 2)
                           * sizeof(float));
        if (!j.partial) return PyErr_NoMemory();
    }
    int team = items < threads ? (int)items : threads;
    Py_BEGIN_ALLOW_THREADS
    if (team <= 1) {
        for (int64_t it = 0; it < items; it++) run_split(&j, it);
        if (j.splits > 1)
            for (int64_t bg = 0; bg < groups; bg++) merge_group(&j, bg);
    } else {
#pragma omp parallel num_threads(team)
        {
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < items; it++) run_split(&j, it);
            if (j.splits > 1) {
#pragma omp for schedule(static)
                for (int64_t bg = 0; bg < groups; bg++) merge_group(&j, bg);
            }
        }
    }
    Py_END_ALLOW_THREADS
    free(j.partial);
    return PyBool_FromLong(j.fast);
}

static PyObject *py_bf16_path(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyBool_FromLong(use_bf16_path(DT_BF16, 64));
}

static PyObject *py_limits(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return Py_BuildValue("{s:i,s:i}", "max_group", MAX_GROUP, "max_head_dim", MAX_DIM);
}

static PyMethodDef methods[] = {
    {"paged_decode", py_paged_decode, METH_VARARGS,
     "paged_decode(out, q, k_pool, v_pool, tables, lens, kv_start, q_stride_b, q_stride_h, "
     "table_stride, batch, heads, kv_heads, head_dim, block_tokens, window, dtype, index64, "
     "scale, threads, splits, path) on raw data pointers (path 0: the best this CPU runs, "
     "1: the portable one); returns whether the AVX-512 BF16 path ran. See "
     "kernels/cpu_paged/decode.py."},
    {"bf16_path", py_bf16_path, METH_NOARGS,
     "Whether bfloat16 calls (head_dim a multiple of 32) take the AVX-512 BF16 path here."},
    {"limits", py_limits, METH_NOARGS, "The largest query group and head_dim supported."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_paged_decode",
    "CPU paged decode attention over a KV pool (kernels/cpu_paged).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__paged_decode(void) { return PyModule_Create(&module); }
