/* Fused per-row CPU ops for a decode step: everything in a layer that is not a matmul or
 * the attention kernel (kernels/fused.py wraps them; the torch forms there define the
 * numbers).
 *
 * - rms_norm: optionally h = residual + x first (one bfloat16 rounding, as torch's add),
 *   then RMSNorm of h in float32, in Llama's form (x̂ rounded to the dtype, then times
 *   the weight) or Gemma's ((1 + w) · x̂ in float32, rounded once);
 * - rope_write: per token, q's and k's heads (optionally RMS-normalised per head first, as
 *   Qwen3 / Gemma 3) rotated by the token's cos/sin as `x·cos + rotate_half(x)·sin` with
 *   torch's three bfloat16 roundings; q into `q_out`, k and v straight into the pool rows of
 *   the token's slot (a negative slot: not written);
 * - gated_act: act(gate) · up with act SiLU or gelu-tanh, each rounded as torch's two ops.
 *
 * Every op is row-wise: a row's result never depends on the other rows (batch-invariant).
 * Rounding to bfloat16 is round-to-nearest-even, as torch; the elementwise ops give torch's
 * bits. What can differ, by one bfloat16 step now and then: the norm's sum of squares (a
 * different summation order) and exp/tanh (a polynomial, not Sleef's), both float32-level.
 *
 * Threads: rows go to an OpenMP team only when a call has enough elements to pay for the
 * fork (PAR_MIN_ELEMS); a decode step's 1-8 rows run on the calling thread. The module links
 * libgomp.so.1, the runtime torch has already loaded (as kernels/_paged_decode.c). The GIL
 * is released while a call runs. CPU-specific code only via target_clones (AVX-512, AVX2,
 * a portable default), chosen at load time.
 *
 * The caller (kernels/fused.py) has checked dtypes, shapes, contiguity and slots; this file
 * trusts them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

enum { DT_F32 = 0, DT_BF16 = 1 };

/* A row is processed in chunks of this many floats (stack buffers). */
#define CH 512
/* The largest head_dim rope_write takes (one head is one chunk). */
#define MAX_HEAD_DIM 512
/* Calls with fewer elements than this run on the calling thread (see kernels/README.md). */
static int64_t par_min_elems = 1 << 16;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif
#define INLINE static inline __attribute__((always_inline))

INLINE float bf2f(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch's float32 -> bfloat16 (NaN kept a NaN). */
INLINE uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? ((u >> 16) | 0x40u) : r);
}

/* f rounded to the storage dtype and back (identity for float32). */
INLINE float rnd(float f, int bf16) { return bf16 ? bf2f(f2bf(f)) : f; }

INLINE void load(float *dst, const void *src, int64_t off, int64_t n, int bf16) {
    if (bf16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++) dst[i] = bf2f(s[i]);
    } else {
        memcpy(dst, (const float *)src + off, (size_t)n * sizeof(float));
    }
}

INLINE void store(void *dst, int64_t off, const float *src, int64_t n, int bf16) {
    if (bf16) {
        uint16_t *d = (uint16_t *)dst + off;
        for (int64_t i = 0; i < n; i++) d[i] = f2bf(src[i]);
    } else {
        memcpy((float *)dst + off, src, (size_t)n * sizeof(float));
    }
}

INLINE void copy_elems(void *dst, int64_t doff, const void *src, int64_t soff, int64_t n,
                       int bf16) {
    size_t es = bf16 ? 2 : 4;
    memcpy((char *)dst + doff * es, (const char *)src + soff * es, (size_t)n * es);
}

/* exp(x) in float32 for the activations: 2^n × p(r), r = x − n ln 2, |r| <= ln2/2, p of
 * degree 6 (relative error ~2e-7), clamped to [−87, 88] so that it never overflows; a
 * branch-free form GCC vectorises (the clamps become blends only under -fno-trapping-math,
 * which changes no result: nothing here reads the FP exception flags). */
INLINE float exp_f(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f,
                ln2_lo = -2.12194440e-4f;
    float xc = x < -87.0f ? -87.0f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    float n = __builtin_floorf(xc * log2e + 0.5f);
    float r = xc - n * ln2_hi - n * ln2_lo;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* n is in [−126, 127] after the clamps: 2^n is a normal float. */
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* ------------------------------------------------------------------ residual add + RMSNorm */

typedef struct {
    void *out, *res_out;
    const void *x, *res, *w;
    int64_t rows, cols, x_stride, res_stride; /* strides in elements */
    float eps;
    int one_plus, bf16;
} norm_job;

INLINE void norm_row_impl(const norm_job *j, int64_t r, int bf16) {
    float buf[CH], wb[CH];
    const int64_t n = j->cols;
    float acc = 0.0f;
    /* Pass 1: h = x (+ residual, rounded as torch's add), kept in res_out; sum of squares. */
    for (int64_t c = 0; c < n; c += CH) {
        int64_t m = n - c < CH ? n - c : CH;
        load(buf, j->x, r * j->x_stride + c, m, bf16);
        if (j->res) {
            load(wb, j->res, r * j->res_stride + c, m, bf16);
            for (int64_t i = 0; i < m; i++) buf[i] = rnd(buf[i] + wb[i], bf16);
            store(j->res_out, r * n + c, buf, m, bf16);
        }
        float part = 0.0f;
#pragma omp simd reduction(+ : part)
        for (int64_t i = 0; i < m; i++) part += buf[i] * buf[i];
        acc += part;
    }
    const float rs = 1.0f / sqrtf(acc / (float)n + j->eps);
    const void *h = j->res ? j->res_out : j->x;
    const int64_t h_off = j->res ? r * n : r * j->x_stride;
    /* Pass 2: the scaled row. */
    for (int64_t c = 0; c < n; c += CH) {
        int64_t m = n - c < CH ? n - c : CH;
        load(buf, h, h_off + c, m, bf16);
        load(wb, j->w, c, m, bf16);
        if (j->one_plus) {
            for (int64_t i = 0; i < m; i++) buf[i] = (buf[i] * rs) * (1.0f + wb[i]);
        } else {
            for (int64_t i = 0; i < m; i++) buf[i] = wb[i] * rnd(buf[i] * rs, bf16);
        }
        store(j->out, r * n + c, buf, m, bf16);
    }
}

CLONES static void norm_rows(const norm_job *j, int64_t lo, int64_t hi) {
    if (j->bf16) {
        for (int64_t r = lo; r < hi; r++) norm_row_impl(j, r, 1);
    } else {
        for (int64_t r = lo; r < hi; r++) norm_row_impl(j, r, 0);
    }
}

/* ------------------------------------------------------------------ RoPE + KV slot write */

typedef struct {
    void *q_out, *k_pool, *v_pool;
    const void *qkv, *cos, *sin, *slots, *q_w, *k_w; /* q_w / k_w NULL: no per-head norm */
    int64_t tokens, qkv_stride, cos_stride, heads, kv_heads, dim;
    float eps;
    int one_plus, bf16;
} rope_job;

/* One head, in place in `x` (float32 values of the dtype): per-head RMSNorm (as
 * norm_row_impl without residual) when `w`, then the rotation. */
INLINE void rope_head(float *x, const float *c, const float *s, const void *w, int64_t d,
                      float eps, int one_plus, int bf16) {
    float tmp[MAX_HEAD_DIM];
    if (w) {
        float wb[MAX_HEAD_DIM];
        load(wb, w, 0, d, bf16);
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = 0; i < d; i++) acc += x[i] * x[i];
        const float rs = 1.0f / sqrtf(acc / (float)d + eps);
        if (one_plus) {
            for (int64_t i = 0; i < d; i++) x[i] = rnd((x[i] * rs) * (1.0f + wb[i]), bf16);
        } else {
            for (int64_t i = 0; i < d; i++) x[i] = rnd(wb[i] * rnd(x[i] * rs, bf16), bf16);
        }
    }
    const int64_t half = d / 2;
    /* torch: x·cos, rotate_half(x)·sin = cat(−x2, x1)·sin, their sum: each rounded. */
    for (int64_t i = 0; i < half; i++)
        tmp[i] = rnd(rnd(x[i] * c[i], bf16) + rnd(-x[i + half] * s[i], bf16), bf16);
    for (int64_t i = half; i < d; i++)
        tmp[i] = rnd(rnd(x[i] * c[i], bf16) + rnd(x[i - half] * s[i], bf16), bf16);
    memcpy(x, tmp, (size_t)d * sizeof(float));
}

INLINE void rope_token_impl(const rope_job *j, int64_t t, int bf16) {
    float c[MAX_HEAD_DIM], s[MAX_HEAD_DIM], x[MAX_HEAD_DIM];
    const int64_t d = j->dim, base = t * j->qkv_stride;
    load(c, j->cos, t * j->cos_stride, d, bf16);
    load(s, j->sin, t * j->cos_stride, d, bf16);
    for (int64_t h = 0; h < j->heads; h++) {
        load(x, j->qkv, base + h * d, d, bf16);
        rope_head(x, c, s, j->q_w, d, j->eps, j->one_plus, bf16);
        store(j->q_out, (t * j->heads + h) * d, x, d, bf16);
    }
    const int64_t slot = ((const int64_t *)j->slots)[t];
    if (slot < 0) return;
    const int64_t row = slot * j->kv_heads * d, k0 = base + j->heads * d,
                  v0 = k0 + j->kv_heads * d;
    for (int64_t h = 0; h < j->kv_heads; h++) {
        load(x, j->qkv, k0 + h * d, d, bf16);
        rope_head(x, c, s, j->k_w, d, j->eps, j->one_plus, bf16);
        store(j->k_pool, row + h * d, x, d, bf16);
    }
    copy_elems(j->v_pool, row, j->qkv, v0, j->kv_heads * d, bf16);
}

CLONES static void rope_tokens(const rope_job *j, int64_t lo, int64_t hi) {
    if (j->bf16) {
        for (int64_t t = lo; t < hi; t++) rope_token_impl(j, t, 1);
    } else {
        for (int64_t t = lo; t < hi; t++) rope_token_impl(j, t, 0);
    }
}

/* ------------------------------------------------------------------ act(gate) · up */

typedef struct {
    void *out;
    const void *gu; /* [rows, 2 * inter] with the stride below: gate's columns, then up's */
    int64_t rows, inter, stride;
    int gelu, bf16;
} act_job;

INLINE float silu_f(float g) { return g / (1.0f + exp_f(-g)); }

/* transformers' gelu_pytorch_tanh in torch's form, 0.5·g·(1 + tanh(u)) with
 * u = √(2/π)·(g + 0.044715·g³), so that its float32 cancellation for very negative g (where
 * 1 + tanh(u) rounds to 0) is torch's too; tanh(|u|) = (1 − t) / (1 + t), t = exp(−2|u|),
 * within ~2 float32 ulps near ±1, where the sum with 1 is most sensitive. */
INLINE float gelu_tanh_f(float g) {
    const float beta = 0.7978845608028654f, kappa = 0.044715f;
    float inner = beta * (g + kappa * g * g * g);
    float a = inner < 0.0f ? -inner : inner;
    float t = exp_f(-2.0f * a);
    float th = (1.0f - t) / (1.0f + t);
    th = inner < 0.0f ? -th : th;
    return 0.5f * g * (1.0f + th);
}

INLINE void act_row_impl(const act_job *j, int64_t r, int bf16, int gelu) {
    float g[CH], u[CH];
    const int64_t n = j->inter;
    for (int64_t c = 0; c < n; c += CH) {
        int64_t m = n - c < CH ? n - c : CH;
        load(g, j->gu, r * j->stride + c, m, bf16);
        load(u, j->gu, r * j->stride + n + c, m, bf16);
        if (gelu) {
            for (int64_t i = 0; i < m; i++) g[i] = rnd(rnd(gelu_tanh_f(g[i]), bf16) * u[i], bf16);
        } else {
            for (int64_t i = 0; i < m; i++) g[i] = rnd(rnd(silu_f(g[i]), bf16) * u[i], bf16);
        }
        store(j->out, r * n + c, g, m, bf16);
    }
}

CLONES static void act_rows(const act_job *j, int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; r++) {
        if (j->bf16) {
            if (j->gelu) act_row_impl(j, r, 1, 1); else act_row_impl(j, r, 1, 0);
        } else {
            if (j->gelu) act_row_impl(j, r, 0, 1); else act_row_impl(j, r, 0, 0);
        }
    }
}

/* ------------------------------------------------------------------ Python glue */

/* Rows [0, rows) through fn, on this thread or, when the call is large, an OpenMP team of
 * the calling thread's torch thread count (contiguous row ranges: each row's result is the
 * same either way). */
#define RUN_ROWS(fn, job, rows, elems)                                                  \
    do {                                                                                \
        int64_t rows_ = (rows);                                                         \
        int team_ = omp_get_max_threads();                                              \
        if ((elems) < par_min_elems || team_ <= 1 || rows_ < 2) {                       \
            fn(job, 0, rows_);                                                          \
        } else {                                                                        \
            if (team_ > rows_) team_ = (int)rows_;                                      \
            _Pragma("omp parallel num_threads(team_)") {                                \
                int64_t t_ = omp_get_thread_num(), n_ = omp_get_num_threads();          \
                fn(job, rows_ * t_ / n_, rows_ * (t_ + 1) / n_);                        \
            }                                                                           \
        }                                                                               \
    } while (0)

static int args_ll(PyObject *const *args, Py_ssize_t from, Py_ssize_t n, long long *dst) {
    for (Py_ssize_t i = 0; i < n; i++) {
        dst[i] = PyLong_AsLongLong(args[from + i]);
        if (dst[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

#define PTR(v) ((void *)(uintptr_t)(v))

/* rms_norm(out, res_out, x, res, w, rows, cols, x_stride, res_stride, bf16, one_plus, eps) */
static PyObject *py_rms_norm(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long long a[11];
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "rms_norm takes 12 arguments");
        return NULL;
    }
    if (args_ll(args, 0, 11, a)) return NULL;
    double eps = PyFloat_AsDouble(args[11]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    norm_job j = {.out = PTR(a[0]), .res_out = PTR(a[1]), .x = PTR(a[2]), .res = PTR(a[3]),
                  .w = PTR(a[4]), .rows = a[5], .cols = a[6], .x_stride = a[7],
                  .res_stride = a[8], .bf16 = (int)a[9], .one_plus = (int)a[10],
                  .eps = (float)eps};
    if (j.cols <= 0 || j.rows < 0) {
        PyErr_SetString(PyExc_ValueError, "rms_norm: bad shape");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    RUN_ROWS(norm_rows, &j, j.rows, j.rows * j.cols);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* rope_write(q_out, k_pool, v_pool, qkv, cos, sin, slots, q_w, k_w, tokens, qkv_stride,
 *            cos_stride, heads, kv_heads, dim, bf16, one_plus, eps) */
static PyObject *py_rope_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long long a[17];
    if (nargs != 18) {
        PyErr_SetString(PyExc_TypeError, "rope_write takes 18 arguments");
        return NULL;
    }
    if (args_ll(args, 0, 17, a)) return NULL;
    double eps = PyFloat_AsDouble(args[17]);
    if (eps == -1.0 && PyErr_Occurred()) return NULL;
    rope_job j = {.q_out = PTR(a[0]), .k_pool = PTR(a[1]), .v_pool = PTR(a[2]),
                  .qkv = PTR(a[3]), .cos = PTR(a[4]), .sin = PTR(a[5]), .slots = PTR(a[6]),
                  .q_w = PTR(a[7]), .k_w = PTR(a[8]), .tokens = a[9], .qkv_stride = a[10],
                  .cos_stride = a[11], .heads = a[12], .kv_heads = a[13], .dim = a[14],
                  .bf16 = (int)a[15], .one_plus = (int)a[16], .eps = (float)eps};
    if (j.dim <= 0 || j.dim > MAX_HEAD_DIM || j.dim % 2 || j.tokens < 0) {
        PyErr_SetString(PyExc_ValueError, "rope_write: bad shape");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    RUN_ROWS(rope_tokens, &j, j.tokens, j.tokens * (j.heads + 2 * j.kv_heads) * j.dim);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* gated_act(out, gate_up, rows, inter, stride, bf16, gelu) */
static PyObject *py_gated_act(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    long long a[7];
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "gated_act takes 7 arguments");
        return NULL;
    }
    if (args_ll(args, 0, 7, a)) return NULL;
    act_job j = {.out = PTR(a[0]), .gu = PTR(a[1]), .rows = a[2], .inter = a[3],
                 .stride = a[4], .bf16 = (int)a[5], .gelu = (int)a[6]};
    if (j.inter <= 0 || j.rows < 0) {
        PyErr_SetString(PyExc_ValueError, "gated_act: bad shape");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    RUN_ROWS(act_rows, &j, j.rows, j.rows * j.inter);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* set_par_min_elems(n): the element count from which a call uses the OpenMP team (bench). */
static PyObject *py_set_par_min(PyObject *self, PyObject *arg) {
    (void)self;
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    long long before = par_min_elems;
    par_min_elems = n;
    return PyLong_FromLongLong(before);
}

static PyObject *py_limits(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return Py_BuildValue("{s:i}", "max_head_dim", MAX_HEAD_DIM);
}

static PyMethodDef methods[] = {
    {"rms_norm", (PyCFunction)(void (*)(void))py_rms_norm, METH_FASTCALL,
     "rms_norm(out, res_out, x, res, w, rows, cols, x_stride, res_stride, bf16, one_plus, "
     "eps) on raw data pointers (res 0: no residual add); see kernels/fused.py."},
    {"rope_write", (PyCFunction)(void (*)(void))py_rope_write, METH_FASTCALL,
     "rope_write(q_out, k_pool, v_pool, qkv, cos, sin, slots, q_w, k_w, tokens, qkv_stride, "
     "cos_stride, heads, kv_heads, dim, bf16, one_plus, eps); see kernels/fused.py."},
    {"gated_act", (PyCFunction)(void (*)(void))py_gated_act, METH_FASTCALL,
     "gated_act(out, gate_up, rows, inter, stride, bf16, gelu); see kernels/fused.py."},
    {"set_par_min_elems", py_set_par_min, METH_O,
     "Set the element count from which a call runs on an OpenMP team; returns the old."},
    {"limits", py_limits, METH_NOARGS, "The largest head_dim rope_write takes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fused",
    "Fused per-row CPU ops of a decode step (kernels/fused.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fused(void) { return PyModule_Create(&module); }
