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
 * renumbered in place when the clock reaches the end of the arrays, so they stay within
 * ROOM times the live blocks (plus one request).
 *
 * SHARDS (Waldspurger et al., FAST 2015): with a rate R < 1 only keys whose hash falls
 * under R x 2^64 are tracked; a sampled depth d stands for d / R, so the points' capacities
 * are scaled by R here and the sampled blocks' tokens by 1 / R in Python.
 */
#include "_hitrate_stack.h"

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

int64_t stack_bytes(const Stack *s, uint64_t tab_slots, int64_t size) {
    return (int64_t)(tab_slots * sizeof(Entry)) + s->direct_len * (int64_t)sizeof(int64_t) +
           (size + 1) * (int64_t)(sizeof(int32_t) + sizeof(uint64_t) + sizeof(double)) +
           (size / 64 + 1) * (int64_t)sizeof(uint64_t);
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
int64_t *slot_find(Stack *s, uint64_t key) {
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
        uint64_t *alive = realloc(s->alive, (n / 64 + 1) * sizeof(uint64_t));
        if (alive) s->alive = alive;
        if (!fen || !owner || !tpos || !alive) {
            fail_oom(s);
            return -1;
        }
        s->size = n;
    }
    int64_t k = 0;
    for (int64_t p = s->lo; p <= s->clock; p++) { /* k <= p: moving down is safe in place */
        if (p + PREFETCH <= s->clock && s->owner[p + PREFETCH] >= (uint64_t)s->direct_len)
            __builtin_prefetch(&s->tab[mix64(s->owner[p + PREFETCH]) & s->tab_mask]);
        if (!is_alive(s, p)) continue;
        k++;
        s->owner[k] = s->owner[p];
        s->tpos[k] = s->tpos[p];
        *slot_find(s, s->owner[k]) = k;
    }
    memset(s->alive, 0, (s->size / 64 + 1) * sizeof(uint64_t));
    for (int64_t i = 1; i <= k; i++) s->alive[i >> 6] |= UINT64_C(1) << (i & 63);
    int32_t *fen = s->fen;
    memset(fen, 0, (s->size + 1) * sizeof(int32_t));
    for (int64_t i = 1; i <= s->size; i++) { /* Fenwick of k leading ones, built in O(n) */
        if (i <= k) fen[i] += 1;
        int64_t j = i + (i & -i);
        if (j <= s->size) fen[j] += fen[i];
    }
    s->clock = k, s->lo = 1, s->fresh = 1;
    return 0;
}

/* Drop blocks off the bottom that no point can ever hit again (see the top comment). */
static void prune(Stack *s, double cutoff) {
    while (s->lo <= s->clock) {
        int64_t p = s->lo;
        if (is_alive(s, p)) {
            int deep = s->live > s->keep_depth;
            int idle =
                s->has_retention && s->tpos[p] < cutoff && s->live > s->keep_depth_no_retention;
            if (!deep && !idle) return;
            slot_delete(s, s->owner[p]);
            fen_add(s->fen, s->size, p, -1);
            s->alive[p >> 6] &= ~(UINT64_C(1) << (p & 63));
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
            s->alive[*e >> 6] &= ~(UINT64_C(1) << (*e & 63));
        }
        int64_t p = ++s->clock;
        *e = p;
        s->owner[p] = key;
        s->tpos[p] = s->now_s;
        s->alive[p >> 6] |= UINT64_C(1) << (p & 63);
    }
    if (s->clock >= first) fen_add_run(s->fen, s->size, first, s->clock, 1, s->carry);
    remove_runs(s, s->old_pos, removed);
    return 0;
}

int one_request(Stack *s, const uint64_t *keys, Py_ssize_t n, double t, int64_t big_l,
                       int64_t b) {
    double now = t * s->time_scale; /* the simulator's arithmetic, bit for bit */
    if (now > s->now_s) s->now_s = now;
    double cutoff = s->now_s - s->retention_s;
    prune(s, cutoff);
    if (ensure_scratch(s, n) < 0) return -1;
    if (s->clock + n > s->size && renumber(s, n) < 0) return -1;
    /* Times only grow with positions, so "idle past the retention" is "below one position":
     * found by a pointer that only moves up, not by reading each block's time. */
    if (s->fresh < s->lo) s->fresh = s->lo;
    while (s->has_retention && s->fresh <= s->clock && s->tpos[s->fresh] < cutoff) s->fresh++;
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
            expired[m] = p < s->fresh;
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

