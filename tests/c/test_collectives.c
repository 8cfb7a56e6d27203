/* test_collectives: every blocking and non-blocking call of nexar.h with
 * real data, on the world communicator and on split communicators, with
 * several requests in flight. Run under `nexar run -n N` for any N >= 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexar.h"
#include "testutil.h"

static int64_t tri(int64_t n) { return n * (n - 1) / 2; } /* 0+1+...+(n-1) */

static void test_allreduce(nexar_comm_t c, int r, int n) {
    int32_t s[5], d[5];
    for (int i = 0; i < 5; i++) s[i] = r * 10 + i;
    CK(nexar_allreduce(s, d, 5, NEXAR_INT32, NEXAR_SUM, c));
    for (int i = 0; i < 5; i++) EXPECT(d[i] == 10 * tri(n) + n * i, "d[%d]=%d", i, d[i]);
    /* in place */
    CK(nexar_allreduce(s, s, 5, NEXAR_INT32, NEXAR_MAX, c));
    for (int i = 0; i < 5; i++) EXPECT(s[i] == (n - 1) * 10 + i, "max s[%d]=%d", i, s[i]);
    double f[3] = {r + 0.5, -r, 2.0};
    CK(nexar_allreduce(f, f, 3, NEXAR_FLOAT64, NEXAR_AVG, c));
    EXPECT(f[0] == (double)tri(n) / n + 0.5 && f[2] == 2.0, "avg %g %g", f[0], f[2]);
    /* zero count with NULL buffers is fine */
    CK(nexar_allreduce(NULL, NULL, 0, NEXAR_FLOAT32, NEXAR_SUM, c));
}

static void test_broadcast_reduce(nexar_comm_t c, int r, int n) {
    int64_t b[4];
    int root = n - 1;
    for (int i = 0; i < 4; i++) b[i] = r == root ? 1000 + i : -1;
    CK(nexar_broadcast(b, 4, NEXAR_INT64, root, c));
    for (int i = 0; i < 4; i++) EXPECT(b[i] == 1000 + i, "bcast b[%d]=%lld", i, (long long)b[i]);

    int64_t s[3], d[3] = {-1, -1, -1};
    for (int i = 0; i < 3; i++) s[i] = r + i;
    CK(nexar_reduce(s, r == 0 ? d : NULL, 3, NEXAR_INT64, NEXAR_SUM, 0, c));
    if (r == 0)
        for (int i = 0; i < 3; i++) EXPECT(d[i] == tri(n) + n * i, "reduce d[%d]", i);
    /* in place on root */
    CK(nexar_reduce(s, s, 3, NEXAR_INT64, NEXAR_MIN, root, c));
    if (r == root)
        for (int i = 0; i < 3; i++) EXPECT(s[i] == i, "reduce min s[%d]=%lld", i, (long long)s[i]);
}

static void test_gathers(nexar_comm_t c, int r, int n) {
    int32_t s[3], *d = calloc((size_t)n * 3, sizeof *d);
    for (int i = 0; i < 3; i++) s[i] = r * 100 + i;
    CK(nexar_allgather(s, d, 3, NEXAR_INT32, c));
    for (int k = 0; k < n; k++)
        for (int i = 0; i < 3; i++) EXPECT(d[k * 3 + i] == k * 100 + i, "allgather");
    memset(d, 0, (size_t)n * 3 * sizeof *d);
    memcpy(d + r * 3, s, sizeof s);
    CK(nexar_allgather(d, d, 3, NEXAR_INT32, c)); /* in place */
    for (int k = 0; k < n; k++) EXPECT(d[k * 3 + 2] == k * 100 + 2, "allgather in place");

    /* gather to root 0, then in place on root n-1 */
    memset(d, 0, (size_t)n * 3 * sizeof *d);
    CK(nexar_gather(s, r == 0 ? d : NULL, 3, NEXAR_INT32, 0, c));
    if (r == 0)
        for (int k = 0; k < n; k++) EXPECT(d[k * 3 + 1] == k * 100 + 1, "gather");
    memset(d, 0, (size_t)n * 3 * sizeof *d);
    if (r == n - 1) memcpy(d + r * 3, s, sizeof s);
    CK(nexar_gather(r == n - 1 ? d : s, d, 3, NEXAR_INT32, n - 1, c));
    if (r == n - 1)
        for (int k = 0; k < n; k++) EXPECT(d[k * 3] == k * 100, "gather in place");

    /* scatter from root 0: rank k gets block k */
    for (int k = 0; k < n * 3; k++) d[k] = 7000 + k;
    int32_t got[3] = {0, 0, 0};
    CK(nexar_scatter(r == 0 ? d : NULL, got, 3, NEXAR_INT32, 0, c));
    for (int i = 0; i < 3; i++) EXPECT(got[i] == 7000 + r * 3 + i, "scatter got[%d]=%d", i, got[i]);
    free(d);
}

static void test_vforms(nexar_comm_t c, int r, int n) {
    /* rank k contributes k+1 elements, packed in rank order */
    size_t *counts = calloc((size_t)n, sizeof(size_t)), *displs = calloc((size_t)n, sizeof(size_t));
    size_t total = 0;
    for (int k = 0; k < n; k++) {
        counts[k] = (size_t)k + 1;
        displs[k] = total;
        total += counts[k];
    }
    int32_t *mine = calloc((size_t)r + 1, sizeof(int32_t)), *all = calloc(total, sizeof(int32_t));
    for (int i = 0; i <= r; i++) mine[i] = r * 100 + i;
    CK(nexar_allgatherv(mine, (size_t)r + 1, all, counts, displs, NEXAR_INT32, c));
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < counts[k]; i++)
            EXPECT(all[displs[k] + i] == k * 100 + (int)i, "allgatherv rank %d elem %zu", k, i);

    memset(all, 0, total * sizeof(int32_t));
    int root = n / 2;
    CK(nexar_gatherv(mine, (size_t)r + 1, r == root ? all : NULL, r == root ? counts : NULL,
                     r == root ? displs : NULL, NEXAR_INT32, root, c));
    if (r == root)
        for (int k = 0; k < n; k++) EXPECT(all[displs[k]] == k * 100, "gatherv");

    for (size_t i = 0; i < total; i++) all[i] = 5000 + (int32_t)i;
    memset(mine, 0, ((size_t)r + 1) * sizeof(int32_t));
    CK(nexar_scatterv(all, counts, displs, mine, (size_t)r + 1, NEXAR_INT32, root, c));
    for (int i = 0; i <= r; i++)
        EXPECT(mine[i] == 5000 + (int32_t)displs[r] + i, "scatterv mine[%d]=%d", i, mine[i]);

    /* alltoallv: rank r sends r+j+1 elements to rank j */
    size_t *sc = calloc((size_t)n, sizeof(size_t)), *sd = calloc((size_t)n, sizeof(size_t));
    size_t *rc = calloc((size_t)n, sizeof(size_t)), *rd = calloc((size_t)n, sizeof(size_t));
    size_t st = 0, rt = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = (size_t)(r + j + 1), sd[j] = st, st += sc[j];
        rc[j] = (size_t)(j + r + 1), rd[j] = rt, rt += rc[j];
    }
    int32_t *sb = calloc(st, sizeof(int32_t)), *rb = calloc(rt, sizeof(int32_t));
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < sc[j]; i++) sb[sd[j] + i] = r * 1000 + j * 10 + (int32_t)i;
    CK(nexar_alltoallv(sb, sc, sd, rb, rc, rd, NEXAR_INT32, c));
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < rc[q]; i++)
            EXPECT(rb[rd[q] + i] == q * 1000 + r * 10 + (int32_t)i, "alltoallv from %d", q);
    free(sc), free(sd), free(rc), free(rd), free(sb), free(rb);
    free(counts), free(displs), free(mine), free(all);
}

static void test_scatter_reduce(nexar_comm_t c, int r, int n) {
    /* reduce_scatter: block j of rank q's input is q + j*10 + i */
    int64_t *s = calloc((size_t)n * 2, sizeof *s), d[2];
    for (int j = 0; j < n; j++)
        for (int i = 0; i < 2; i++) s[j * 2 + i] = r + j * 10 + i;
    CK(nexar_reduce_scatter(s, d, 2, NEXAR_INT64, NEXAR_SUM, c));
    for (int i = 0; i < 2; i++) EXPECT(d[i] == tri(n) + n * (r * 10 + i), "reduce_scatter");
    CK(nexar_reduce_scatter(s, s, 2, NEXAR_INT64, NEXAR_SUM, c)); /* in place: result in front */
    for (int i = 0; i < 2; i++) EXPECT(s[i] == tri(n) + n * (r * 10 + i), "reduce_scatter in place");

    /* alltoall: block j of rank r is r*100 + j*10 + i */
    int32_t *a = calloc((size_t)n * 2, sizeof *a), *b = calloc((size_t)n * 2, sizeof *b);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < 2; i++) a[j * 2 + i] = r * 100 + j * 10 + i;
    CK(nexar_alltoall(a, b, 2, NEXAR_INT32, c));
    for (int q = 0; q < n; q++)
        for (int i = 0; i < 2; i++) EXPECT(b[q * 2 + i] == q * 100 + r * 10 + i, "alltoall");
    CK(nexar_alltoall(a, a, 2, NEXAR_INT32, c)); /* in place */
    for (int q = 0; q < n; q++) EXPECT(a[q * 2 + 1] == q * 100 + r * 10 + 1, "alltoall in place");

    /* scan / exscan */
    int32_t v[2] = {r + 1, 1}, w[2] = {-7, -7};
    CK(nexar_scan(v, w, 2, NEXAR_INT32, NEXAR_SUM, c));
    EXPECT(w[0] == (r + 1) * (r + 2) / 2 && w[1] == r + 1, "scan %d %d", w[0], w[1]);
    w[0] = w[1] = -7;
    CK(nexar_exscan(v, w, 2, NEXAR_INT32, NEXAR_SUM, c));
    if (r == 0)
        EXPECT(w[0] == -7 && w[1] == -7, "exscan rank 0 untouched");
    else
        EXPECT(w[0] == r * (r + 1) / 2 && w[1] == r, "exscan %d %d", w[0], w[1]);
    CK(nexar_scan(v, v, 2, NEXAR_INT32, NEXAR_PROD, c)); /* in place */
    EXPECT(v[1] == 1, "scan prod");
    CK(nexar_barrier(c));
    free(s), free(a), free(b);
}

static void test_p2p(nexar_comm_t c, int r, int n) {
    if (n < 2) return;
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    double out[4] = {r, r + 0.25, r + 0.5, r + 0.75}, in[8];
    CK(nexar_send(out, 4, NEXAR_FLOAT64, next, 7, c));
    nexar_status_t st;
    CK(nexar_recv_status(in, 8, NEXAR_FLOAT64, prev, 7, c, &st));
    EXPECT(st.source == prev && st.tag == 7 && st.count == 4 && st.bytes == 32,
           "status %d %llu %zu", st.source, (unsigned long long)st.tag, st.count);
    EXPECT(in[3] == prev + 0.75, "ring payload");
    /* any source: everyone sends to rank 0 */
    if (r != 0) {
        CK(nexar_send(&r, 1, NEXAR_INT32, 0, 99, c));
    } else {
        /* a count per sender: a bit mask would overflow past 31 ranks */
        int *seen = calloc((size_t)n, sizeof *seen), once = 1;
        EXPECT(seen != NULL, "calloc");
        for (int k = 1; k < n; k++) {
            int32_t v = -1;
            CK(nexar_recv_status(&v, 1, NEXAR_INT32, NEXAR_ANY_SOURCE, 99, c, &st));
            EXPECT(v == st.source && v > 0 && v < n, "any source %d from %d", v, st.source);
            seen[v]++;
        }
        for (int k = 1; k < n; k++) once &= seen[k] == 1;
        free(seen);
        EXPECT(once, "every sender seen once");
    }
    /* plain nexar_recv */
    CK(nexar_send(out, 1, NEXAR_FLOAT64, next, 8, c));
    CK(nexar_recv(in, 1, NEXAR_FLOAT64, prev, 8, c));
    EXPECT(in[0] == prev, "nexar_recv");
}

/* Several requests in flight at once, completed in reverse order. */
static void test_nonblocking(nexar_comm_t c, int r, int n) {
    enum { K = 9 };
    nexar_request_t q[K];
    int nq = 0;
    int32_t ar[4], bc[4], rd[4] = {0, 0, 0, 0}, rs[2], one[2] = {r, r};
    int32_t *ag = calloc((size_t)n * 2, sizeof *ag), *rsin = calloc((size_t)n * 2, sizeof *rsin);
    int32_t *a2a = calloc((size_t)n, sizeof *a2a), *a2b = calloc((size_t)n, sizeof *a2b);
    int32_t ps = r * 3, pr = -1;
    for (int i = 0; i < 4; i++) ar[i] = r + i, bc[i] = r == 0 ? 40 + i : 0;
    for (int k = 0; k < n * 2; k++) rsin[k] = k;
    for (int j = 0; j < n; j++) a2a[j] = r * 10 + j;
    CK(nexar_iallreduce(ar, ar, 4, NEXAR_INT32, NEXAR_SUM, c, &q[nq++]));
    CK(nexar_ibroadcast(bc, 4, NEXAR_INT32, 0, c, &q[nq++]));
    CK(nexar_ireduce(one, rd, 2, NEXAR_INT32, NEXAR_MAX, n - 1, c, &q[nq++]));
    CK(nexar_iallgather(one, ag, 2, NEXAR_INT32, c, &q[nq++]));
    CK(nexar_ireduce_scatter(rsin, rs, 2, NEXAR_INT32, NEXAR_SUM, c, &q[nq++]));
    CK(nexar_ialltoall(a2a, a2b, 1, NEXAR_INT32, c, &q[nq++]));
    CK(nexar_ibarrier(c, &q[nq++]));
    int prev = (r + n - 1) % n, next = (r + 1) % n;
    nexar_request_t rq;
    CK(nexar_irecv(&pr, 1, NEXAR_INT32, prev, 5, c, &rq));
    q[nq++] = rq;
    CK(nexar_isend(&ps, 1, NEXAR_INT32, next, 5, c, &q[nq++]));
    EXPECT(nq == K, "nq");
    /* poll one with nexar_test, wait for the rest in reverse order */
    int done = 0;
    for (int spins = 0; !done; spins++) {
        CK(nexar_test(q[0], &done));
        EXPECT(spins < 10000000, "iallreduce never completes");
    }
    for (int k = K - 1; k >= 0; k--) CK(nexar_wait(q[k]));
    CK(nexar_wait(q[0])); /* waiting again gives the same result */
    nexar_status_t st;
    CK(nexar_request_status(rq, &st));
    EXPECT(st.source == prev && st.tag == 5 && st.count == 1, "irecv status");
    EXPECT(pr == prev * 3, "irecv payload %d", pr);
    for (int k = 0; k < K; k++) CK(nexar_request_free(q[k]));

    for (int i = 0; i < 4; i++) EXPECT(ar[i] == tri(n) + n * i, "iallreduce");
    for (int i = 0; i < 4; i++) EXPECT(bc[i] == 40 + i, "ibroadcast");
    if (r == n - 1) EXPECT(rd[0] == n - 1 && rd[1] == n - 1, "ireduce");
    for (int k = 0; k < n; k++) EXPECT(ag[k * 2] == k && ag[k * 2 + 1] == k, "iallgather");
    for (int i = 0; i < 2; i++) EXPECT(rs[i] == n * (r * 2 + i), "ireduce_scatter");
    for (int j = 0; j < n; j++) EXPECT(a2b[j] == j * 10 + r, "ialltoall");
    free(ag), free(rsin), free(a2a), free(a2b);
}

/* The non-blocking forms of gather, scatter, scan, exscan and the v-forms,
 * all in flight at once, against their blocking forms; then waitall and
 * testany, with NULL entries and one failing request. */
static void test_nonblocking_rest(nexar_comm_t c, int r, int n) {
    enum { K = 8 };
    size_t un = (size_t)n;
    int root = n - 1;
    int64_t gs[2] = {r, 100 + r}, sc1[1], scn[1], ex1[1] = {-7}, exn[1] = {-7};
    int64_t *g1 = calloc(un * 2, 8), *gn = calloc(un * 2, 8), *ss = calloc(un * 2, 8);
    int64_t s1[2] = {-1, -1}, sn[2] = {-1, -1};
    for (int k = 0; k < n * 2; k++) ss[k] = 1000 + k;
    /* v-forms: rank j contributes j+1 elements */
    size_t *cnt = calloc(un, sizeof *cnt), *dsp = calloc(un, sizeof *dsp), tot = 0;
    for (int j = 0; j < n; j++) cnt[j] = (size_t)j + 1, dsp[j] = tot, tot += cnt[j];
    int64_t *vsend = calloc(tot, 8), *av1 = calloc(tot, 8), *avn = calloc(tot, 8);
    int64_t *gv1 = calloc(tot, 8), *gvn = calloc(tot, 8), *svsrc = calloc(tot, 8);
    int64_t sv1[64], svn[64];
    for (size_t i = 0; i < tot; i++) svsrc[i] = 5000 + (int64_t)i;
    for (int i = 0; i <= r; i++) vsend[i] = r * 100 + i;
    /* alltoallv: i sends i+j+1 elements to j */
    size_t *sc = calloc(un, sizeof *sc), *sd = calloc(un, sizeof *sd), *rc = calloc(un, sizeof *rc),
           *rdd = calloc(un, sizeof *rdd), st = 0, rt = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = (size_t)(r + j + 1), sd[j] = st, st += sc[j];
        rc[j] = (size_t)(j + r + 1), rdd[j] = rt, rt += rc[j];
    }
    int64_t *a2s = calloc(st, 8), *a2b1 = calloc(rt, 8), *a2bn = calloc(rt, 8);
    for (size_t i = 0; i < st; i++) a2s[i] = r * 1000 + (int64_t)i;

    CK(nexar_gather(gs, g1, 2, NEXAR_INT64, root, c));
    CK(nexar_scatter(ss, s1, 2, NEXAR_INT64, root, c));
    CK(nexar_scan(gs, sc1, 1, NEXAR_INT64, NEXAR_SUM, c));
    CK(nexar_exscan(gs, ex1, 1, NEXAR_INT64, NEXAR_SUM, c));
    CK(nexar_allgatherv(vsend, cnt[r], av1, cnt, dsp, NEXAR_INT64, c));
    CK(nexar_gatherv(vsend, cnt[r], gv1, cnt, dsp, NEXAR_INT64, root, c));
    CK(nexar_scatterv(svsrc, cnt, dsp, sv1, cnt[r], NEXAR_INT64, root, c));
    CK(nexar_alltoallv(a2s, sc, sd, a2b1, rc, rdd, NEXAR_INT64, c));

    nexar_request_t q[K + 2];
    int nq = 0;
    q[nq++] = NEXAR_REQUEST_NULL;
    CK(nexar_igather(gs, gn, 2, NEXAR_INT64, root, c, &q[nq++]));
    CK(nexar_iscatter(ss, sn, 2, NEXAR_INT64, root, c, &q[nq++]));
    CK(nexar_iscan(gs, scn, 1, NEXAR_INT64, NEXAR_SUM, c, &q[nq++]));
    CK(nexar_iexscan(gs, exn, 1, NEXAR_INT64, NEXAR_SUM, c, &q[nq++]));
    /* the arrays are copied by the call: scribbling on them after it is fine */
    size_t *cnt2 = malloc(un * sizeof *cnt2), *dsp2 = malloc(un * sizeof *dsp2);
    memcpy(cnt2, cnt, un * sizeof *cnt2), memcpy(dsp2, dsp, un * sizeof *dsp2);
    CK(nexar_iallgatherv(vsend, cnt[r], avn, cnt2, dsp2, NEXAR_INT64, c, &q[nq++]));
    memset(cnt2, 0xff, un * sizeof *cnt2), memset(dsp2, 0xff, un * sizeof *dsp2);
    free(cnt2), free(dsp2);
    CK(nexar_igatherv(vsend, cnt[r], gvn, cnt, dsp, NEXAR_INT64, root, c, &q[nq++]));
    CK(nexar_iscatterv(svsrc, cnt, dsp, svn, cnt[r], NEXAR_INT64, root, c, &q[nq++]));
    CK(nexar_ialltoallv(a2s, sc, sd, a2bn, rc, rdd, NEXAR_INT64, c, &q[nq++]));
    q[nq++] = NEXAR_REQUEST_NULL;
    EXPECT(nq == K + 2, "nq %d", nq);
    /* testany sees some request done eventually (none is the NULL ones) */
    size_t idx = 99;
    int done = 0;
    for (long spins = 0; !done; spins++) {
        CK(nexar_testany((size_t)nq, q, &idx, &done));
        EXPECT(spins < 100000000L, "testany never sees a completion");
    }
    EXPECT(idx >= 1 && idx <= K, "testany index %zu", idx);
    nexar_result_t res[K + 2];
    for (int k = 0; k < nq; k++) res[k] = (nexar_result_t)-1;
    CK(nexar_waitall((size_t)nq, q, res));
    for (int k = 0; k < nq; k++) EXPECT(res[k] == NEXAR_SUCCESS, "waitall res[%d]=%d", k, res[k]);
    CK(nexar_waitall((size_t)nq, q, NULL)); /* again: the same results */
    for (int k = 1; k <= K; k++) CK(nexar_request_free(q[k]));

    if (r == root) {
        EXPECT(memcmp(g1, gn, un * 16) == 0, "igather differs from gather");
        EXPECT(memcmp(gv1, gvn, tot * 8) == 0, "igatherv differs from gatherv");
    }
    EXPECT(memcmp(s1, sn, 16) == 0 && sn[0] == 1000 + 2 * r, "iscatter");
    EXPECT(sc1[0] == scn[0] && scn[0] == tri(r + 1), "iscan %lld", (long long)scn[0]);
    EXPECT(ex1[0] == exn[0], "iexscan %lld vs %lld", (long long)exn[0], (long long)ex1[0]);
    EXPECT(memcmp(av1, avn, tot * 8) == 0, "iallgatherv differs from allgatherv");
    EXPECT(memcmp(sv1, svn, cnt[r] * 8) == 0 && svn[0] == 5000 + (int64_t)dsp[r], "iscatterv");
    EXPECT(memcmp(a2b1, a2bn, rt * 8) == 0, "ialltoallv differs from alltoallv");

    /* testany with only NULL entries: nothing to wait for */
    nexar_request_t nulls[2] = {NEXAR_REQUEST_NULL, NEXAR_REQUEST_NULL};
    CK(nexar_testany(2, nulls, &idx, &done));
    EXPECT(done == 1 && idx == 2, "testany of NULLs: done %d index %zu", done, idx);
    CK(nexar_waitall(0, NULL, NULL));

    /* waitall with one failing request: a receive too small for its
     * message (to itself). Every request is still waited for. */
    int64_t two[2] = {7, 8}, small[1] = {0}, ok_in[2] = {0, 0};
    nexar_request_t w[4];
    CK(nexar_isend(two, 2, NEXAR_INT64, r, 41, c, &w[0]));
    CK(nexar_irecv(small, 1, NEXAR_INT64, r, 41, c, &w[1]));
    CK(nexar_isend(two, 2, NEXAR_INT64, r, 42, c, &w[2]));
    CK(nexar_irecv(ok_in, 2, NEXAR_INT64, r, 42, c, &w[3]));
    nexar_result_t wr[4];
    nexar_result_t got = nexar_waitall(4, w, wr);
    EXPECT(got == NEXAR_ERR_TRUNCATED && wr[1] == NEXAR_ERR_TRUNCATED, "waitall: %d, res[1]=%d", got, wr[1]);
    EXPECT(wr[0] == NEXAR_SUCCESS && wr[2] == NEXAR_SUCCESS && wr[3] == NEXAR_SUCCESS,
           "waitall res %d %d %d", wr[0], wr[2], wr[3]);
    EXPECT(strstr(nexar_last_error(), "reqs[1]") != NULL, "waitall error names reqs[1]: %s", nexar_last_error());
    EXPECT(ok_in[0] == 7 && ok_in[1] == 8, "the good receive completed");
    for (int k = 0; k < 4; k++) CK(nexar_request_free(w[k]));
    /* an entry that is not a request: nothing waited for, the index named */
    nexar_request_t bogus[2] = {NEXAR_REQUEST_NULL, (nexar_request_t)(uintptr_t)UINTPTR_MAX};
    EXPECT(nexar_waitall(2, bogus, NULL) == NEXAR_ERR_INVALID_HANDLE, "waitall bogus");
    EXPECT(strstr(nexar_last_error(), "reqs[1]") != NULL, "names reqs[1]: %s", nexar_last_error());
    EXPECT(nexar_testany(2, bogus, &idx, NULL) == NEXAR_ERR_INVALID_ARGUMENT, "testany NULL done");
    free(g1), free(gn), free(ss), free(cnt), free(dsp), free(vsend), free(av1), free(avn);
    free(gv1), free(gvn), free(svsrc), free(sc), free(sd), free(rc), free(rdd);
    free(a2s), free(a2b1), free(a2bn);
}

static void run_suite(nexar_comm_t c) {
    int r, n;
    CK(nexar_comm_rank(c, &r));
    CK(nexar_comm_size(c, &n));
    test_allreduce(c, r, n);
    test_broadcast_reduce(c, r, n);
    test_gathers(c, r, n);
    test_vforms(c, r, n);
    test_scatter_reduce(c, r, n);
    test_p2p(c, r, n);
    test_nonblocking(c, r, n);
    test_nonblocking_rest(c, r, n);
}

int main(void) {
    int r, n;
    nexar_comm_t world = init_world(&r, &n);
    nexar_result_t health;
    CK(nexar_comm_get_error(world, &health));
    EXPECT(health == NEXAR_SUCCESS, "healthy world");

    run_suite(world);

    /* split by parity, reversed order inside each half */
    nexar_comm_t half;
    CK(nexar_comm_split(world, r % 2, -r, &half));
    int hr, hn;
    CK(nexar_comm_rank(half, &hr));
    CK(nexar_comm_size(half, &hn));
    EXPECT(hn == (n + 1 - r % 2) / 2, "half size %d", hn);
    EXPECT(hr == hn - 1 - r / 2, "half rank %d", hr);
    run_suite(half);

    /* rank 0 opts out; the others form a communicator of n-1 */
    nexar_comm_t rest;
    CK(nexar_comm_split(world, r == 0 ? NEXAR_UNDEFINED : 1, r, &rest));
    if (r == 0) {
        EXPECT(rest == NEXAR_COMM_NULL, "undefined color gives NULL");
    } else {
        run_suite(rest);
        CK(nexar_comm_destroy(rest));
    }
    /* a world collective still works after the sub-communicators */
    CK(nexar_barrier(world));
    CK(nexar_comm_destroy(half));
    CK(nexar_comm_destroy(world));
    printf("rank %d/%d: test_collectives ok\n", r, n);
    return 0;
}
