/* bf16 skinny GEMM on the CPU: y = x @ W.T (+ b) for a weight packed once, read once per call.
 *
 * Decode multiplies a few rows by every weight of the model, so a step's linears are bound by
 * how fast the weights stream from DRAM. The weight is packed (kernels/gemv.py, at prepare) in
 * blocks of 16 output columns, each block contiguous and K-pair interleaved:
 *
 *     packed[block][k / 2][column][k % 2]   (bf16; columns and K zero-padded)
 *
 * so that one 64-byte load is one operand of one _mm512_dpbf16_ps (16 lanes, each the pair of
 * weights of one column) and a block is one sequential stream. A thread owns a contiguous
 * range of blocks (a static split: each thread streams its own slice); it walks its range in
 * tiles of up to 8 blocks side by side and, per tile, its rows in groups: rows × blocks ≤ 24
 * zmm accumulators, one load per block and one broadcast of each row's x pair per K pair
 * (plan()). Up to 8 rows (decode) are one group, so the tile streams from DRAM once into all
 * of them; 9–16 rows are two groups that take turns over each 64-pair K chunk of the tile
 * while it is in L1; a prefill's many rows go in groups of 4 over the tile re-read from L2,
 * so it too reads W from DRAM once. The lines ahead are prefetched into L2, 128 per thread.
 *
 * Numerics: float32 accumulation, one accumulator per (row, column) walked over K in order (a
 * running sum leaves its register between K chunks only as an exact float32 copy), so a row's
 * result depends on neither the other rows nor the thread count (batch-invariant);
 * then the bias (float32), then bfloat16 by round-to-nearest-even.
 *
 * CPU-specific code only through target attributes: the AVX512-BF16 path is chosen at run
 * time (__builtin_cpu_supports), else a portable C path over the same layout that GCC
 * vectorises per target_clones. Never -march=native in the build.
 *
 * Threads: an OpenMP team of the calling thread's omp_get_max_threads() (the ICV that
 * torch.set_num_threads sets; kernels/threads.py pins it). The module links libgomp.so.1, the
 * runtime torch has loaded, as kernels/_paged_decode.c does. The GIL is released.
 *
 * The caller (kernels/gemv.py) checked shapes, dtypes and the packed layout; this file trusts
 * the pointers it is given.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_bf16.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define HAVE_FAST 1
#define FAST __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HAVE_FAST 0
#define CLONES
#endif

#define BLOCK 16        /* output columns per packed block (one zmm of float32) */
#define ACCUMULATORS 24 /* rows × blocks of a tile: zmm float32 sums (24 of 32 registers) */
#define GROUP_ROWS 8    /* the most rows in one pass over a tile */
#define MAX_BLOCKS 8    /* the most blocks (weight streams) side by side */
#define PREFILL_ROWS 4  /* rows per group beyond SHARED_ROWS (a prefill): 4 × 6 blocks */
#define SHARED_ROWS 16  /* up to this many rows, row groups share each K chunk from L1 */
#ifndef CHUNK_PAIRS
#define CHUNK_PAIRS 64  /* K pairs per chunk when they do: ≤ 4 blocks × 4 KiB of tile */
#endif
/* Software prefetch: lines requested ahead of the tile, over all its blocks' streams (each
 * block's stream PREFETCH_LINES / blocks pairs ahead), into L2 (T1). What a thread has in
 * flight bounds its DRAM rate (Little's law: bytes in flight / latency), so the total is the
 * same whatever the tile's width; into L1 (T0) that many lines would overrun its miss buffers
 * and evict the tile (measured at 1–16 rows against the former 16 lines per stream into L1:
 * T0 at 128 lines 0.88–1.05x the time, T1 0.76–0.80x; none at all 0.78x at 1 row, but
 * 0.94–0.97x at 8–16; bench/RESULTS.md). Build-time knobs for measuring. */
#ifndef PREFETCH_LINES
#define PREFETCH_LINES 128
#endif
#ifndef PREFETCH_HINT
#define PREFETCH_HINT _MM_HINT_T1
#endif

typedef struct {
    const uint16_t *w;    /* packed [nb][kp][16][2] */
    const uint32_t *x;    /* x as K pairs: row r at x + r * xs, kp pairs (K zero-padded) */
    const uint16_t *bias; /* [n] or NULL */
    uint16_t *out;        /* [m][out_stride] */
    int64_t m, n, kp, nb, xs, out_stride;
} gemv_t;

/* How run_range walks a thread's blocks: tiles of `blocks` blocks; per tile, K in chunks of
 * `chunk` pairs; per chunk, the rows in groups of `group`. One chunk (the whole K) unless
 * several groups of a decode-sized batch share each chunk of the tile while it is in L1,
 * their running sums kept in a small scratch between chunks (exact float32 values: the order
 * of each sum is unchanged). */
typedef struct {
    int group, blocks;
    int64_t chunk;
} plan_t;


/* ---- portable path: one (block, row) at a time, the same sums in the same order ---- */

CLONES static void block_row_portable(const gemv_t *g, int64_t blk, int64_t row) {
    float acc[BLOCK] = {0};
    const uint16_t *w = g->w + blk * g->kp * (2 * BLOCK);
    const uint32_t *x = g->x + row * g->xs;
    for (int64_t k = 0; k < g->kp; k++) {
        float x0 = bf16_to_f32((uint16_t)(x[k] & 0xffffu));
        float x1 = bf16_to_f32((uint16_t)(x[k] >> 16));
        const uint16_t *wk = w + k * (2 * BLOCK);
        /* The odd element first, as vdpbf16ps adds them (Intel's pseudo-code; measured on
         * this AMD CPU too): the even one first differs in ~1 of 10^4 outputs. The products
         * of two bf16 are exact in float32, so a contracted FMA changes nothing. */
        for (int c = 0; c < BLOCK; c++)
            acc[c] = (acc[c] + bf16_to_f32(wk[2 * c + 1]) * x1) + bf16_to_f32(wk[2 * c]) * x0;
    }
    int64_t col0 = blk * BLOCK;
    int64_t cols = g->n - col0 < BLOCK ? g->n - col0 : BLOCK;
    uint16_t *out = g->out + row * g->out_stride + col0;
    for (int64_t c = 0; c < cols; c++) {
        float v = acc[c] + (g->bias ? bf16_to_f32(g->bias[col0 + c]) : 0.0f);
        out[c] = f32_to_bf16(v);
    }
}

static void tile_portable(const gemv_t *g, int64_t b0, int nbk, int64_t r0, int rows) {
    for (int b = 0; b < nbk; b++)
        for (int r = 0; r < rows; r++) block_row_portable(g, b0 + b, r0 + r);
}

/* ---- AVX512-BF16 path ---- */

#if HAVE_FAST
/* K pairs [k0, k1) of rows [r0, r0 + rows) × blocks [b0, b0 + nbk): the sums start at zero
 * (k0 = 0) or from `spill`, and end in the output (k1 = kp) or back in `spill`
 * ([SHARED_ROWS][MAX_BLOCKS][16] floats, indexed by row). `prefetch`: this pass is the first
 * over the chunk, so it asks for the lines ahead (later passes read them from L1). */
static inline __attribute__((always_inline)) FAST void
tile_fast(const gemv_t *g, int64_t b0, const int nbk, int64_t r0, const int rows, int64_t k0,
          int64_t k1, float *spill, int prefetch) {
    __m512 acc[GROUP_ROWS][MAX_BLOCKS]; /* only rows × nbk ≤ 24 of them live */
    const int64_t bstride = g->kp * (2 * BLOCK);
    const uint16_t *w = g->w + b0 * bstride;
    const uint32_t *x = g->x + r0 * g->xs;
    const int64_t ahead = (PREFETCH_LINES / nbk) * (2 * BLOCK);
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 8
        for (int b = 0; b < nbk; b++)
            acc[r][b] = k0 == 0 ? _mm512_setzero_ps()
                                : _mm512_load_ps(spill + ((r0 + r) * MAX_BLOCKS + b) * BLOCK);
    for (int64_t k = k0; k < k1; k++) {
        __m512bh wv[MAX_BLOCKS];
#pragma GCC unroll 8
        for (int b = 0; b < nbk; b++) {
            const uint16_t *p = w + b * bstride + k * (2 * BLOCK);
            wv[b] = (__m512bh)_mm512_loadu_si512((const void *)p);
            /* Past the end is harmless: a prefetch never faults. */
            if (prefetch) _mm_prefetch((const char *)(p + ahead), PREFETCH_HINT);
        }
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)x[r * g->xs + k]);
#pragma GCC unroll 8
            for (int b = 0; b < nbk; b++) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], wv[b], xv);
        }
    }
    if (k1 < g->kp) {
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++)
#pragma GCC unroll 8
            for (int b = 0; b < nbk; b++)
                _mm512_store_ps(spill + ((r0 + r) * MAX_BLOCKS + b) * BLOCK, acc[r][b]);
        return;
    }
#pragma GCC unroll 8
    for (int b = 0; b < nbk; b++) {
        int64_t col0 = (b0 + b) * BLOCK;
        int64_t cols = g->n - col0 < BLOCK ? g->n - col0 : BLOCK;
        __mmask16 mask = (__mmask16)((1u << cols) - 1u);
        __m512 bias = _mm512_setzero_ps();
        if (g->bias) {
            __m256i raw = _mm256_maskz_loadu_epi16(mask, (const void *)(g->bias + col0));
            bias = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
        }
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            __m256bh y = _mm512_cvtneps_pbh(_mm512_add_ps(acc[r][b], bias));
            _mm256_mask_storeu_epi16((void *)(g->out + (r0 + r) * g->out_stride + col0), mask,
                                     (__m256i)y);
        }
    }
}

#define C(R, B) \
    case (R) * 16 + (B): tile_fast(g, b0, (B), r0, (R), k0, k1, spill, prefetch); break;
#define UPTO3(R) C(R, 1) C(R, 2) C(R, 3)
#define UPTO4(R) UPTO3(R) C(R, 4)
#define UPTO6(R) UPTO4(R) C(R, 5) C(R, 6)
#define UPTO8(R) UPTO6(R) C(R, 7) C(R, 8)

/* Every (rows, blocks) shape plan() hands out: rows ≤ 8, rows × blocks ≤ 24, blocks ≤ 8. */
static FAST void tile_fast_any(const gemv_t *g, int64_t b0, int nbk, int64_t r0, int rows,
                               int64_t k0, int64_t k1, float *spill, int prefetch) {
    switch (rows * 16 + nbk) {
        UPTO8(1) UPTO8(2) UPTO8(3) UPTO6(4) UPTO4(5) UPTO4(6) UPTO3(7) UPTO3(8)
        default: tile_portable(g, b0, nbk, r0, rows); /* plan() hands out none of these */
    }
}
#undef C
#endif

static int cpu_has_fast(void) {
#if HAVE_FAST
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

/* Decode's ≤ 8 rows go in one group, so each weight line streams from DRAM once into all its
 * rows; 9–16 rows in two groups that share each K chunk of the tile from L1 (one group of 16
 * would need a broadcast of x per vdpbf16ps: 16 rows × 1 block); more rows (a prefill) in
 * groups of 4 over the whole K, the tile re-read from L2 (4 × 6 measured 0.98x the time of
 * the former 4 × 4 at 512 rows, 8 × 3 1.03x). As many blocks side by side as 24 accumulators
 * allow: the fewer broadcasts and loads per vdpbf16ps, the closer a core gets to one a cycle
 * (16 rows from L2: 3.2 G/s per CPU-second, the former 16 × 1 tile 2.8). */
static plan_t plan(int64_t m, int64_t kp, int fast) {
    plan_t p;
    p.group = m <= GROUP_ROWS ? (int)m : m <= SHARED_ROWS ? (int)((m + 1) / 2) : PREFILL_ROWS;
    p.blocks = ACCUMULATORS / p.group < MAX_BLOCKS ? ACCUMULATORS / p.group : MAX_BLOCKS;
    p.chunk = fast && m > GROUP_ROWS && m <= SHARED_ROWS ? CHUNK_PAIRS : kp;
    return p;
}

/* Blocks [lo, hi) for every row, in tiles × K chunks × row groups. */
static void run_range(const gemv_t *g, int64_t lo, int64_t hi, int fast) {
    plan_t p = plan(g->m, g->kp, fast);
#if HAVE_FAST
    float spill[SHARED_ROWS * MAX_BLOCKS * BLOCK] __attribute__((aligned(64)));
#endif
    for (int64_t b0 = lo; b0 < hi; b0 += p.blocks) {
        int nbk = hi - b0 < p.blocks ? (int)(hi - b0) : p.blocks;
        for (int64_t k0 = 0; k0 < g->kp; k0 += p.chunk) {
            int64_t k1 = g->kp - k0 < p.chunk ? g->kp : k0 + p.chunk;
            for (int64_t r0 = 0; r0 < g->m; r0 += p.group) {
                int rows = g->m - r0 < p.group ? (int)(g->m - r0) : p.group;
#if HAVE_FAST
                if (fast) {
                    tile_fast_any(g, b0, nbk, r0, rows, k0, k1, spill, r0 == 0);
                    continue;
                }
#endif
                (void)fast;
                tile_portable(g, b0, nbk, r0, rows);
            }
        }
    }
}

static PyObject *py_linear(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long out, x, w, bias;
    long long m, n, k, x_rs, x_cs, threads;
    int portable;
    if (!PyArg_ParseTuple(args, "KKKKLLLLLLp", &out, &x, &w, &bias, &m, &n, &k, &x_rs, &x_cs,
                          &threads, &portable))
        return NULL;
    if (m < 0 || n <= 0 || k <= 0) {
        PyErr_SetString(PyExc_ValueError, "gemv.linear: needs m >= 0, n > 0, k > 0");
        return NULL;
    }
    int fast = !portable && cpu_has_fast();
    int64_t kp = (k + 1) / 2;
    gemv_t g = {
        .w = (const uint16_t *)(uintptr_t)w, .bias = (const uint16_t *)(uintptr_t)bias,
        .out = (uint16_t *)(uintptr_t)out, .m = m, .n = n, .kp = kp,
        .nb = (n + BLOCK - 1) / BLOCK, .xs = 0, .out_stride = n,
    };
    if (m == 0) Py_RETURN_NONE;
    const uint16_t *xp = (const uint16_t *)(uintptr_t)x;
    uint32_t *staged = NULL;
    /* x is read as 4-byte K pairs: used in place when its rows are contiguous, even-length
     * and 4-byte aligned, else copied (zero-padded) into pairs: at most a few KB in decode. */
    if (x_cs == 1 && k % 2 == 0 && x_rs % 2 == 0 && (x & 3u) == 0) {
        g.x = (const uint32_t *)xp;
        g.xs = x_rs / 2;
    } else {
        staged = calloc((size_t)m * (size_t)kp, sizeof(uint32_t));
        if (!staged) return PyErr_NoMemory();
        for (int64_t r = 0; r < m; r++) {
            uint16_t *dst = (uint16_t *)(staged + r * kp);
            for (int64_t c = 0; c < k; c++) dst[c] = xp[r * x_rs + c * x_cs];
        }
        g.x = staged;
        g.xs = kp;
    }
    if (threads <= 0) threads = omp_get_max_threads();
    if (threads > g.nb) threads = g.nb;
    Py_BEGIN_ALLOW_THREADS
    if (threads <= 1) {
        run_range(&g, 0, g.nb, fast);
    } else {
#pragma omp parallel num_threads((int)threads)
        {
            int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
            run_range(&g, g.nb * t / team, g.nb * (t + 1) / team, fast);
        }
    }
    Py_END_ALLOW_THREADS
    free(staged);
    Py_RETURN_NONE;
}

static PyObject *py_has_fast(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyBool_FromLong(cpu_has_fast());
}

static PyObject *py_layout(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return Py_BuildValue("{s:i,s:i,s:i}", "block_columns", BLOCK, "accumulators", ACCUMULATORS,
                         "group_rows", GROUP_ROWS);
}

static PyMethodDef methods[] = {
    {"linear", py_linear, METH_VARARGS,
     "linear(out, x, packed_w, bias, m, n, k, x_row_stride, x_col_stride, threads, portable) "
     "on raw data pointers (bf16); see kernels/gemv.py."},
    {"has_fast", py_has_fast, METH_NOARGS, "Whether this CPU runs the AVX512-BF16 path."},
    {"layout", py_layout, METH_NOARGS, "The packed layout's constants."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_gemv",
    "bf16 skinny GEMM over a weight packed in 16-column K-pair blocks (kernels/gemv.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__gemv(void) { return PyModule_Create(&module); }
