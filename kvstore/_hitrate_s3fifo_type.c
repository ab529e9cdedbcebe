/* kvstore._hitrate.S3Fifo: the Python face of the S3-FIFO replay (_hitrate_s3fifo.c), used by
 * kvstore/hitrate/s3replay.py, with its set-up and consistency check. Fed the same batches as
 * Stack (_hitrate.c). */
#include "_hitrate_s3fifo.h"

/* ---- set-up and checks ------------------------------------------------------------------- */

static void set_cap(S3Tier *T, int64_t cap, int expires) {
    T->cap = cap;
    /* s3fifo.py: max(1, int(capacity * 0.1)); the ghost keeps at most max(capacity, 1) */
    T->small_target = cap == S3_UNBOUNDED ? S3_UNBOUNDED : (int64_t)((double)cap * 0.1);
    if (T->small_target < 1) T->small_target = 1;
    T->ghost_limit = cap > 1 ? cap : 1;
    T->expires = expires;
}

int s3_init(S3Fifo *s, const int64_t *caps, Py_ssize_t n) {
    s->npoints = (int)(n / TIERS);
    s->states = calloc(n + 2, sizeof(S3Tier));
    s->tier_state = calloc(n, sizeof(int));
    s->tier_tokens = calloc(n, sizeof(int64_t));
    s->tier_blocks = calloc(n, sizeof(int64_t));
    s->replay_tokens = calloc(s->npoints, sizeof(int64_t));
    s->ratio_sum = calloc(s->npoints, sizeof(double));
    s->views = calloc(n, sizeof(S3Tier *));
    s->hits = calloc((size_t)s->npoints * 7, sizeof(int64_t));
    s->tab = calloc(1024, sizeof(S3Slot));
    s->tab_mask = 1023;
    s->now_s = -INFINITY;
    if (!s->states || !s->tier_state || !s->tier_tokens || !s->tier_blocks ||
        !s->replay_tokens || !s->ratio_sum || !s->views || !s->hits || !s->tab)
        return -1;
    set_cap(&s->states[0], S3_UNBOUNDED, 0);
    set_cap(&s->states[1], S3_UNBOUNDED, 1);
    s->nstates = 2;
    for (Py_ssize_t i = 0; i < n; i++) { /* -1: unbounded; 0: absent (or holds nothing) */
        int expires = i % TIERS == 2 && isfinite(s->retention_s), k;
        if (caps[i] == 0) {
            s->tier_state[i] = -1;
            continue;
        }
        s->expiring |= expires;
        if (caps[i] < 0) {
            s->states[expires].direct++;
            s->tier_state[i] = expires;
            continue;
        }
        for (k = 2; k < s->nstates; k++)
            if (s->states[k].cap == caps[i] && s->states[k].expires == expires) break;
        if (k == s->nstates) {
            set_cap(&s->states[k], caps[i], expires);
            s->states[k].riding = 1;
            s->states[expires].riders++;
            s->nstates++;
        }
        s->tier_state[i] = k;
    }
    for (int k = 0; k < 2; k++) s->states[k].dead = !s->states[k].riders && !s->states[k].direct;
    return 0;
}

void s3_free(S3Fifo *s) {
    if (s->states)
        for (int i = 0; i < s->nstates; i++)
            free(s->states[i].prev), free(s->states[i].next), free(s->states[i].st);
    free(s->states), free(s->tier_state), free(s->tier_tokens), free(s->tier_blocks);
    free(s->replay_tokens), free(s->ratio_sum), free(s->tab), free(s->key_of), free(s->last_t);
    free(s->rprev), free(s->rnext), free(s->ids), free(s->views), free(s->hits);
}

int64_t s3_bytes(const S3Fifo *s) {
    int64_t per_id = sizeof(uint64_t) + (s->expiring ? sizeof(double) + 2 * sizeof(uint32_t) : 0);
    for (int i = 0; i < s->nstates; i++)
        if (is_live(&s->states[i])) per_id += 2 * sizeof(uint32_t) + 1;
    return (int64_t)((s->tab_mask + 1) * sizeof(S3Slot)) + (int64_t)s->ids_size * per_id;
}

/* NULL if consistent, else what is not: queue links and lengths agree with each block's
 * state, no tier holds more than its capacity, the table maps every id back to its key. */
const char *s3_check(const S3Fifo *s) {
    for (uint32_t g = 1; g <= s->nids; g++) {
        uint64_t j = mix64(s->key_of[g]) & s->tab_mask;
        while (s->tab[j].id && s->tab[j].key != s->key_of[g]) j = (j + 1) & s->tab_mask;
        if (s->tab[j].id != g) return "the table lost a key";
    }
    for (int i = 0; i < s->nstates; i++) {
        const S3Tier *T = &s->states[i], *U = &s->states[T->expires];
        if (T->riding && (U->dead || U->q[S3_SMALL].len + U->q[S3_MAIN].len > T->cap))
            return "a riding state is over its capacity";
        if (!is_live(T)) continue;
        for (int w = S3_SMALL; w <= S3_GHOST; w++) {
            int64_t len = 0;
            uint32_t prev = 0;
            for (uint32_t g = T->q[w].head; g; prev = g, g = T->next[g]) {
                if ((T->st[g] & 3) != w || T->prev[g] != prev) return "a queue link is wrong";
                if (++len > (int64_t)s->nids) return "a queue has a cycle";
            }
            if (prev != T->q[w].tail || len != T->q[w].len) return "a queue's length is wrong";
        }
        if (T->q[S3_SMALL].len + T->q[S3_MAIN].len > T->cap) return "a tier is over capacity";
        if (T->q[S3_GHOST].len > T->ghost_limit) return "a ghost queue is over its limit";
    }
    return NULL;
}

/* ---- the Python type -------------------------------------------------------------------- */

static void S3Fifo_dealloc(S3Fifo *s) {
    s3_free(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int S3Fifo_init(S3Fifo *s, PyObject *args, PyObject *kw) {
    static char *names[] = {"caps", "retention_s", "time_scale", "keep_tokens", NULL};
    PyObject *caps_obj;
    double retention_s, time_scale;
    long long keep_tokens;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OddL", names, &caps_obj, &retention_s,
                                     &time_scale, &keep_tokens))
        return -1;
    if (s->tab) {
        PyErr_SetString(PyExc_RuntimeError, "S3Fifo is initialised once");
        return -1;
    }
    if (!(retention_s > 0) || !(time_scale > 0) || keep_tokens < 0) {
        PyErr_SetString(PyExc_ValueError, "retention and time scale positive, keep >= 0");
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
    s->retention_s = retention_s;
    s->time_scale = time_scale;
    s->keep_tokens = keep_tokens;
    int rc = s3_init(s, cb.buf, n);
    PyBuffer_Release(&cb);
    if (rc < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* feed(keys u64[], offsets i64[R+1], times f64[R], lengths i64[R], block_tokens) */
static PyObject *S3Fifo_feed(S3Fifo *s, PyObject *args) {
    PyObject *ko, *oo, *to, *lo;
    long long b;
    if (!PyArg_ParseTuple(args, "OOOOL", &ko, &oo, &to, &lo, &b)) return NULL;
    if (!s->tab) {
        PyErr_SetString(PyExc_RuntimeError, "S3Fifo is not initialised");
        return NULL;
    }
    if (b <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_tokens must be positive");
        return NULL;
    }
    HitrateBatch h;
    if (hitrate_batch_get(&h, ko, oo, to, lo) < 0) return NULL;
    int rc = 0;
    s->error[0] = 0;
    /* Without the GIL: the reader thread parses the next batch meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < h.requests && rc == 0; i++)
        rc = s3_request(s, h.keys + h.offsets[i], (Py_ssize_t)(h.offsets[i + 1] - h.offsets[i]),
                        h.times[i], h.lengths[i], b);
    Py_END_ALLOW_THREADS
    hitrate_batch_release(&h);
    if (rc < 0) {
        PyErr_SetString(PyExc_MemoryError, s->error[0] ? s->error : "out of memory");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* totals() -> (requests, input_tokens, ratio_requests, accesses,
 *              [(tier_tokens[3], tier_blocks[3], ratio_sum, replay_tokens) per point]) */
static PyObject *S3Fifo_totals(S3Fifo *s, PyObject *unused) {
    PyObject *pts = PyList_New(s->npoints);
    if (!pts) return NULL;
    for (int p = 0; p < s->npoints; p++) {
        const int64_t *tk = &s->tier_tokens[p * TIERS], *bk = &s->tier_blocks[p * TIERS];
        PyObject *item = Py_BuildValue("((LLL)(LLL)dL)", (long long)tk[0], (long long)tk[1],
                                       (long long)tk[2], (long long)bk[0], (long long)bk[1],
                                       (long long)bk[2], s->ratio_sum[p],
                                       (long long)s->replay_tokens[p]);
        if (!item) {
            Py_DECREF(pts);
            return NULL;
        }
        PyList_SET_ITEM(pts, p, item);
    }
    return Py_BuildValue("(LLLLN)", (long long)s->requests, (long long)s->input_tokens,
                         (long long)s->ratio_requests, (long long)s->accesses, pts);
}

static PyObject *S3Fifo_check(S3Fifo *s, PyObject *unused) {
    const char *bad = s->tab ? s3_check(s) : NULL;
    if (bad) {
        PyErr_Format(PyExc_AssertionError, "s3fifo replay: %s", bad);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *S3Fifo_get_blocks(S3Fifo *s, void *c) { return PyLong_FromLong(s->nids); }

static PyObject *S3Fifo_get_bytes(S3Fifo *s, void *c) {
    return PyLong_FromLongLong(s->tab ? s3_bytes(s) : 0);
}

static PyMethodDef S3Fifo_methods[] = {
    {"feed", (PyCFunction)S3Fifo_feed, METH_VARARGS, "replay a batch of requests"},
    {"totals", (PyCFunction)S3Fifo_totals, METH_NOARGS, "every point's totals so far"},
    {"check", (PyCFunction)S3Fifo_check, METH_NOARGS, "raise AssertionError if inconsistent"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef S3Fifo_getset[] = {
    {"blocks", (getter)S3Fifo_get_blocks, NULL, "distinct blocks seen", NULL},
    {"memory_bytes", (getter)S3Fifo_get_bytes, NULL, "bytes of the native arrays", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject S3FifoType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvstore._hitrate.S3Fifo",
    .tp_basicsize = sizeof(S3Fifo),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)S3Fifo_init,
    .tp_dealloc = (destructor)S3Fifo_dealloc,
    .tp_methods = S3Fifo_methods,
    .tp_getset = S3Fifo_getset,
};

int hitrate_add_s3fifo(PyObject *m) {
    if (PyType_Ready(&S3FifoType) < 0) return -1;
    Py_INCREF(&S3FifoType);
    if (PyModule_AddObject(m, "S3Fifo", (PyObject *)&S3FifoType) < 0) {
        Py_DECREF(&S3FifoType);
        return -1;
    }
    return 0;
}
