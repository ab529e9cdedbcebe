/* The hit-rate model's inner loop (kvstore/hitrate/onepass.py): LRU stack depths of every
 * block access from one Fenwick tree over access positions, and every capacity point's
 * DESIGN §10 totals from those depths, in one pass over the input.
 *
 * Why one stack serves every tier and every point: each tier is an LRU over the same
 * stream of commits, and LRU is a stack algorithm, so a block is in a tier of capacity C
 * iff its depth (1 + distinct blocks touched since it) is <= C. The SSD's idle expiry
 * removes only the least recent blocks (the clock never runs backwards), so a block is in
 * the SSD iff depth <= C and it is not idle past the retention.
 *
 * Memory grows with live blocks only: a block is dropped from the bottom of the stack once
 * it is deeper than every capacity of interest, or idle past the retention and deeper than
 * every capacity of a tier without retention (it could never hit again before its next
 * access, which then finds it absent in every tier, as the simulator would). Positions are
 * renumbered when the clock reaches the end of the arrays, so they stay within 2x the
 * live blocks (plus one batch).
 *
 * SHARDS (Waldspurger et al., FAST 2015): with a rate R < 1 only keys whose hash falls
 * under R x 2^64 are tracked; a sampled depth d stands for d / R, so the points' capacities
 * are scaled by R here and the sampled blocks' tokens by 1 / R in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* memmem: Python.h defines _GNU_SOURCE */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TIERS 3
#define BUCKETS 16 /* sampled blocks split by hash, for the estimate's spread */
#define DIRECT_KEYS (1ULL << 31) /* keys that may be indexed directly */
#define DENSE_FACTOR 8           /* direct slots allowed per live block */
#define PREFETCH 8 /* keys ahead */
#define ROOM 3     /* positions per live block after a renumbering */
#define UNTRACKED INT64_MAX /* the depth of a block absent from the stack */
#define UNBOUNDED (INT64_MAX - 1) /* an unbounded tier: holds every tracked depth */

static inline uint64_t mix64(uint64_t x) { /* splitmix64's finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

typedef struct {
    uint64_t key;
    int64_t pos; /* 0: empty slot */
} Entry;

typedef struct {
    PyObject_HEAD
    /* key -> position: open addressing, linear probing, backward-shift deletion */
    Entry *tab;
    uint64_t tab_mask;
    int64_t tab_live;
    /* keys below DIRECT_KEYS (readers' dense ids): position by index, no hashing */
    int64_t *direct;
    int64_t direct_len;
    int64_t live;
    /* per position 1..size: Fenwick counts, owner key, commit time (NaN = vacated) */
    int32_t *fen;
    uint64_t *owner;
    double *tpos;
    int64_t size, clock, lo;
    /* points: caps[p * 3 + tier] in (sampled) blocks, UNBOUNDED = unbounded */
    int npoints;
    int64_t *caps;
    int64_t keep_depth, keep_depth_no_retention;
    double retention_s, time_scale, now_s;
    int has_retention;
    double keep_tokens, rate;
    uint64_t sample_below; /* track a key iff mix64(key) < sample_below (rate 1: all) */
    int sampled;
    int64_t max_bytes;
    /* totals per point */
    int64_t *tier_tokens, *tier_blocks;
    double *ratio_sum, *replay_tokens;
    int64_t *bucket_tokens; /* [point][bucket] hit tokens of the tracked blocks */
    int64_t requests, input_tokens, ratio_requests, accesses, tracked_accesses;
    /* scratch for one request */
    int64_t *depth, *chain_index, *old_pos;
    int64_t **entry; /* each tracked block's position field, from the look-up */
    int32_t *carry;
    uint8_t *expired, *bucket;
    Py_ssize_t scratch;
    char error[160]; /* set by the core, which runs without the GIL; raised by feed() */
    uint64_t tab_gen; /* bumped when the table is rebuilt: cached Entry pointers go stale */
} Stack;

/* ---- errors: the core runs without the GIL, so it only notes them ----------------------- */

static void fail_oom(Stack *s) { snprintf(s->error, sizeof s->error, "out of memory"); }

static void fail_limit(Stack *s, int64_t need) {
    snprintf(s->error, sizeof s->error, "needs %lld bytes for %lld live blocks", (long long)need,
             (long long)s->live);
}

/* ---- Fenwick ------------------------------------------------------------------------ */

static inline void fen_add(int32_t *fen, int64_t size, int64_t i, int32_t d) {
    for (; i <= size; i += i & -i) fen[i] += d;
}

static inline int64_t fen_prefix(const int32_t *fen, int64_t i) {
    int64_t s = 0;
    for (; i > 0; i &= i - 1) s += fen[i];
    return s;
}

/* Add d at every position of [a, b]: O(b - a + log^2 size) instead of O((b - a) log size).
 * Each node's share from inside the range is carried to its parent; only the O(log size)
 * nodes whose parent lies beyond b walk up to the root. */
static void fen_add_run(int32_t *fen, int64_t size, int64_t a, int64_t b, int32_t d,
                        int32_t *carry) {
    for (int64_t i = a; i <= b; i++) carry[i - a] = d;
    for (int64_t i = a; i <= b; i++) {
        int32_t v = carry[i - a];
        fen[i] += v;
        int64_t j = i + (i & -i);
        if (j <= b) carry[j - a] += v;
        else fen_add(fen, size, j, v);
    }
}

/* ---- hash table ----------------------------------------------------------------------- */

static int64_t stack_bytes(const Stack *s, uint64_t tab_slots, int64_t size) {
    return (int64_t)(tab_slots * sizeof(Entry)) + s->direct_len * (int64_t)sizeof(int64_t) +
           (size + 1) * (int64_t)(sizeof(int32_t) + sizeof(uint64_t) + sizeof(double));
}

static int over_limit(Stack *s, uint64_t tab_slots, int64_t size) {
    int64_t need = stack_bytes(s, tab_slots, size);
    if (s->max_bytes > 0 && need > s->max_bytes) {
        fail_limit(s, need);
        return 1;
    }
    return 0;
}

static Entry *tab_find(Stack *s, uint64_t key) {
    uint64_t i = mix64(key) & s->tab_mask;
    for (;;) {
        Entry *e = &s->tab[i];
        if (e->pos == 0) return NULL;
        if (e->key == key) return e;
        i = (i + 1) & s->tab_mask;
    }
}

static int tab_grow(Stack *s) {
    uint64_t old_n = s->tab_mask + 1, n = old_n * 2;
    if (over_limit(s, n, s->size)) return -1;
    Entry *t = calloc(n, sizeof(Entry));
    if (!t) {
        fail_oom(s);
        return -1;
    }
    for (uint64_t j = 0; j < old_n; j++) {
        Entry *e = &s->tab[j];
        if (e->pos == 0) continue;
        uint64_t i = mix64(e->key) & (n - 1);
        while (t[i].pos != 0) i = (i + 1) & (n - 1);
        t[i] = *e;
    }
    free(s->tab);
    s->tab = t;
    s->tab_mask = n - 1;
    s->tab_gen++;
    return 0;
}

/* The entry for key, inserted (pos 0 filled in by the caller) if absent. */
static Entry *tab_upsert(Stack *s, uint64_t key, int *inserted) {
    if ((uint64_t)(s->tab_live + 1) * 2 > s->tab_mask + 1 && tab_grow(s) < 0) return NULL;
    uint64_t i = mix64(key) & s->tab_mask;
    for (;;) {
        Entry *e = &s->tab[i];
        if (e->pos == 0) {
            e->key = key;
            s->tab_live++;
            *inserted = 1;
            return e;
        }
        if (e->key == key) {
            *inserted = 0;
            return e;
        }
        i = (i + 1) & s->tab_mask;
    }
}

static void tab_delete(Stack *s, Entry *e) {
    uint64_t mask = s->tab_mask, i = (uint64_t)(e - s->tab), j = i;
    e->pos = 0;
    s->tab_live--;
    for (;;) { /* backward shift: no tombstones, probe chains stay short */
        j = (j + 1) & mask;
        Entry *f = &s->tab[j];
        if (f->pos == 0) return;
        uint64_t home = mix64(f->key) & mask;
        /* f may move to the hole at i iff i lies cyclically in [home, j) */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            s->tab[i] = *f;
            f->pos = 0;
            i = j;
        }
    }
}

/* The position field of key (0 = absent), or NULL if the key has none. Keys below
 * direct_len are indexed directly; the rest live in the hash table. */
static inline int64_t *slot_find(Stack *s, uint64_t key) {
    if (key < (uint64_t)s->direct_len) return s->direct[key] ? &s->direct[key] : NULL;
    Entry *e = tab_find(s, key);
    return e ? &e->pos : NULL;
}

/* Extend the direct range to n keys, moving the table's keys below n into it. Only while
 * ids look dense (n within a few times the live blocks): a sparse id space stays hashed. */
static int direct_grow(Stack *s, int64_t n) {
    int64_t need = stack_bytes(s, s->tab_mask + 1, s->size) + (n - s->direct_len) * 8;
    if (s->max_bytes > 0 && need > s->max_bytes) {
        fail_limit(s, need);
        return -1;
    }
    int64_t *d = realloc(s->direct, n * sizeof(int64_t));
    if (!d) {
        fail_oom(s);
        return -1;
    }
    memset(d + s->direct_len, 0, (n - s->direct_len) * sizeof(int64_t));
    s->direct = d;
    s->direct_len = n;
    if (s->tab_live) { /* rebuild the table without the keys now direct */
        uint64_t slots = s->tab_mask + 1;
        Entry *old = s->tab, *t = calloc(slots, sizeof(Entry));
        if (!t) {
            fail_oom(s);
            return -1;
        }
        s->tab = t;
        s->tab_live = 0;
        for (uint64_t j = 0; j < slots; j++) {
            if (old[j].pos == 0) continue;
            if (old[j].key < (uint64_t)n) {
                d[old[j].key] = old[j].pos;
                continue;
            }
            uint64_t i = mix64(old[j].key) & s->tab_mask;
            while (t[i].pos != 0) i = (i + 1) & s->tab_mask;
            t[i] = old[j];
            s->tab_live++;
        }
        free(old);
    }
    s->tab_gen++;
    return 0;
}

/* The position field of key, made (0, *inserted = 1) if absent; NULL on error. */
static inline int64_t *slot_upsert(Stack *s, uint64_t key, int *inserted) {
    if (key >= (uint64_t)s->direct_len && key < DIRECT_KEYS) {
        int64_t n = s->direct_len ? s->direct_len : 1024;
        while (n <= (int64_t)key) n *= 2;
        if (n <= DENSE_FACTOR * (s->live + 65536) && direct_grow(s, n) < 0) return NULL;
    }
    if (key < (uint64_t)s->direct_len) {
        *inserted = s->direct[key] == 0;
        return &s->direct[key];
    }
    Entry *e = tab_upsert(s, key, inserted);
    return e ? &e->pos : NULL;
}

static inline void slot_delete(Stack *s, uint64_t key) {
    if (key < (uint64_t)s->direct_len) s->direct[key] = 0;
    else tab_delete(s, tab_find(s, key));
}

/* ---- positions -------------------------------------------------------------------------- */

/* Renumber live blocks 1..live in recency order, with room for `incoming` more and as many
 * again as live (ROOM): a renumbering then pays for itself over that many accesses. The
 * arrays are reused (compacted in place) unless they must grow. */
static int renumber(Stack *s, int64_t incoming) {
    int64_t n = ROOM * (s->live + incoming);
    if (n < 1024) n = 1024;
    if (n > s->size) {
        if (over_limit(s, s->tab_mask + 1, n)) return -1;
        int32_t *fen = realloc(s->fen, (n + 1) * sizeof(int32_t));
        if (fen) s->fen = fen;
        uint64_t *owner = realloc(s->owner, (n + 1) * sizeof(uint64_t));
        if (owner) s->owner = owner;
        double *tpos = realloc(s->tpos, (n + 1) * sizeof(double));
        if (tpos) s->tpos = tpos;
        if (!fen || !owner || !tpos) {
            fail_oom(s);
            return -1;
        }
        s->size = n;
    }
    int64_t k = 0;
    for (int64_t p = s->lo; p <= s->clock; p++) { /* k <= p: moving down is safe in place */
        if (p + PREFETCH <= s->clock && s->owner[p + PREFETCH] >= (uint64_t)s->direct_len)
            __builtin_prefetch(&s->tab[mix64(s->owner[p + PREFETCH]) & s->tab_mask]);
        if (isnan(s->tpos[p])) continue;
        k++;
        s->owner[k] = s->owner[p];
        s->tpos[k] = s->tpos[p];
        *slot_find(s, s->owner[k]) = k;
    }
    int32_t *fen = s->fen;
    memset(fen, 0, (s->size + 1) * sizeof(int32_t));
    for (int64_t i = 1; i <= s->size; i++) { /* Fenwick of k leading ones, built in O(n) */
        if (i <= k) fen[i] += 1;
        int64_t j = i + (i & -i);
        if (j <= s->size) fen[j] += fen[i];
    }
    s->clock = k, s->lo = 1;
    return 0;
}

/* Drop blocks off the bottom that no point can ever hit again (see the top comment). */
static void prune(Stack *s, double cutoff) {
    while (s->lo <= s->clock) {
        int64_t p = s->lo;
        double t = s->tpos[p];
        if (!isnan(t)) {
            int deep = s->live > s->keep_depth;
            int idle = s->has_retention && t < cutoff && s->live > s->keep_depth_no_retention;
            if (!deep && !idle) return;
            slot_delete(s, s->owner[p]);
            fen_add(s->fen, s->size, p, -1);
            s->tpos[p] = NAN;
            s->live--;
        }
        s->lo++;
    }
}

static int ensure_scratch(Stack *s, Py_ssize_t n) {
    if (n <= s->scratch) return 0;
    Py_ssize_t m = n > 2 * s->scratch ? n : 2 * s->scratch;
    void *p;
#define GROW(field, type)                                   \
    if (!(p = realloc(s->field, m * sizeof(type)))) goto oom; \
    s->field = p;
    GROW(depth, int64_t)
    GROW(chain_index, int64_t)
    GROW(old_pos, int64_t)
    GROW(entry, int64_t *)
    GROW(carry, int32_t)
    GROW(expired, uint8_t)
    GROW(bucket, uint8_t)
#undef GROW
    s->scratch = m;
    return 0;
oom:
    fail_oom(s);
    return -1;
}

static inline int64_t block_weight(int64_t j, int64_t b, int64_t big_l) {
    int64_t w = big_l - j * b;
    return w <= 0 ? 0 : (w < b ? w : b);
}

/* Decrement the Fenwick counts at old positions, a run of consecutive ones at a time (a
 * chain committed together sits on consecutive positions: the common case). */
static void remove_runs(Stack *s, int64_t *pos, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t j = i + 1;
        while (j < n && pos[j] == pos[j - 1] + 1) j++;
        if (j - i > 8)
            fen_add_run(s->fen, s->size, pos[i], pos[j - 1], -1, s->carry);
        else
            for (Py_ssize_t k = i; k < j; k++) fen_add(s->fen, s->size, pos[k], -1);
        i = j;
    }
}

/* Commit the tracked blocks last -> first: each moves to a fresh position on top. */
static int commit(Stack *s, const uint64_t *keys, Py_ssize_t m) {
    int64_t first = s->clock + 1;
    Py_ssize_t removed = 0;
    uint64_t gen = s->tab_gen;
    for (Py_ssize_t k = m - 1; k >= 0; k--) {
        uint64_t key = keys[s->chain_index[k]];
        int64_t *e = gen == s->tab_gen ? s->entry[k] : NULL;
        if (!e) { /* absent at the look-up, or the table was rebuilt since */
            int inserted;
            e = slot_upsert(s, key, &inserted);
            if (!e) return -1;
            if (inserted) s->live++;
        }
        if (*e) { /* old counts go in one pass below; the new ones as one run */
            s->old_pos[removed++] = *e;
            s->tpos[*e] = NAN;
        }
        int64_t p = ++s->clock;
        *e = p;
        s->owner[p] = key;
        s->tpos[p] = s->now_s;
    }
    if (s->clock >= first) fen_add_run(s->fen, s->size, first, s->clock, 1, s->carry);
    remove_runs(s, s->old_pos, removed);
    return 0;
}

static int one_request(Stack *s, const uint64_t *keys, Py_ssize_t n, double t, int64_t big_l,
                       int64_t b) {
    double now = t * s->time_scale; /* the simulator's arithmetic, bit for bit */
    if (now > s->now_s) s->now_s = now;
    double cutoff = s->now_s - s->retention_s;
    prune(s, cutoff);
    if (ensure_scratch(s, n) < 0) return -1;
    if (s->clock + n > s->size && renumber(s, n) < 0) return -1;
    /* look-up: the depths of the tracked blocks before this request's commit */
    Py_ssize_t m = 0;
    int64_t *depth = s->depth, *chain_index = s->chain_index;
    uint8_t *expired = s->expired;
    int64_t prev_pos = -1, prev_depth = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        /* the table is bigger than the caches: ask for a later key's slot early */
        if (j + PREFETCH < n && keys[j + PREFETCH] >= (uint64_t)s->direct_len)
            __builtin_prefetch(&s->tab[mix64(keys[j + PREFETCH]) & s->tab_mask]);
        uint64_t h = s->sampled ? mix64(keys[j]) : 0;
        if (h >= s->sample_below) continue;
        s->bucket[m] = (uint8_t)(h % BUCKETS); /* low bits: independent of the rate's test */
        chain_index[m] = j;
        int64_t *e = slot_find(s, keys[j]);
        s->entry[m] = e;
        if (!e) {
            depth[m] = UNTRACKED;
            expired[m] = 1;
        } else {
            int64_t p = *e;
            /* the previous commit put this chain on consecutive positions, b_1 on top */
            depth[m] = p == prev_pos - 1 ? prev_depth + 1
                                         : s->live - fen_prefix(s->fen, p - 1);
            expired[m] = s->has_retention && s->tpos[p] < cutoff;
            prev_pos = p;
            prev_depth = depth[m];
        }
        m++;
    }
    s->requests++;
    s->input_tokens += big_l;
    if (big_l > 0) s->ratio_requests++;
    s->accesses += n;
    s->tracked_accesses += m;
    /* every point: the longest tracked prefix present in the union, fastest tier first */
    for (int p = 0; p < s->npoints; p++) {
        const int64_t *cap = &s->caps[p * TIERS];
        int64_t hit = 0, tok[TIERS] = {0, 0, 0}, blk[TIERS] = {0, 0, 0};
        for (Py_ssize_t k = 0; k < m; k++) {
            int64_t d = depth[k];
            int tier;
            if (d <= cap[0]) tier = 0;
            else if (d <= cap[1]) tier = 1;
            else if (d <= cap[2] && !expired[k]) tier = 2;
            else break;
            int64_t w = block_weight(chain_index[k], b, big_l);
            tok[tier] += w;
            blk[tier] += 1;
            hit += w;
            if (s->sampled) s->bucket_tokens[p * BUCKETS + s->bucket[k]] += w;
        }
        for (int i = 0; i < TIERS; i++) {
            s->tier_tokens[p * TIERS + i] += tok[i];
            s->tier_blocks[p * TIERS + i] += blk[i];
        }
        double h = s->sampled ? (double)hit / s->rate : (double)hit;
        if (s->sampled && h > (double)big_l) h = (double)big_l;
        if (big_l > 0) s->ratio_sum[p] += h / (double)big_l;
        if (h > 0) s->replay_tokens[p] += h < s->keep_tokens ? h : s->keep_tokens;
    }
    if (commit(s, keys, m) < 0) return -1;
    prune(s, cutoff);
    return 0;
}

/* ---- the Python type ---------------------------------------------------------------------- */

static int get_buffer(PyObject *o, Py_buffer *v, Py_ssize_t itemsize, const char *what) {
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (v->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes", what, itemsize);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static void Stack_dealloc(Stack *s) {
    free(s->tab), free(s->direct), free(s->fen), free(s->owner), free(s->tpos), free(s->caps);
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
    if (get_buffer(caps_obj, &cb, 8, "caps") < 0) return -1;
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
    if (!s->caps || !s->tier_tokens || !s->tier_blocks || !s->ratio_sum || !s->replay_tokens || !s->bucket_tokens ||
        !s->tab || !s->fen || !s->owner || !s->tpos) {
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
    Py_buffer kb, ob, tb, lb;
    if (get_buffer(ko, &kb, 8, "keys") < 0) return NULL;
    if (get_buffer(oo, &ob, 8, "offsets") < 0) goto rel_k;
    if (get_buffer(to, &tb, 8, "times") < 0) goto rel_o;
    if (get_buffer(lo, &lb, 8, "lengths") < 0) goto rel_t;
    Py_ssize_t r = tb.len / 8, nk = kb.len / 8;
    const int64_t *off = ob.buf, *len = lb.buf;
    const double *t = tb.buf;
    const uint64_t *keys = kb.buf;
    int ok = ob.len / 8 == r + 1 && lb.len / 8 == r && (r == 0 || (off[0] >= 0 && off[r] <= nk));
    for (Py_ssize_t i = 0; ok && i < r; i++) ok = off[i] <= off[i + 1] && len[i] >= 0;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "feed: inconsistent offsets, times or lengths");
        goto rel_l;
    }
    int rc = 0;
    s->error[0] = 0;
    /* The GIL is released: a reader thread parses the next batch meanwhile. The caller
     * must not use this Stack from another thread during a feed (OnePass never does). */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < r && rc == 0; i++)
        rc = one_request(s, keys + off[i], (Py_ssize_t)(off[i + 1] - off[i]), t[i], len[i], b);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&lb), PyBuffer_Release(&tb), PyBuffer_Release(&ob), PyBuffer_Release(&kb);
    if (rc < 0) {
        PyErr_SetString(PyExc_MemoryError, s->error[0] ? s->error : "out of memory");
        return NULL;
    }
    Py_RETURN_NONE;
rel_l:
    PyBuffer_Release(&lb);
rel_t:
    PyBuffer_Release(&tb);
rel_o:
    PyBuffer_Release(&ob);
rel_k:
    PyBuffer_Release(&kb);
    return NULL;
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
        if (isnan(s->tpos[p])) continue;
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

/* ---- kv-cache-tester documents --------------------------------------------------------- */

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
static PyObject *mod_split_hash_ids(PyObject *m, PyObject *arg) {
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

static PyMethodDef module_methods[] = {
    {"mix64", mod_mix, METH_O, "the key hash used for sampling and the table"},
    {"split_hash_ids", mod_split_hash_ids, METH_O, "kv-cache-tester ids out of a document"},
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
    return m;
}
