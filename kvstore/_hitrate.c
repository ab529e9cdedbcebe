/* kvstore._hitrate: the Python face of the one-pass engine (_hitrate_stack.c), of the
 * kv-cache-tester id splitter (_hitrate_split.c) and, through _hitrate_s3fifo_type.c, of the
 * S3-FIFO replay (_hitrate_s3fifo.c). Used by kvstore/hitrate/onepass.py. */
#include "_hitrate_s3fifo.h"

/* ---- the Python type ---------------------------------------------------------------------- */

int hitrate_get_buffer(PyObject *o, Py_buffer *v, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (v->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes", what, itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

int hitrate_batch_get(HitrateBatch *h, PyObject *ko, PyObject *oo, PyObject *to, PyObject *lo) {
    if (hitrate_get_buffer(ko, &h->kb, 8, "keys") < 0) return -1;
    if (hitrate_get_buffer(oo, &h->ob, 8, "offsets") < 0) goto rel_k;
    if (hitrate_get_buffer(to, &h->tb, 8, "times") < 0) goto rel_o;
    if (hitrate_get_buffer(lo, &h->lb, 8, "lengths") < 0) goto rel_t;
    Py_ssize_t r = h->tb.len / 8, nk = h->kb.len / 8;
    const int64_t *off = h->ob.buf, *len = h->lb.buf;
    int ok = h->ob.len / 8 == r + 1 && h->lb.len / 8 == r && (r == 0 || (off[0] >= 0 && off[r] <= nk));
    for (Py_ssize_t i = 0; ok && i < r; i++) ok = off[i] <= off[i + 1] && len[i] >= 0;
    if (ok) {
        h->requests = r, h->keys = h->kb.buf, h->offsets = off, h->lengths = len, h->times = h->tb.buf;
        return 0;
    }
    PyErr_SetString(PyExc_ValueError, "feed: inconsistent offsets, times or lengths");
    PyBuffer_Release(&h->lb);
rel_t:
    PyBuffer_Release(&h->tb);
rel_o:
    PyBuffer_Release(&h->ob);
rel_k:
    PyBuffer_Release(&h->kb);
    return -1;
}

void hitrate_batch_release(HitrateBatch *h) {
    PyBuffer_Release(&h->lb), PyBuffer_Release(&h->tb), PyBuffer_Release(&h->ob), PyBuffer_Release(&h->kb);
}

static void Stack_dealloc(Stack *s) {
    free(s->tab), free(s->direct), free(s->fen), free(s->owner), free(s->tpos), free(s->alive), free(s->caps);
    free(s->tier_tokens), free(s->tier_blocks), free(s->ratio_sum), free(s->replay_tokens);
    free(s->depth), free(s->chain_index), free(s->old_pos), free(s->entry), free(s->carry);
    free(s->expired), free(s->bucket), free(s->bucket_tokens);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int Stack_init(Stack *s, PyObject *args, PyObject *kw) {
    static char *names[] = {"caps", "retention_s", "time_scale", "keep_tokens", "rate",
                            "max_bytes", NULL};
    PyObject *caps_obj;
    double retention_s, time_scale, keep_tokens, rate;
    long long max_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OddddL", names, &caps_obj, &retention_s,
                                     &time_scale, &keep_tokens, &rate, &max_bytes))
        return -1;
    if (s->tab) {
        PyErr_SetString(PyExc_RuntimeError, "Stack is initialised once");
        return -1;
    }
    if (!(rate > 0 && rate <= 1)) {
        PyErr_SetString(PyExc_ValueError, "rate must be in (0, 1]");
        return -1;
    }
    Py_buffer cb;
    if (hitrate_get_buffer(caps_obj, &cb, 8, "caps") < 0) return -1;
    Py_ssize_t n = cb.len / 8;
    if (n == 0 || n % TIERS) {
        PyBuffer_Release(&cb);
        PyErr_SetString(PyExc_ValueError, "caps: 3 capacities (hbm, dram, ssd) per point");
        return -1;
    }
    s->npoints = (int)(n / TIERS);
    s->caps = malloc(n * sizeof(int64_t));
    s->tier_tokens = calloc(n, sizeof(int64_t));
    s->tier_blocks = calloc(n, sizeof(int64_t));
    s->ratio_sum = calloc(s->npoints, sizeof(double));
    s->replay_tokens = calloc(s->npoints, sizeof(double));
    s->bucket_tokens = calloc((size_t)s->npoints * BUCKETS, sizeof(int64_t));
    s->tab = calloc(1024, sizeof(Entry));
    s->size = 1024;
    s->fen = calloc(s->size + 1, sizeof(int32_t));
    s->owner = calloc(s->size + 1, sizeof(uint64_t));
    s->tpos = calloc(s->size + 1, sizeof(double));
    s->alive = calloc(s->size / 64 + 1, sizeof(uint64_t));
    if (!s->caps || !s->tier_tokens || !s->tier_blocks || !s->ratio_sum || !s->replay_tokens || !s->bucket_tokens ||
        !s->tab || !s->fen || !s->owner || !s->tpos || !s->alive) {
        PyBuffer_Release(&cb);
        PyErr_NoMemory();
        return -1;
    }
    s->tab_mask = 1023;
    s->lo = 1;
    const int64_t *c = cb.buf;
    s->keep_depth = 0;
    s->keep_depth_no_retention = 0;
    for (Py_ssize_t i = 0; i < n; i++) { /* -1: unbounded; else blocks, already x rate */
        int64_t v = c[i] < 0 ? UNBOUNDED : c[i];
        s->caps[i] = v;
        if (v > s->keep_depth) s->keep_depth = v;
        if (i % TIERS != 2 && v > s->keep_depth_no_retention) s->keep_depth_no_retention = v;
    }
    PyBuffer_Release(&cb);
    s->has_retention = isfinite(retention_s);
    s->retention_s = s->has_retention ? retention_s : 0.0;
    if (!s->has_retention) s->keep_depth_no_retention = s->keep_depth;
    s->time_scale = time_scale;
    s->now_s = -INFINITY;
    s->keep_tokens = keep_tokens;
    s->rate = rate;
    s->sampled = rate < 1;
    s->sample_below = s->sampled ? (uint64_t)ldexp(rate, 64) : UINT64_MAX;
    s->max_bytes = max_bytes;
    return 0;
}

/* feed(keys u64[], offsets i64[R+1], times f64[R], lengths i64[R], block_tokens) */
static PyObject *Stack_feed(Stack *s, PyObject *args) {
    PyObject *ko, *oo, *to, *lo;
    long long b;
    if (!PyArg_ParseTuple(args, "OOOOL", &ko, &oo, &to, &lo, &b)) return NULL;
    if (b <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_tokens must be positive");
        return NULL;
    }
    HitrateBatch h;
    if (hitrate_batch_get(&h, ko, oo, to, lo) < 0) return NULL;
    int rc = 0;
    s->error[0] = 0;
    /* The GIL is released: a reader thread parses the next batch meanwhile. The caller
     * must not use this Stack from another thread during a feed (OnePass never does). */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < h.requests && rc == 0; i++)
        rc = one_request(s, h.keys + h.offsets[i], (Py_ssize_t)(h.offsets[i + 1] - h.offsets[i]),
                         h.times[i], h.lengths[i], b);
    Py_END_ALLOW_THREADS
    hitrate_batch_release(&h);
    if (rc < 0) {
        PyErr_SetString(PyExc_MemoryError, s->error[0] ? s->error : "out of memory");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* totals() -> (requests, input_tokens, ratio_requests, accesses, tracked_accesses,
 *              [(tier_tokens[3], tier_blocks[3], ratio_sum, replay_tokens, bucket_tokens[16])
 *               per point]) */
static PyObject *Stack_totals(Stack *s, PyObject *unused) {
    PyObject *pts = PyList_New(s->npoints);
    if (!pts) return NULL;
    for (int p = 0; p < s->npoints; p++) {
        const int64_t *tk = &s->tier_tokens[p * TIERS], *bk = &s->tier_blocks[p * TIERS];
        PyObject *buckets = PyTuple_New(BUCKETS);
        if (!buckets) {
            Py_DECREF(pts);
            return NULL;
        }
        for (int i = 0; i < BUCKETS; i++)
            PyTuple_SET_ITEM(buckets, i, PyLong_FromLongLong(s->bucket_tokens[p * BUCKETS + i]));
        PyObject *item = Py_BuildValue("((LLL)(LLL)ddN)", (long long)tk[0], (long long)tk[1],
                                       (long long)tk[2], (long long)bk[0], (long long)bk[1],
                                       (long long)bk[2], s->ratio_sum[p], s->replay_tokens[p],
                                       buckets);
        if (!item) {
            Py_DECREF(pts);
            return NULL;
        }
        PyList_SET_ITEM(pts, p, item);
    }
    return Py_BuildValue("(LLLLLN)", (long long)s->requests, (long long)s->input_tokens,
                         (long long)s->ratio_requests, (long long)s->accesses,
                         (long long)s->tracked_accesses, pts);
}

/* check() -> None: the Fenwick total, the table and the positions agree (tests) */
static PyObject *Stack_check(Stack *s, PyObject *unused) {
    int64_t total = fen_prefix(s->fen, s->size), alive = 0, slots = 0;
    for (int64_t p = 1; p <= s->clock; p++) {
        if (!is_alive(s, p)) continue;
        if (p < s->lo) goto bad;
        int64_t *e = slot_find(s, s->owner[p]);
        if (!e || *e != p) goto bad;
        alive++;
    }
    for (uint64_t i = 0; i <= s->tab_mask; i++) slots += s->tab[i].pos != 0;
    for (int64_t i = 0; i < s->direct_len; i++) slots += s->direct[i] != 0;
    if (total != s->live || alive != s->live || slots != s->live) goto bad;
    Py_RETURN_NONE;
bad:
    PyErr_Format(PyExc_AssertionError, "stack: fenwick %lld, positions %lld, table %lld, live %lld",
                 (long long)total, (long long)alive, (long long)slots, (long long)s->live);
    return NULL;
}

static PyObject *Stack_get_live(Stack *s, void *c) { return PyLong_FromLongLong(s->live); }

static PyObject *Stack_get_bytes(Stack *s, void *c) {
    return PyLong_FromLongLong(stack_bytes(s, s->tab_mask + 1, s->size));
}

static PyMethodDef Stack_methods[] = {
    {"feed", (PyCFunction)Stack_feed, METH_VARARGS, "replay a batch of requests"},
    {"totals", (PyCFunction)Stack_totals, METH_NOARGS, "every point's totals so far"},
    {"check", (PyCFunction)Stack_check, METH_NOARGS, "raise AssertionError if inconsistent"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Stack_getset[] = {
    {"live_blocks", (getter)Stack_get_live, NULL, "blocks on the stack", NULL},
    {"memory_bytes", (getter)Stack_get_bytes, NULL, "bytes of the native arrays", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject StackType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._hitrate.Stack",
    .tp_basicsize = sizeof(Stack),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Stack_init,
    .tp_dealloc = (destructor)Stack_dealloc,
    .tp_methods = Stack_methods,
    .tp_getset = Stack_getset,
};

static PyObject *mod_mix(PyObject *m, PyObject *arg) {
    unsigned long long x = PyLong_AsUnsignedLongLongMask(arg);
    if (x == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return PyLong_FromUnsignedLongLong(mix64(x));
}

static PyMethodDef module_methods[] = {
    {"mix64", mod_mix, METH_O, "the key hash used for sampling and the table"},
    {"split_hash_ids", hitrate_split_hash_ids, METH_O, "kv-cache-tester ids out of a document"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvstore._hitrate",
                                    "LRU stack depths for kvstore hitrate", -1, module_methods};

PyMODINIT_FUNC PyInit__hitrate(void) {
    if (PyType_Ready(&StackType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&StackType);
    if (PyModule_AddObject(m, "Stack", (PyObject *)&StackType) < 0) {
        Py_DECREF(&StackType);
        Py_DECREF(m);
        return NULL;
    }
    if (hitrate_add_s3fifo(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

