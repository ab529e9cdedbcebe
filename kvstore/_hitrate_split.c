/* kv-cache-tester session files: the ids split out of the JSON before json parses it
 * (kvstore/hitrate/readers/kvcache_tester.py), so they never become Python objects. */
#include "_hitrate_stack.h"


static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

/* Parse `[int, int, ...]` at p into ids; the end of the list, or NULL if it is anything
 * else (floats, literals, nesting, 19+ digits): then the list is left for json to judge. */
static const char *parse_int_list(const char *p, const char *end, int64_t **ids, Py_ssize_t *n,
                                  Py_ssize_t *cap) {
    Py_ssize_t start = *n;
    p = skip_ws(p + 1, end);
    if (p < end && *p == ']') return p + 1;
    for (;;) {
        int neg = 0;
        if (p < end && *p == '-') neg = 1, p++;
        const char *d = p;
        uint64_t v = 0;
        while (p < end && (unsigned)(*p - '0') < 10) v = v * 10 + (uint64_t)(*p++ - '0');
        int digits = (int)(p - d);
        if (digits == 0 || digits > 18 || (digits > 1 && *d == '0')) goto bail;
        if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) goto bail;
        if (*n == *cap) {
            Py_ssize_t c = *cap ? 2 * *cap : 4096;
            int64_t *q = realloc(*ids, c * sizeof(int64_t));
            if (!q) goto bail;
            *ids = q, *cap = c;
        }
        (*ids)[(*n)++] = neg ? -(int64_t)v : (int64_t)v;
        if (p < end && *p == ',') { /* the common case: "1,2,3" */
            p++;
            if (p < end && *p == ' ') p = skip_ws(p, end);
            continue;
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        if (p < end && *p == ']') return p + 1;
        goto bail;
    }
bail:
    *n = start;
    return NULL;
}

typedef struct {
    char *out;
    Py_ssize_t out_len;
    int64_t *ids, *off;
    Py_ssize_t n, lists;
} Split;

/* The scan of split_hash_ids, without the GIL; -1 when out of memory. */
static int split_scan(const char *buf, Py_ssize_t len, Split *r) {
    const char *p = buf, *end = buf + len, *copied = buf;
    static const char tag[] = "\"hash_ids\"";
    const size_t tag_len = sizeof(tag) - 1;
    Py_ssize_t cap = 0, off_cap = 0;
    if (!(r->out = malloc(len + 1))) return -1;
    while (p < end) {
        const char *hit = memmem(p, end - p, tag, tag_len);
        if (!hit) break;
        p = hit + tag_len;
        if (hit > buf && hit[-1] == '\\') continue; /* inside a string */
        const char *q = skip_ws(p, end);
        if (q >= end || *q != ':') continue;
        q = skip_ws(q + 1, end);
        if (q >= end || *q != '[') continue;
        Py_ssize_t before = r->n;
        const char *after = parse_int_list(q, end, &r->ids, &r->n, &cap);
        if (!after) continue;
        char marker[48];
        int mlen = snprintf(marker, sizeof marker, "{\"\\u0000\": %zd}", r->lists);
        memcpy(r->out + r->out_len, copied, q - copied);
        r->out_len += q - copied;
        if ((Py_ssize_t)mlen > after - q) { /* a short list: no room for the marker, keep it */
            memcpy(r->out + r->out_len, q, after - q);
            r->out_len += after - q;
            r->n = before;
        } else {
            if (r->lists + 2 > off_cap) {
                Py_ssize_t c = off_cap ? 2 * off_cap : 1024;
                int64_t *o = realloc(r->off, c * sizeof(int64_t));
                if (!o) return -1;
                r->off = o, off_cap = c;
            }
            r->off[r->lists] = before;
            r->off[r->lists + 1] = r->n;
            r->lists++;
            memcpy(r->out + r->out_len, marker, mlen);
            r->out_len += mlen;
        }
        copied = p = after;
    }
    memcpy(r->out + r->out_len, copied, end - copied);
    r->out_len += end - copied;
    return 0;
}

/* split_hash_ids(doc: bytes) -> (skeleton: bytes, ids: bytes (int64), offsets: bytes (int64))
 * Every `"hash_ids": [ints]` becomes `"hash_ids": {"\u0000": i}` in the skeleton, its ids
 * ids[offsets[i]:offsets[i+1]]: json then parses a document of small fields only, and the
 * ids (most of a session file) never become Python objects. Runs without the GIL, so
 * files load in parallel threads. */
PyObject *hitrate_split_hash_ids(PyObject *m, PyObject *arg) {
    Py_buffer in;
    if (PyObject_GetBuffer(arg, &in, PyBUF_SIMPLE) < 0) return NULL;
    Split r = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = split_scan(in.buf, in.len, &r);
    Py_END_ALLOW_THREADS
    PyObject *result = NULL;
    if (rc < 0) {
        PyErr_NoMemory();
    } else {
        PyObject *sk = PyBytes_FromStringAndSize(r.out, r.out_len);
        PyObject *ib = PyBytes_FromStringAndSize((const char *)r.ids, r.n * 8);
        PyObject *ob =
            PyBytes_FromStringAndSize((const char *)r.off, (r.lists ? r.lists + 1 : 0) * 8);
        if (sk && ib && ob) result = Py_BuildValue("(NNN)", sk, ib, ob);
        else Py_XDECREF(sk), Py_XDECREF(ib), Py_XDECREF(ob);
    }
    free(r.out), free(r.ids), free(r.off);
    PyBuffer_Release(&in);
    return result;
}

