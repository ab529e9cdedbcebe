/* The S3-FIFO replay's state, shared by _hitrate_s3fifo.c (the replay, no Python objects,
 * run without the GIL) and _hitrate_s3fifo_type.c (the Python type). See _hitrate_s3fifo.c. */
#ifndef KVSTORE_HITRATE_S3FIFO_H
#define KVSTORE_HITRATE_S3FIFO_H
#include "_hitrate_stack.h"

/* where a block sits in one tier (low 2 bits of its state byte; the counter above them) */
#define S3_NONE 0
#define S3_SMALL 1
#define S3_MAIN 2
#define S3_GHOST 3
#define S3_MAX_FREQ 3
#define S3_UNBOUNDED INT64_MAX

typedef struct {
    uint32_t head, tail; /* block ids, 0 = none */
    int64_t len;
} S3Queue;

/* One S3-FIFO (kvstore/eviction/s3fifo.py) over block ids: the state of every tier of every
 * point with its capacity and expiry. */
typedef struct {
    int64_t cap; /* blocks; S3_UNBOUNDED */
    int64_t small_target, ghost_limit;
    int expires; /* the SSD with a finite retention */
    /* riding: it never had to evict, so it equals the unbounded state of its expiry class
     * (states[expires]) and has no arrays of its own until forked from it; dead: an unbounded
     * state nobody reads any more (no tier is unbounded, none rides it) */
    int riding, dead;
    int riders, direct; /* unbounded states: finite ones riding it, unbounded tiers using it */
    uint32_t *prev, *next; /* queue links, by block id */
    uint8_t *st;           /* where | freq << 2, by block id */
    S3Queue q[4];          /* by where: q[S3_SMALL], q[S3_MAIN], q[S3_GHOST] */
} S3Tier;

typedef struct {
    uint64_t key;
    uint32_t id; /* 0: empty slot */
} S3Slot;

typedef struct {
    PyObject_HEAD
    /* key -> block id (1..nids), for every key ever seen: ids index every tier's arrays */
    S3Slot *tab;
    uint64_t tab_mask;
    uint32_t nids, ids_size;
    uint64_t *key_of;
    /* the last commit time of every block, as a list in that order (retention only): the
     * same in every tier, since each commit touches its whole chain in every tier */
    double *last_t;
    uint32_t *rprev, *rnext;
    uint32_t rhead, rtail;
    int npoints;
    int nstates;
    S3Tier *states;  /* [0], [1]: unbounded without / with expiry; then one per distinct
                        (capacity, expiry): the hbm of every point of an ssd sweep is one */
    int *tier_state; /* [point * TIERS + tier]: index in states; -1 = absent (or 0 blocks) */
    double retention_s, time_scale, now_s;
    int expiring; /* a finite retention and an SSD in some point */
    int64_t keep_tokens;
    /* totals per point */
    int64_t *tier_tokens, *tier_blocks, *replay_tokens;
    double *ratio_sum;
    int64_t requests, input_tokens, ratio_requests, accesses;
    /* scratch: one request's block ids; per point its tiers' states and its hits (tokens
     * and blocks per tier, total tokens) */
    uint32_t *ids;
    const S3Tier **views;
    int64_t *hits;
    Py_ssize_t scratch;
    char error[160]; /* set by the core, which runs without the GIL; raised by feed() */
} S3Fifo;

static inline int is_live(const S3Tier *T) { return !T->riding && !T->dead; }

int s3_init(S3Fifo *s, const int64_t *caps, Py_ssize_t n);
void s3_free(S3Fifo *s);
int s3_request(S3Fifo *s, const uint64_t *keys, Py_ssize_t n, double t, int64_t big_l, int64_t b);
int64_t s3_bytes(const S3Fifo *s);
const char *s3_check(const S3Fifo *s);

/* _hitrate.c */
int hitrate_get_buffer(PyObject *o, Py_buffer *v, Py_ssize_t itemsize, const char *what);
/* One feed's batch (keys u64[], offsets i64[R+1], times f64[R], lengths i64[R]): the four
 * buffers held and checked consistent by hitrate_batch_get (-1 with the error set, nothing
 * held), given back by hitrate_batch_release. Shared by both replays' feed. */
typedef struct {
    Py_buffer kb, ob, tb, lb;
    Py_ssize_t requests;
    const uint64_t *keys;
    const int64_t *offsets, *lengths;
    const double *times;
} HitrateBatch;
int hitrate_batch_get(HitrateBatch *h, PyObject *ko, PyObject *oo, PyObject *to, PyObject *lo);
void hitrate_batch_release(HitrateBatch *h);
/* _hitrate_s3fifo_type.c */
int hitrate_add_s3fifo(PyObject *m);

#endif
