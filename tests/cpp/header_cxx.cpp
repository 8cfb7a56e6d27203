// nexar.h and nexar.hpp must compile on their own under strict C++17 flags.
#include <nexar.h>
#include <nexar/nexar.hpp>

static_assert(nexar::datatype_v<float> == NEXAR_FLOAT32, "float maps to NEXAR_FLOAT32");
static_assert(nexar::datatype_v<const double> == NEXAR_FLOAT64, "cv is ignored");
static_assert(nexar::datatype_v<nexar::bfloat16> == NEXAR_BFLOAT16, "bfloat16 tag");
static_assert(!std::is_copy_constructible_v<nexar::Comm>, "Comm is move-only");
static_assert(std::is_nothrow_move_constructible_v<nexar::Request>, "Request moves");

int main() {
    nexar_config_t cfg = NEXAR_CONFIG_INIT;
    return cfg.struct_size == sizeof cfg ? 0 : 1;
}
