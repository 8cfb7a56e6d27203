/* nexar.h must compile on its own under strict C99/C11 flags. */
#include "nexar.h"

int main(void) {
    nexar_config_t cfg = NEXAR_CONFIG_INIT;
    nexar_status_t st = {0, 0, 0, 0, {0, 0, 0, 0}};
    nexar_comm_t c = NEXAR_COMM_NULL;
    nexar_request_t r = NEXAR_REQUEST_NULL;
    nexar_stats_t stats = NEXAR_STATS_INIT;
    (void)st, (void)c, (void)r, (void)stats;
    return cfg.struct_size == sizeof(nexar_config_t) && NEXAR_VERSION_CODE == 100 ? 0 : 1;
}
