/* The S3-FIFO replay of kvstore hitrate (kvstore/hitrate/s3replay.py): every point's DESIGN
 * §10 totals from one read of the input, one S3-FIFO per tier and point.
 *
 * S3-FIFO has no inclusion property (a bigger cache does not hold a superset), so unlike the
 * LRU stack (_hitrate_stack.c) each point is its own simulation. What is shared is all that
 * does not depend on the capacity: the key -> block id table (looked up once per access,
 * not once per point), and the SSD's idle expiry. A block's last commit time is the same in
 * every tier of every point (each commit touches its whole chain everywhere), so one list of
 * blocks in commit-time order finds the idle ones for all points at once; removing a set of
 * blocks from the queues leaves the same queues in whatever order it is done, so the result
 * equals the simulator's expiry, chain by chain.
 *
 * Each tier follows kvstore/eviction/s3fifo.py step for step (a small FIFO of 10 % of the
 * capacity, a main FIFO, a ghost FIFO of keys evicted from the small queue, counters
 * saturating at 3), on arrays indexed by block id: 9 bytes per block and tier.
 *
 * Tiers of equal capacity and expiry (the HBM of every point of an SSD sweep) are one state.
 * A finite tier that has never had to evict equals an unbounded one of its expiry class, so
 * it rides that state, without arrays of its own, until a commit could take it past its
 * capacity; then it forks (copies the arrays). The large points of a sweep that never fill
 * up cost nothing beyond the one unbounded state.
 */
#include "_hitrate_s3fifo.h"

static void fail_oom(S3Fifo *s) { snprintf(s->error, sizeof s->error, "out of memory"); }

/* ---- queues (links by block id in the tier's arrays) ----------------------------------- */

static inline void q_push(S3Tier *T, int w, uint32_t g, int freq) {
    S3Queue *q = &T->q[w];
    T->prev[g] = q->tail;
    T->next[g] = 0;
    if (q->tail) T->next[q->tail] = g;
    else q->head = g;
    q->tail = g;
    q->len++;
    T->st[g] = (uint8_t)(w | freq << 2);
}

static inline void q_unlink(S3Tier *T, int w, uint32_t g) {
    S3Queue *q = &T->q[w];
    uint32_t p = T->prev[g], n = T->next[g];
    if (p) T->next[p] = n;
    else q->head = n;
    if (n) T->prev[n] = p;
    else q->tail = p;
    q->len--;
    T->st[g] = S3_NONE;
}

static inline uint32_t q_pop(S3Tier *T, int w) {
    uint32_t g = T->q[w].head;
    q_unlink(T, w, g);
    return g;
}

/* ---- one tier: kvstore/eviction/s3fifo.py's access() and _next_victim() ---------------- */

static void evict_one(S3Tier *T) {
    S3Queue *small = &T->q[S3_SMALL], *main = &T->q[S3_MAIN];
    while (small->len || main->len) {
        if (small->len && (small->len >= T->small_target || !main->len)) {
            uint32_t g = small->head;
            int f = T->st[g] >> 2;
            q_unlink(T, S3_SMALL, g);
            if (f > 0) { /* re-used while on probation: promoted */
                q_push(T, S3_MAIN, g, 0);
                continue;
            }
            q_push(T, S3_GHOST, g, 0);
            while (T->q[S3_GHOST].len > T->ghost_limit) q_pop(T, S3_GHOST);
            return;
        }
        uint32_t g = main->head;
        int f = T->st[g] >> 2;
        q_unlink(T, S3_MAIN, g);
        if (f > 0) { /* re-used: another round, one count less */
            q_push(T, S3_MAIN, g, f - 1);
            continue;
        }
        return;
    }
}

static inline void tier_access(S3Tier *T, uint32_t g) {
    uint8_t st = T->st[g];
    int w = st & 3;
    if (w == S3_SMALL || w == S3_MAIN) {
        if ((st >> 2) < S3_MAX_FREQ) T->st[g] = (uint8_t)(st + 4);
        return;
    }
    if (w == S3_GHOST) {
        q_unlink(T, S3_GHOST, g);
        q_push(T, S3_MAIN, g, 0);
    } else {
        q_push(T, S3_SMALL, g, 0);
    }
    while (T->q[S3_SMALL].len + T->q[S3_MAIN].len > T->cap) evict_one(T);
}

static inline int tier_holds(const S3Tier *T, uint32_t g) {
    if (!T) return 0; /* absent */
    int w = T->st[g] & 3;
    return w == S3_SMALL || w == S3_MAIN;
}

/* The state that answers for tier `i` of point `p`: its own, or the one it rides. */
static inline const S3Tier *view(const S3Fifo *s, int p, int i) {
    int k = s->tier_state[p * TIERS + i];
    if (k < 0) return NULL;
    const S3Tier *T = &s->states[k];
    return T->riding ? &s->states[T->expires] : T;
}

/* T stops riding: it takes a copy of the unbounded state it equals (before the commit that
 * could make it evict for the first time). The unbounded state dies with its last reader. */
static int fork_state(S3Fifo *s, S3Tier *T) {
    S3Tier *U = &s->states[T->expires];
    size_t n = s->ids_size;
    T->prev = malloc(n * sizeof(uint32_t));
    T->next = malloc(n * sizeof(uint32_t));
    T->st = malloc(n);
    if (!T->prev || !T->next || !T->st) {
        fail_oom(s);
        return -1;
    }
    memcpy(T->prev, U->prev, n * sizeof(uint32_t));
    memcpy(T->next, U->next, n * sizeof(uint32_t));
    memcpy(T->st, U->st, n);
    memcpy(T->q, U->q, sizeof T->q);
    T->riding = 0;
    if (--U->riders == 0 && !U->direct) {
        free(U->prev), free(U->next), free(U->st);
        U->prev = U->next = NULL;
        U->st = NULL;
        U->dead = 1;
    }
    return 0;
}

/* ---- block ids ---------------------------------------------------------------------------- */

static int grow_ids(S3Fifo *s) {
    uint32_t size = s->ids_size ? s->ids_size * 2 : 1024;
    if (size <= s->ids_size) {
        snprintf(s->error, sizeof s->error, "more than 2^32 distinct blocks");
        return -1;
    }
    void *p;
#define GROW(field, type)                                                            \
    if (!(p = realloc(field, (size_t)size * sizeof(type)))) goto oom;                \
    field = p;                                                                       \
    memset((type *)field + s->ids_size, 0, (size_t)(size - s->ids_size) * sizeof(type));
    GROW(s->key_of, uint64_t)
    if (s->expiring) {
        GROW(s->last_t, double)
        GROW(s->rprev, uint32_t)
        GROW(s->rnext, uint32_t)
    }
    for (int i = 0; i < s->nstates; i++) {
        S3Tier *T = &s->states[i];
        if (!is_live(T)) continue;
        GROW(T->prev, uint32_t)
        GROW(T->next, uint32_t)
        GROW(T->st, uint8_t)
    }
#undef GROW
    s->ids_size = size;
    return 0;
oom:
    fail_oom(s);
    return -1;
}

static int grow_table(S3Fifo *s) {
    uint64_t slots = (s->tab_mask + 1) * 2;
    S3Slot *tab = calloc(slots, sizeof(S3Slot));
    if (!tab) {
        fail_oom(s);
        return -1;
    }
    for (uint64_t i = 0; i <= s->tab_mask; i++) {
        if (!s->tab[i].id) continue;
        uint64_t j = mix64(s->tab[i].key) & (slots - 1);
        while (tab[j].id) j = (j + 1) & (slots - 1);
        tab[j] = s->tab[i];
    }
    free(s->tab);
    s->tab = tab;
    s->tab_mask = slots - 1;
    return 0;
}

/* The block id of key, a new one (absent everywhere) if it was never seen; 0 on failure. */
static uint32_t id_of(S3Fifo *s, uint64_t key) {
    uint64_t j = mix64(key) & s->tab_mask;
    for (; s->tab[j].id; j = (j + 1) & s->tab_mask)
        if (s->tab[j].key == key) return s->tab[j].id;
    if ((uint64_t)(s->nids + 1) * 2 > s->tab_mask + 1) { /* load <= 1/2 */
        if (grow_table(s) < 0) return 0;
        for (j = mix64(key) & s->tab_mask; s->tab[j].id; j = (j + 1) & s->tab_mask) {
        }
    }
    if (s->nids + 1 >= s->ids_size && grow_ids(s) < 0) return 0;
    uint32_t g = ++s->nids;
    s->tab[j].key = key;
    s->tab[j].id = g;
    s->key_of[g] = key;
    return g;
}

/* ---- retention: the commit-time list ------------------------------------------------------ */

static inline void r_unlink(S3Fifo *s, uint32_t g) {
    uint32_t p = s->rprev[g], n = s->rnext[g];
    if (p) s->rnext[p] = n;
    else s->rhead = n;
    if (n) s->rprev[n] = p;
    else s->rtail = p;
    s->rprev[g] = s->rnext[g] = 0;
}

static inline void r_commit(S3Fifo *s, uint32_t g, double now) {
    if (s->rtail == g) { /* already last (a repeated key): keep its place */
        s->last_t[g] = now;
        return;
    }
    if (s->rprev[g] || s->rhead == g) r_unlink(s, g);
    s->rprev[g] = s->rtail;
    if (s->rtail) s->rnext[s->rtail] = g;
    else s->rhead = g;
    s->rtail = g;
    s->last_t[g] = now;
}

/* Remove from every expiring tier the blocks last committed before cutoff. */
static void expire(S3Fifo *s, double cutoff) {
    while (s->rhead && s->last_t[s->rhead] < cutoff) {
        uint32_t g = s->rhead;
        r_unlink(s, g);
        for (int i = 0; i < s->nstates; i++) {
            S3Tier *T = &s->states[i];
            int w = T->expires && is_live(T) ? T->st[g] & 3 : S3_NONE;
            if (w == S3_SMALL || w == S3_MAIN) q_unlink(T, w, g);
        }
    }
}

/* ---- the model ---------------------------------------------------------------------------- */

static inline int64_t block_weight(int64_t j, int64_t b, int64_t big_l) {
    int64_t w = big_l - j * b;
    return w <= 0 ? 0 : (w < b ? w : b);
}

int s3_request(S3Fifo *s, const uint64_t *keys, Py_ssize_t n, double t, int64_t big_l, int64_t b) {
    double now = t * s->time_scale; /* the simulator's arithmetic, bit for bit */
    if (now > s->now_s) s->now_s = now;
    if (s->expiring) expire(s, s->now_s - s->retention_s);
    if (n > s->scratch) {
        uint32_t *ids = realloc(s->ids, (size_t)n * sizeof(uint32_t));
        if (!ids) {
            fail_oom(s);
            return -1;
        }
        s->ids = ids;
        s->scratch = n;
    }
    uint32_t *ids = s->ids;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (j + PREFETCH < n) __builtin_prefetch(&s->tab[mix64(keys[j + PREFETCH]) & s->tab_mask]);
        if (!(ids[j] = id_of(s, keys[j]))) return -1;
    }
    s->requests++;
    s->input_tokens += big_l;
    if (big_l > 0) s->ratio_requests++;
    s->accesses += n;
    for (int p = 0; p < s->npoints; p++) {
        const S3Tier **v = &s->views[p * TIERS];
        int64_t *tok = &s->hits[p * 7], *blk = tok + TIERS, *hitp = tok + 6;
        for (int i = 0; i < TIERS; i++) v[i] = view(s, p, i);
        /* a point with the same three states as the one before it (the top of a sweep,
         * riding the unbounded state) has the same hits */
        if (p > 0 && !memcmp(v - TIERS, v, sizeof(*v) * TIERS)) {
            memcpy(tok, tok - 7, 7 * sizeof(int64_t));
        } else {
            memset(tok, 0, 7 * sizeof(int64_t));
            /* the longest prefix present in the union, each block in the fastest tier */
            for (Py_ssize_t j = 0; j < n; j++) {
                uint32_t g = ids[j];
                int i;
                if (tier_holds(v[0], g)) i = 0;
                else if (tier_holds(v[1], g)) i = 1;
                else if (tier_holds(v[2], g)) i = 2;
                else break;
                int64_t w = block_weight(j, b, big_l);
                tok[i] += w;
                blk[i] += 1;
                *hitp += w;
            }
        }
        int64_t hit = *hitp;
        for (int i = 0; i < TIERS; i++) {
            s->tier_tokens[p * TIERS + i] += tok[i];
            s->tier_blocks[p * TIERS + i] += blk[i];
        }
        if (big_l > 0) s->ratio_sum[p] += (double)hit / (double)big_l;
        if (hit > 0) s->replay_tokens[p] += hit < s->keep_tokens ? hit : s->keep_tokens;
    }
    /* commit the chain to every state, last to first; a riding state that this chain could
     * take past its capacity forks first (n bounds the blocks the chain adds) */
    for (int i = 0; i < s->nstates; i++) {
        S3Tier *T = &s->states[i];
        if (!T->riding) continue;
        const S3Queue *q = s->states[T->expires].q;
        if (q[S3_SMALL].len + q[S3_MAIN].len + n > T->cap && fork_state(s, T) < 0) return -1;
    }
    for (int i = 0; i < s->nstates; i++) {
        S3Tier *T = &s->states[i];
        if (!is_live(T)) continue;
        for (Py_ssize_t j = n - 1; j >= 0; j--) tier_access(T, ids[j]);
    }
    if (s->expiring)
        for (Py_ssize_t j = 0; j < n; j++) r_commit(s, ids[j], s->now_s);
    return 0;
}
