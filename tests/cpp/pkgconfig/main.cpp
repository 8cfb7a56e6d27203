// Consumer of the installed package: one allreduce through the C++ wrapper.
#include <nexar/nexar.hpp>

#include <cstdio>
#include <vector>

int main() {
    nexar::Comm world = nexar::Comm::from_env();
    std::vector<int> v{1, 2, 3};
    world.allreduce(v, nexar::Op::sum);
    const int n = world.size();
    if (v[0] != n || v[2] != 3 * n) {
        std::fprintf(stderr, "wrong allreduce result %d %d\n", v[0], v[2]);
        return 1;
    }
    std::printf("consumer ok: rank %d of %d, nexar %s\n", world.rank(), n, nexar::version().c_str());
    return 0;
}
