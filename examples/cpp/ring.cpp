// ring: pass a token around the ring with point-to-point messages, then
// check it with a reduction.
//
//   nexar run -n 3 -- ./ring
#include <nexar/nexar.hpp>

#include <cstdio>
#include <vector>

int main() try {
    nexar::Comm world = nexar::Comm::from_env();
    const int rank = world.rank(), size = world.size();
    std::vector<std::int64_t> token(1, 0);
    if (size > 1) {
        const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        if (rank == 0) {
            token[0] = 1;
            world.send(token, next);
            world.recv(token, prev);
        } else {
            world.recv(token, prev);
            token[0] += 1;
            world.send(token, next);
        }
    } else {
        token[0] = 1;
    }
    std::vector<std::int64_t> total(1);
    world.reduce(token, total, nexar::Op::max, 0);
    if (rank == 0) {
        std::printf("token went round %d ranks: %lld\n", size, static_cast<long long>(total[0]));
        return total[0] == size ? 0 : 1;
    }
    return 0;
} catch (const nexar::Error& e) {
    std::fprintf(stderr, "ring: %s\n", e.what());
    return 1;
}
