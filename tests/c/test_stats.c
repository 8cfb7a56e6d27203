/* test_stats: nexar_comm_get_stats after real traffic, and its bad
 * arguments (NULL stats, struct_size too small, invalid handle). Run under
 * `nexar run -n N`, N >= 1. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nexar.h"
#include "testutil.h"

static void bad(int line, nexar_result_t got, nexar_result_t want, const char* what) {
    const char* msg = nexar_last_error();
    if (got != want || strstr(msg, "nexar_comm_get_stats") == NULL || strstr(msg, what) == NULL) {
        fprintf(stderr, "line %d: got %s \"%s\"; want %s naming \"%s\"\n", line,
                nexar_result_string(got), msg, nexar_result_string(want), what);
        exit(1);
    }
}

int main(void) {
    int r, n;
    nexar_comm_t c = init_world(&r, &n);

    nexar_stats_t st = NEXAR_STATS_INIT;
    EXPECT(st.struct_size == sizeof(nexar_stats_t), "NEXAR_STATS_INIT struct_size %zu", st.struct_size);
    bad(__LINE__, nexar_comm_get_stats(c, NULL), NEXAR_ERR_INVALID_ARGUMENT, "stats is NULL");
    st.struct_size = sizeof(size_t);
    bad(__LINE__, nexar_comm_get_stats(c, &st), NEXAR_ERR_INVALID_ARGUMENT, "NEXAR_STATS_INIT");
    st.struct_size = sizeof(nexar_stats_t);
    bad(__LINE__, nexar_comm_get_stats((nexar_comm_t)(uintptr_t)12345, &st),
        NEXAR_ERR_INVALID_HANDLE, "comm");

    /* 1 MiB of doubles: the ring algorithm, with scratch, for n >= 2 */
    const size_t count = 1 << 17;
    double* buf = malloc(count * sizeof *buf);
    EXPECT(buf != NULL, "malloc");
    for (size_t i = 0; i < count; i++) buf[i] = (double)r;
    CK(nexar_allreduce(buf, buf, count, NEXAR_FLOAT64, NEXAR_SUM, c));
    EXPECT(buf[count - 1] == n * (n - 1) / 2.0, "allreduce result %g", buf[count - 1]);
    free(buf);

    nexar_stats_t s = NEXAR_STATS_INIT;
    CK(nexar_comm_get_stats(c, &s));
    EXPECT(s.struct_size == sizeof(nexar_stats_t), "struct_size changed to %zu", s.struct_size);
    EXPECT(s.relayed_bytes == 0, "relayed %lld", (long long)s.relayed_bytes);
    EXPECT(s.bytes_buffered >= 0 && s.ring_bytes >= 0, "buffered %lld ring %lld",
           (long long)s.bytes_buffered, (long long)s.ring_bytes);
    if (n >= 2) {
        EXPECT(s.messages_sent > 0 && s.bytes_sent > 0 && s.bytes_received > 0,
               "traffic: %lld messages, %lld bytes sent, %lld received", (long long)s.messages_sent,
               (long long)s.bytes_sent, (long long)s.bytes_received);
        EXPECT(s.scratch_bytes > 0, "no scratch kept after a 1 MiB allreduce");
    } else {
        EXPECT(s.messages_sent == 0 && s.bytes_sent == 0, "a world of one sent %lld messages",
               (long long)s.messages_sent);
    }
    CK(nexar_comm_destroy(c));
    if (r == 0) printf("test_stats: ok (%d ranks)\n", n);
    return 0;
}
