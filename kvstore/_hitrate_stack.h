/* The one-pass engine's state, shared by _hitrate_stack.c (the replay, no Python objects,
 * run without the GIL) and _hitrate.c (the Python type). See _hitrate_stack.c. */
#ifndef KVSTORE_HITRATE_STACK_H
#define KVSTORE_HITRATE_STACK_H
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
    double *tpos;     /* commit time per position: non-decreasing, live or not */
    uint64_t *alive;  /* bit per position: a block's current one (vacated ones clear) */
    int64_t fresh;    /* first position committed at or after the retention cutoff */
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


static inline int64_t fen_prefix(const int32_t *fen, int64_t i) {
    int64_t s = 0;
    for (; i > 0; i &= i - 1) s += fen[i];
    return s;
}

static inline int is_alive(const Stack *s, int64_t p) { return (s->alive[p >> 6] >> (p & 63)) & 1; }

int64_t stack_bytes(const Stack *s, uint64_t tab_slots, int64_t size);
int64_t *slot_find(Stack *s, uint64_t key);
int one_request(Stack *s, const uint64_t *keys, Py_ssize_t n, double t, int64_t big_l, int64_t b);

/* _hitrate_split.c */
PyObject *hitrate_split_hash_ids(PyObject *m, PyObject *arg);

#endif
