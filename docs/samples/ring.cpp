#include <nexar/nexar.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

int main() try {
    nexar::Comm world = nexar::Comm::from_env();
    const int rank = world.rank(), size = world.size();
    const int next = (rank + 1) % size, prev = (rank + size - 1) % size;

    std::vector<std::int64_t> out(1, rank), in(1, -1);
    world.send(out, next);  // messages of up to a few KiB are buffered: no deadlock
    world.recv(in, prev);
    if (in[0] != prev) return 1;

    std::vector<std::int64_t> total(1, rank);
    world.allreduce(total, nexar::Op::sum);  // in place
    if (total[0] != std::int64_t(size) * (size - 1) / 2) return 1;
    if (rank == 0) std::printf("ring of %d ranks: ok\n", size);
    return 0;
} catch (const nexar::Error& e) {  // every failure is an exception naming its cause
    std::fprintf(stderr, "ring: %s\n", e.what());
    return 1;
}
