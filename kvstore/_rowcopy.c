/* Verified row copies in one native call (kvstore/row_copy.py's NativeRowCopier).
 *
 * Each row is copied into the destination in cache-sized chunks and each chunk is hashed
 * (streaming xxh3-64) right after its copy, from the destination, while it is still in
 * the core's L1/L2: the hash reads what the caller gets, and the copy's memory traffic is
 * paid once. The copy runs without the GIL; rows are claimed from a shared counter by
 * the caller and one persistent helper thread, which spins briefly between calls (a
 * sleeping thread takes tens of µs to wake on a VM, a large part of a 4 MiB read). A read
 * by key (copy_found) posts the job before its look-up and hands each row to the helper
 * as soon as it is found, so the look-up (the tier's dicts, cold after a large copy:
 * ~5 µs for 16 keys) and the caller's bookkeeping (`during`) overlap the helper's copy.
 * The caller then starts late; so that it does not finish its last row alone, the first
 * thread out of rows copies the last chunks of the other's row (row_slot_t).
 *
 * xxHash itself is not compiled in: the `xxhash` package's extension module exports the
 * XXH3 functions (with run-time AVX2/AVX-512 dispatch); its path is passed in and the
 * symbols are looked up with dlsym. XXH3_state_t stays opaque (XXH3_createState).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

typedef uint64_t (*xxh_oneshot_fn)(const void *, size_t);
typedef void *(*xxh_create_fn)(void);
typedef int (*xxh_free_fn)(void *);
typedef int (*xxh_reset_fn)(void *);
typedef int (*xxh_update_fn)(void *, const void *, size_t);
typedef uint64_t (*xxh_digest_fn)(const void *);

typedef struct {
    xxh_oneshot_fn oneshot;
    xxh_create_fn create;
    xxh_free_fn free_state;
    xxh_reset_fn reset;
    xxh_update_fn update;
    xxh_digest_fn digest;
} xxh_api;

/* The row a thread is copying, as the other thread sees it once it has no row left to
 * claim: `claim` = row << 32 | front << 16 | back, in chunks. The owner takes chunks from
 * the front, the other thread from the back (copies only: the owner hashes them, in
 * order, once `stolen_done` says they are all copied). On its own cache line: both
 * threads write it. */
typedef struct {
    _Alignas(64) _Atomic uint64_t claim;
    atomic_size_t stolen_done;
} row_slot_t;

#define CLAIM(r, f, b) (((uint64_t)(r) << 32) | ((uint64_t)(f) << 16) | (uint64_t)(b))
#define CLAIM_ROW(c) ((size_t)((c) >> 32))
#define CLAIM_FRONT(c) ((size_t)(((c) >> 16) & 0xffff))
#define CLAIM_BACK(c) ((size_t)((c) & 0xffff))

/* One call's work; lives in the copier, reused call after call. */
typedef struct {
    row_slot_t slot[2]; /* [0] the caller's row, [1] the helper's */
    int split;          /* rows are split between the threads at the end of the call */
    size_t chunks_per_row;
    const char *src;
    char *dst;
    const int64_t *offsets;
    const uint64_t *sums;
    size_t rows, row_bytes, rows_per_unit, units;
    /* Rows are handed over as the caller looks them up (copy_found): rows below `ready`
     * have their offsets and checksums; `total` is the row count once the look-up is
     * over (LOOKING until then). Threads copy a row only once it is ready. */
    atomic_size_t ready, total;
    atomic_size_t next_unit;
    atomic_size_t first_bad;     /* lowest failing row seen so far; `rows` = none */
    atomic_size_t helper_rows;   /* rows the helper processed (stats, tests) */
    atomic_size_t split_chunks;  /* chunks copied for the other thread (stats, tests) */
} job_t;

#define LOOKING ((size_t)-1)

/* Handshake with the helper: state = generation * 4 + phase. */
enum { OPEN = 0, HELPER_IN = 1, CLOSED = 2, HELPER_DONE = 3 };

typedef struct {
    PyObject_HEAD
    xxh_api x;
    void *lib;
    size_t chunk_bytes, unit_bytes, share_min_bytes;
    int split_rows; /* split rows between the threads at the end of a call */
    long spin_ns;
    int threads;
    PyObject *error; /* raised on misuse (kvstore.errors.InvalidArgument) */
    void *state;     /* the caller's hash state */
    pthread_mutex_t call_mu; /* one call at a time per copier */
    /* helper */
    pthread_t helper;
    int helper_running;
    pid_t pid;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t hstate;
    atomic_int stop;
    uint64_t start_gen; /* the last generation posted before the helper started */
    job_t job;
    /* stats */
    unsigned long long shared_calls, helper_rows, split_chunks;
} Copier;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void copy_bytes(char *d, const char *s, size_t n) {
    if (d < s + n && s < d + n)
        memmove(d, s, n);
    else
        memcpy(d, s, n);
}

/* Copy and check one row; returns 1 when the copy's hash equals its checksum. */
static int copy_row(const xxh_api *x, void *st, size_t chunk, char *d, const char *s,
                    size_t bb, uint64_t want) {
    if (bb <= chunk) {
        copy_bytes(d, s, bb);
        return x->oneshot(d, bb) == want;
    }
    x->reset(st);
    for (size_t off = 0; off < bb; off += chunk) {
        size_t n = bb - off < chunk ? bb - off : chunk;
        copy_bytes(d + off, s + off, n);
        x->update(st, d + off, n);
    }
    return x->digest(st) == want;
}

/* Wait until row `r` is looked up (1) or the look-up ended before it (0; after a failed
 * look-up no row starts, even one handed over already). */
static int row_ready(job_t *j, size_t r) {
    for (;;) {
        size_t total = atomic_load_explicit(&j->total, memory_order_acquire);
        if (total != LOOKING)
            return r < total;
        if (atomic_load_explicit(&j->ready, memory_order_acquire) > r)
            return 1;
        CPU_RELAX();
    }
}

static inline size_t chunk_len(size_t bb, size_t chunk, size_t k) {
    size_t off = k * chunk;
    return bb - off < chunk ? bb - off : chunk;
}

/* copy_row for a call whose rows are split: row `r` is published in this thread's slot,
 * so that the other thread, once it has no row left to claim, copies its last chunks
 * (from the back) while this one copies and hashes from the front; neither core idles
 * for most of a row at the end of a call. The hash stays in order: the chunks the other
 * thread copied are hashed here, from the destination, once all of them are copied. */
static int copy_row_split(const Copier *c, job_t *j, row_slot_t *mine, void *st, size_t r) {
    const xxh_api *x = &c->x;
    size_t bb = j->row_bytes, ch = c->chunk_bytes, nck = j->chunks_per_row;
    char *d = j->dst + r * bb;
    const char *s = j->src + j->offsets[r];
    atomic_store_explicit(&mine->stolen_done, 0, memory_order_relaxed);
    uint64_t cur = CLAIM(r, 0, nck);
    atomic_store_explicit(&mine->claim, cur, memory_order_release);
    x->reset(st);
    for (;;) {
        size_t f = CLAIM_FRONT(cur), b = CLAIM_BACK(cur);
        if (f >= b)
            break;
        if (!atomic_compare_exchange_weak_explicit(&mine->claim, &cur, CLAIM(r, f + 1, b),
                                                   memory_order_relaxed, memory_order_relaxed))
            continue; /* the other thread took a chunk from the back: `cur` is reloaded */
        size_t n = chunk_len(bb, ch, f);
        copy_bytes(d + f * ch, s + f * ch, n);
        x->update(st, d + f * ch, n);
        cur = CLAIM(r, f + 1, b);
    }
    /* Front met back: no claim changes the slot any more. Wait for the chunks taken. */
    size_t back = CLAIM_BACK(cur);
    while (atomic_load_explicit(&mine->stolen_done, memory_order_acquire) < nck - back)
        CPU_RELAX();
    for (size_t k = back; k < nck; k++)
        x->update(st, d + k * ch, chunk_len(bb, ch, k));
    return x->digest(st) == j->sums[r];
}

/* Copy the last chunks of the rows the other thread is on, until it has none left to
 * give (copies only: their owner hashes them). */
static void take_chunks(const Copier *c, job_t *j, row_slot_t *other) {
    size_t bb = j->row_bytes, ch = c->chunk_bytes;
    uint64_t cur = atomic_load_explicit(&other->claim, memory_order_acquire);
    for (;;) {
        size_t r = CLAIM_ROW(cur), f = CLAIM_FRONT(cur), b = CLAIM_BACK(cur);
        if (f >= b)
            return;
        if (!atomic_compare_exchange_weak_explicit(&other->claim, &cur, CLAIM(r, f, b - 1),
                                                   memory_order_acquire, memory_order_acquire))
            continue;
        size_t off = (b - 1) * ch;
        copy_bytes(j->dst + r * bb + off, j->src + j->offsets[r] + off, chunk_len(bb, ch, b - 1));
        atomic_fetch_add_explicit(&other->stolen_done, 1, memory_order_release);
        atomic_fetch_add_explicit(&j->split_chunks, 1, memory_order_relaxed);
        cur = atomic_load_explicit(&other->claim, memory_order_acquire);
    }
}

/* `me`: 0 on the caller's thread, 1 on the helper's (its slot when rows are split). */
static size_t run_job(const Copier *c, job_t *j, void *st, int me) {
    size_t done = 0;
    for (;;) {
        size_t u = atomic_fetch_add_explicit(&j->next_unit, 1, memory_order_relaxed);
        if (u >= j->units) {
            if (j->split)
                take_chunks(c, j, &j->slot[1 - me]);
            break;
        }
        size_t first = u * j->rows_per_unit;
        size_t last = first + j->rows_per_unit;
        if (last > j->rows)
            last = j->rows;
        for (size_t r = first; r < last; r++) {
            if (!row_ready(j, r)) {
                /* The look-up ended before this row: no row is left to claim. */
                if (j->split)
                    take_chunks(c, j, &j->slot[1 - me]);
                return done;
            }
            if (r >= atomic_load_explicit(&j->first_bad, memory_order_relaxed))
                return done; /* a row before this one failed: the rest does not count */
            int ok = j->split ? copy_row_split(c, j, &j->slot[me], st, r)
                              : copy_row(&c->x, st, c->chunk_bytes, j->dst + r * j->row_bytes,
                                         j->src + j->offsets[r], j->row_bytes, j->sums[r]);
            if (!ok) {
                size_t cur = atomic_load(&j->first_bad);
                while (r < cur && !atomic_compare_exchange_weak(&j->first_bad, &cur, r))
                    ;
                return done;
            }
            done++;
        }
    }
    return done;
}

static void *helper_main(void *arg) {
    Copier *c = (Copier *)arg;
    void *st = c->x.create();
    uint64_t seen = c->start_gen;
    while (!atomic_load(&c->stop)) {
        uint64_t s = atomic_load(&c->hstate);
        if ((s >> 2) == seen) {
            int64_t until = now_ns() + c->spin_ns;
            int spins = 0;
            while ((s = atomic_load(&c->hstate)) >> 2 == seen && !atomic_load(&c->stop)) {
                CPU_RELAX();
                if (++spins % 64 == 0 && now_ns() > until) {
                    pthread_mutex_lock(&c->mu);
                    while ((s = atomic_load(&c->hstate)) >> 2 == seen && !atomic_load(&c->stop))
                        pthread_cond_wait(&c->cv, &c->mu);
                    pthread_mutex_unlock(&c->mu);
                    break;
                }
            }
            if (atomic_load(&c->stop))
                break;
        }
        seen = s >> 2;
        uint64_t open = seen * 4 + OPEN;
        /* Enter only a job still open; the caller may have closed it already. */
        if (atomic_compare_exchange_strong(&c->hstate, &open, seen * 4 + HELPER_IN)) {
            if (st != NULL) {
                size_t n = run_job(c, &c->job, st, 1);
                atomic_fetch_add_explicit(&c->job.helper_rows, n, memory_order_relaxed);
            }
            atomic_store(&c->hstate, seen * 4 + HELPER_DONE);
        }
    }
    if (st != NULL)
        c->x.free_state(st);
    return NULL;
}

static void stop_helper(Copier *c) {
    if (!c->helper_running)
        return;
    if (c->pid == getpid()) {
        pthread_mutex_lock(&c->mu);
        atomic_store(&c->stop, 1);
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->helper, NULL);
    }
    c->helper_running = 0;
}

static int ensure_helper(Copier *c) {
    if (c->helper_running && c->pid == getpid())
        return 0;
    if (c->helper_running) { /* a forked child: the thread did not come along */
        c->helper_running = 0;
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
    }
    atomic_store(&c->stop, 0);
    c->pid = getpid();
    c->start_gen = atomic_load(&c->hstate) >> 2;
    if (pthread_create(&c->helper, NULL, helper_main, c) != 0)
        return -1;
    c->helper_running = 1;
    return 0;
}

/* Read a sequence of Python ints into `out` (n entries); returns -1 with an error set. */
static int read_ints(PyObject *seq, size_t n, void *out, int is_unsigned, PyObject *err,
                     const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL)
        return -1;
    if ((size_t)PySequence_Fast_GET_SIZE(fast) != n) {
        PyErr_Format(err, "%zd %s for %zu rows", PySequence_Fast_GET_SIZE(fast), what, n);
        Py_DECREF(fast);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (size_t i = 0; i < n; i++) {
        if (is_unsigned) {
            uint64_t v = PyLong_AsUnsignedLongLong(items[i]);
            if (v == (uint64_t)-1 && PyErr_Occurred()) {
                PyErr_Clear();
                PyErr_Format(err, "%s must be integers in [0, 2**64)", what);
                Py_DECREF(fast);
                return -1;
            }
            ((uint64_t *)out)[i] = v;
        } else {
            long long v = PyLong_AsLongLong(items[i]);
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                PyErr_Format(err, "%s must be 64-bit integers", what);
                Py_DECREF(fast);
                return -1;
            }
            ((int64_t *)out)[i] = v;
        }
    }
    Py_DECREF(fast);
    return 0;
}

/* Row arrays of one call: on the stack for the common case, else on the heap. */
#define SMALL_ROWS 64
typedef struct {
    int64_t small_off[SMALL_ROWS];
    uint64_t small_sum[SMALL_ROWS];
    int64_t *offsets;
    uint64_t *sums;
} rows_t;

static int rows_alloc(rows_t *r, size_t n) {
    if (n <= SMALL_ROWS) {
        r->offsets = r->small_off;
        r->sums = r->small_sum;
        return 0;
    }
    r->offsets = PyMem_Malloc(n * sizeof(int64_t));
    r->sums = PyMem_Malloc(n * sizeof(uint64_t));
    if (r->offsets == NULL || r->sums == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void rows_free(rows_t *r) {
    if (r->offsets != r->small_off) {
        PyMem_Free(r->offsets);
        PyMem_Free(r->sums);
    }
}

/* A call's copy, in three steps: job_open posts the job (the helper starts on rows as
 * they become ready), the caller hands rows over (all at once, or one by one as it looks
 * them up) and ends the look-up with job_lookup_done, then job_close copies on the
 * caller's thread too and returns once no thread writes to the destination. Between open
 * and close the copier's call lock is held. */
static int job_open(Copier *c, const Py_buffer *src, const Py_buffer *dst,
                    const int64_t *offsets, const uint64_t *sums, size_t n, size_t bb) {
    job_t *j = &c->job;
    int share;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&c->call_mu); /* held until job_close, across the look-up */
    j->src = src->buf;
    j->dst = dst->buf;
    j->offsets = offsets;
    j->sums = sums;
    j->rows = n;
    j->row_bytes = bb;
    j->rows_per_unit = c->unit_bytes / bb ? c->unit_bytes / bb : 1;
    j->units = (n + j->rows_per_unit - 1) / j->rows_per_unit;
    atomic_store(&j->ready, 0);
    atomic_store(&j->total, LOOKING);
    atomic_store(&j->next_unit, 0);
    atomic_store(&j->first_bad, n);
    atomic_store(&j->helper_rows, 0);
    atomic_store(&j->split_chunks, 0);
    share = c->threads > 1 && n >= 2 && n * bb >= c->share_min_bytes && ensure_helper(c) == 0;
    /* Rows of several chunks are split at the end of a shared call, where the claim word
     * can number them. */
    j->chunks_per_row = (bb + c->chunk_bytes - 1) / c->chunk_bytes;
    j->split = share && c->split_rows && j->chunks_per_row >= 2 &&
               j->chunks_per_row <= 0xffff && n <= 0xffffffffu;
    for (int t = 0; t < 2; t++) {
        atomic_store(&j->slot[t].claim, CLAIM(0, 0, 0)); /* nothing to take */
        atomic_store(&j->slot[t].stolen_done, 0);
    }
    if (share) {
        uint64_t gen = (atomic_load(&c->hstate) >> 2) + 1;
        atomic_store(&c->hstate, gen * 4 + OPEN); /* publishes the job's fields */
        pthread_mutex_lock(&c->mu);
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    Py_END_ALLOW_THREADS
    return share;
}

/* Rows below `ready` have their offsets and checksums (set before this). */
static inline void job_ready(Copier *c, size_t ready) {
    atomic_store_explicit(&c->job.ready, ready, memory_order_release);
}

/* The look-up is over: `total` rows (0 after an error: no row starts any more). */
static inline void job_lookup_done(Copier *c, size_t total) {
    atomic_store_explicit(&c->job.total, total, memory_order_release);
}

/* Copy on the caller's thread too, wait for the helper to leave the destination, unlock;
 * returns the passing prefix of the `total` rows. */
static size_t job_close(Copier *c, int share) {
    job_t *j = &c->job;
    size_t got;
    Py_BEGIN_ALLOW_THREADS
    run_job(c, j, c->state, 0);
    if (share) {
        uint64_t gen = atomic_load(&c->hstate) >> 2;
        uint64_t open = gen * 4 + OPEN;
        /* Close the job unless the helper is inside; then wait for it to leave `dst`. */
        if (!atomic_compare_exchange_strong(&c->hstate, &open, gen * 4 + CLOSED)) {
            while (atomic_load(&c->hstate) != gen * 4 + HELPER_DONE)
                CPU_RELAX();
        }
        c->shared_calls++;
        c->helper_rows += atomic_load(&j->helper_rows);
        c->split_chunks += atomic_load(&j->split_chunks);
    }
    got = atomic_load(&j->first_bad);
    size_t total = atomic_load(&j->total);
    if (got > total)
        got = total;
    pthread_mutex_unlock(&c->call_mu);
    Py_END_ALLOW_THREADS
    return got;
}

/* Call `during` (with `arg`, or none when NULL; Py_None: nothing) on the caller's thread
 * while the helper copies; an error it raises is fetched into `saved` to be raised once
 * the copy is over (the helper must be out of `dst` first). Returns 0 when it failed. */
typedef struct {
    PyObject *type, *value, *tb;
} saved_error;

static int call_during(PyObject *during, PyObject *arg, saved_error *saved) {
    PyObject *ran;
    if (during == Py_None)
        return 1;
    ran = arg == NULL ? PyObject_CallNoArgs(during) : PyObject_CallOneArg(during, arg);
    if (ran == NULL) {
        PyErr_Fetch(&saved->type, &saved->value, &saved->tb);
        return 0;
    }
    Py_DECREF(ran);
    return 1;
}

/* Every row inside both buffers (memcpy takes raw addresses); -1 with an error set. */
static int check_rows(Copier *c, const Py_buffer *src, const Py_buffer *dst,
                      const int64_t *offsets, size_t n, size_t bb) {
    if (n > (size_t)dst->len / bb) {
        PyErr_Format(c->error, "destination of %zd bytes for %zu rows", dst->len, n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        if (offsets[i] < 0 || (uint64_t)offsets[i] > (uint64_t)src->len ||
            (uint64_t)src->len - (uint64_t)offsets[i] < bb) {
            PyErr_SetString(c->error, "a source row lies outside the source buffer");
            return -1;
        }
    }
    return 0;
}

/* The copy and check of `n` rows whose offsets and checksums are filled in; `during` is
 * called (with no argument) on the caller's thread while the helper copies. Returns -1
 * with an exception set, else stores the passing prefix in `*got`. */
static int run_copy(Copier *c, const Py_buffer *src, const Py_buffer *dst,
                    const int64_t *offsets, const uint64_t *sums, size_t n, size_t bb,
                    PyObject *during, size_t *got) {
    if (check_rows(c, src, dst, offsets, n, bb) < 0)
        return -1;
    int share = job_open(c, src, dst, offsets, sums, n, bb);
    job_ready(c, n);
    job_lookup_done(c, n);
    saved_error saved = {NULL, NULL, NULL};
    int ok = call_during(during, NULL, &saved);
    *got = job_close(c, share);
    if (!ok) {
        PyErr_Restore(saved.type, saved.value, saved.tb);
        return -1;
    }
    return 0;
}

/* Source and (writable) destination buffers of a call; -1 with an error set. */
static int get_buffers(Copier *c, PyObject *src_obj, PyObject *dst_obj, Py_buffer *src,
                       Py_buffer *dst) {
    if (c->state == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "copier is not initialised");
        return -1;
    }
    if (PyObject_GetBuffer(src_obj, src, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyTuple_Check(dst_obj)) {
        /* (address, nbytes, owner): a CPU tensor's memory as kvstore/buffers.py's
         * writable_rows gives it, without exporting a view (~1 µs a call); the caller
         * holds `owner` for the call. */
        if (PyTuple_GET_SIZE(dst_obj) != 3) {
            PyBuffer_Release(src);
            PyErr_SetString(c->error, "an addressed destination is (address, nbytes, owner)");
            return -1;
        }
        void *addr = PyLong_AsVoidPtr(PyTuple_GET_ITEM(dst_obj, 0));
        Py_ssize_t len = PyLong_AsSsize_t(PyTuple_GET_ITEM(dst_obj, 1));
        if (PyErr_Occurred() || len < 0 || (addr == NULL && len > 0)) {
            PyBuffer_Release(src);
            PyErr_Clear();
            PyErr_SetString(c->error, "an addressed destination needs an address and a size");
            return -1;
        }
        memset(dst, 0, sizeof(*dst)); /* obj NULL: PyBuffer_Release leaves it alone */
        dst->buf = addr;
        dst->len = len;
        return 0;
    }
    if (PyObject_GetBuffer(dst_obj, dst, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(src);
        PyErr_Clear();
        PyErr_SetString(c->error, "destination buffer is read-only or not contiguous");
        return -1;
    }
    return 0;
}

static PyObject *Copier_copy_verified(Copier *c, PyObject *args) {
    PyObject *src_obj, *offsets_obj, *dst_obj, *sums_obj, *during = Py_None;
    Py_ssize_t row_bytes_arg;
    if (!PyArg_ParseTuple(args, "OOOnO|O", &src_obj, &offsets_obj, &dst_obj, &row_bytes_arg,
                          &sums_obj, &during))
        return NULL;
    if (row_bytes_arg <= 0) {
        PyErr_Format(c->error, "row size must be positive, got %zd", row_bytes_arg);
        return NULL;
    }
    size_t bb = (size_t)row_bytes_arg;
    Py_ssize_t n_arg = PyObject_Length(offsets_obj);
    if (n_arg < 0)
        return NULL;
    size_t n = (size_t)n_arg, got;
    Py_buffer src, dst;
    if (get_buffers(c, src_obj, dst_obj, &src, &dst) < 0)
        return NULL;
    PyObject *result = NULL;
    rows_t rows;
    if (rows_alloc(&rows, n) < 0)
        goto out;
    if (read_ints(offsets_obj, n, rows.offsets, 0, c->error, "offsets") < 0 ||
        read_ints(sums_obj, n, rows.sums, 1, c->error, "checksums") < 0)
        goto out;
    if (run_copy(c, &src, &dst, rows.offsets, rows.sums, n, bb, during, &got) == 0)
        result = PyLong_FromSize_t(got);
out:
    rows_free(&rows);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* A DRAM tier's read in one call: the index look-up (which leading keys are held for
 * this namespace, their slots, offsets and checksums) with the GIL held, then the copy
 * and check without it. `index` = (owner, slots, sums, slots_per_chunk, chunk_bytes):
 * dicts key -> namespace fingerprint / slot id / xxh3-64, and the pool's layout (slot
 * s lies at (s // slots_per_chunk) * chunk_bytes + (s % slots_per_chunk) * row_bytes,
 * as in kvstore/dram_pool.py). `dst` is a writable buffer or (address, nbytes, owner)
 * (kvstore.buffers.AddressedRows). Returns (found, got). When the look-up raises (an
 * index that disagrees with itself or with the pool), no row from the offending key on
 * is written; rows before it may have been. */
static PyObject *Copier_copy_found(Copier *c, PyObject *args) {
    PyObject *src_obj, *index, *keys_obj, *fp, *dst_obj, *during = Py_None;
    Py_ssize_t row_bytes_arg, spc, chunk;
    if (!PyArg_ParseTuple(args, "OO!OOOn|O", &src_obj, &PyTuple_Type, &index, &keys_obj, &fp,
                          &dst_obj, &row_bytes_arg, &during))
        return NULL;
    if (row_bytes_arg <= 0) {
        PyErr_Format(c->error, "row size must be positive, got %zd", row_bytes_arg);
        return NULL;
    }
    if (PyTuple_GET_SIZE(index) != 5 || !PyDict_Check(PyTuple_GET_ITEM(index, 0)) ||
        !PyDict_Check(PyTuple_GET_ITEM(index, 1)) || !PyDict_Check(PyTuple_GET_ITEM(index, 2))) {
        PyErr_SetString(c->error, "index must be (owner, slots, sums, slots_per_chunk, "
                                  "chunk_bytes) with three dicts");
        return NULL;
    }
    PyObject *owner = PyTuple_GET_ITEM(index, 0), *slots = PyTuple_GET_ITEM(index, 1),
             *sums_of = PyTuple_GET_ITEM(index, 2);
    spc = PyLong_AsSsize_t(PyTuple_GET_ITEM(index, 3));
    chunk = PyLong_AsSsize_t(PyTuple_GET_ITEM(index, 4));
    if ((spc == -1 || chunk == -1) && PyErr_Occurred())
        return NULL;
    size_t bb = (size_t)row_bytes_arg;
    if (spc <= 0 || chunk <= 0 || (size_t)spc > (size_t)chunk / bb) {
        PyErr_SetString(c->error, "slots_per_chunk rows must fit a chunk");
        return NULL;
    }
    PyObject *keys = PySequence_Fast(keys_obj, "keys must be a sequence");
    if (keys == NULL)
        return NULL;
    size_t n = (size_t)PySequence_Fast_GET_SIZE(keys), found = 0, got = 0;
    PyObject **items = PySequence_Fast_ITEMS(keys);
    Py_buffer src, dst;
    if (get_buffers(c, src_obj, dst_obj, &src, &dst) < 0) {
        Py_DECREF(keys);
        return NULL;
    }
    PyObject *result = NULL, *arg = NULL;
    rows_t rows;
    if (rows_alloc(&rows, n) < 0)
        goto out;
    /* Rows are handed to the helper as they are found, so the look-up (cold dicts after a
     * large copy: microseconds) overlaps the copy. Only where the destination has room
     * for every key: else the row count is checked against it before any copy. */
    int stream = n <= (size_t)dst.len / bb;
    int share = job_open(c, &src, &dst, rows.offsets, rows.sums, n, bb);
    for (; found < n; found++) {
        PyObject *k = items[found];
        PyObject *o = PyDict_GetItemWithError(owner, k); /* borrowed */
        if (o == NULL) {
            if (PyErr_Occurred())
                goto fail;
            break; /* not held: the found prefix ends here */
        }
        int same = PyObject_RichCompareBool(o, fp, Py_EQ);
        if (same < 0)
            goto fail;
        if (!same)
            break; /* held for another namespace */
        PyObject *s = PyDict_GetItemWithError(slots, k), *h = PyDict_GetItemWithError(sums_of, k);
        if (s == NULL || h == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, k); /* the index disagrees with itself */
            goto fail;
        }
        Py_ssize_t slot = PyLong_AsSsize_t(s);
        uint64_t want = PyLong_AsUnsignedLongLong(h);
        if ((slot == -1 || want == (uint64_t)-1) && PyErr_Occurred())
            goto fail;
        if (slot < 0) {
            PyErr_SetString(c->error, "a source row lies outside the source buffer");
            goto fail;
        }
        /* In 64 bits: slot / spc and the chunk size are each below 2**63. */
        uint64_t off = (uint64_t)(slot / spc) * (uint64_t)chunk + (uint64_t)(slot % spc) * bb;
        if ((uint64_t)(slot / spc) > (uint64_t)src.len / (uint64_t)chunk ||
            off > (uint64_t)src.len || (uint64_t)src.len - off < bb) {
            PyErr_SetString(c->error, "a source row lies outside the source buffer");
            goto fail;
        }
        rows.offsets[found] = (int64_t)off;
        rows.sums[found] = want;
        if (stream)
            job_ready(c, found + 1);
    }
    if (!stream && found > (size_t)dst.len / bb) {
        PyErr_Format(c->error, "destination of %zd bytes for %zu rows", dst.len, found);
        goto fail;
    }
    job_ready(c, found);
    job_lookup_done(c, found);
    arg = PyLong_FromSize_t(found);
    saved_error saved = {NULL, NULL, NULL};
    int ok = arg != NULL && call_during(during, arg, &saved);
    if (arg == NULL)
        PyErr_Fetch(&saved.type, &saved.value, &saved.tb);
    got = job_close(c, share);
    if (!ok) {
        PyErr_Restore(saved.type, saved.value, saved.tb);
        goto out;
    }
    result = Py_BuildValue("nn", (Py_ssize_t)found, (Py_ssize_t)got);
    goto out;
fail:
    /* No row starts any more; rows already started finish before the lock is let go
     * (the error stays set across: job_close runs no Python). */
    job_lookup_done(c, 0);
    {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        job_close(c, share);
        PyErr_Restore(et, ev, tb);
    }
out:
    Py_XDECREF(arg);
    rows_free(&rows);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    Py_DECREF(keys);
    return result;
}

static PyObject *Copier_close(Copier *c, PyObject *Py_UNUSED(ignored)) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&c->call_mu);
    stop_helper(c);
    pthread_mutex_unlock(&c->call_mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *Copier_stats(Copier *c, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{s:K,s:K,s:K,s:i}", "shared_calls", c->shared_calls, "helper_rows",
                         c->helper_rows, "split_chunks", c->split_chunks, "helper_running",
                         c->helper_running);
}

static void *must_sym(void *lib, const char *name, const char *fallback) {
    void *p = dlsym(lib, name);
    if (p == NULL && fallback != NULL)
        p = dlsym(lib, fallback);
    if (p == NULL)
        PyErr_Format(PyExc_ImportError, "%s not found in the xxhash library", name);
    return p;
}

static int Copier_init(Copier *c, PyObject *args, PyObject *kw) {
    static char *names[] = {"xxhash_library", "error", "threads", "chunk_bytes",
                            "unit_bytes", "share_min_bytes", "spin_us", "split_rows",
                            NULL};
    const char *path;
    PyObject *error;
    int threads = 2;
    Py_ssize_t chunk = 32 << 10, unit = 256 << 10, share_min = 512 << 10, spin_us = 200;
    int split_rows = 1;
    if (c->state != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "copier already initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sO|innnnp", names, &path, &error, &threads,
                                     &chunk, &unit, &share_min, &spin_us, &split_rows))
        return -1;
    if (threads < 1 || threads > 2 || chunk <= 0 || unit <= 0 || share_min < 0 ||
        spin_us < 0) {
        PyErr_SetString(PyExc_ValueError, "threads must be 1 or 2, sizes positive");
        return -1;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot load %s: %s", path, dlerror());
        return -1;
    }
    /* The _dispatch entry points pick AVX2/AVX-512 at run time where the build has them. */
    xxh_api x;
    if (!(x.oneshot = (xxh_oneshot_fn)must_sym(lib, "XXH3_64bits_dispatch", "XXH3_64bits")) ||
        !(x.create = (xxh_create_fn)must_sym(lib, "XXH3_createState", NULL)) ||
        !(x.free_state = (xxh_free_fn)must_sym(lib, "XXH3_freeState", NULL)) ||
        !(x.reset = (xxh_reset_fn)must_sym(lib, "XXH3_64bits_reset", NULL)) ||
        !(x.update = (xxh_update_fn)must_sym(lib, "XXH3_64bits_update_dispatch",
                                             "XXH3_64bits_update")) ||
        !(x.digest = (xxh_digest_fn)must_sym(lib, "XXH3_64bits_digest", NULL))) {
        dlclose(lib);
        return -1;
    }
    c->state = x.create();
    if (c->state == NULL) {
        dlclose(lib);
        PyErr_NoMemory();
        return -1;
    }
    c->x = x;
    c->lib = lib;
    c->threads = threads;
    c->chunk_bytes = (size_t)chunk;
    c->unit_bytes = (size_t)unit;
    c->share_min_bytes = (size_t)share_min;
    c->split_rows = split_rows;
    c->spin_ns = (long)spin_us * 1000;
    Py_INCREF(error);
    c->error = error;
    pthread_mutex_init(&c->call_mu, NULL);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    atomic_init(&c->hstate, 0);
    atomic_init(&c->stop, 0);
    return 0;
}

static void Copier_dealloc(Copier *c) {
    if (c->state != NULL) {
        Py_BEGIN_ALLOW_THREADS
        stop_helper(c);
        Py_END_ALLOW_THREADS
        c->x.free_state(c->state);
        dlclose(c->lib);
    }
    Py_XDECREF(c->error);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static PyMethodDef Copier_methods[] = {
    {"copy_verified", (PyCFunction)Copier_copy_verified, METH_VARARGS,
     "copy_verified(src, offsets, dst, row_bytes, sums, during=None) -> rows that passed"},
    {"copy_found", (PyCFunction)Copier_copy_found, METH_VARARGS,
     "copy_found(src, index, keys, fingerprint, dst, row_bytes, during=None) -> (found, got)"},
    {"close", (PyCFunction)Copier_close, METH_NOARGS, "stop the helper thread"},
    {"stats", (PyCFunction)Copier_stats, METH_NOARGS, "counters"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CopierType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._rowcopy.Copier",
    .tp_basicsize = sizeof(Copier),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Copy rows and check each copy's xxh3-64 (see kvstore/row_copy.py)",
    .tp_methods = Copier_methods,
    .tp_init = (initproc)Copier_init,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Copier_dealloc,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_rowcopy", .m_doc = "Native verified row copies",
    .m_size = -1};

PyMODINIT_FUNC PyInit__rowcopy(void) {
    if (PyType_Ready(&CopierType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&CopierType);
    if (PyModule_AddObject(m, "Copier", (PyObject *)&CopierType) < 0) {
        Py_DECREF(&CopierType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
