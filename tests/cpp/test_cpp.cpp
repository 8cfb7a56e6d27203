// test_cpp: the C++ wrapper against a live world: containers and pointers,
// in place, requests, split, and errors as nexar::Error.
#include <nexar/nexar.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#define EXPECT(cond)                                                          \
    do {                                                                      \
        if (!(cond)) {                                                        \
            std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
            std::exit(1);                                                     \
        }                                                                     \
    } while (0)

int main() {
    nexar::Comm world = nexar::Comm::from_env();
    const int r = world.rank(), n = world.size();

    std::vector<double> v(5, r + 1.0);
    world.allreduce(v, nexar::Op::sum);
    for (double x : v) EXPECT(x == n * (n + 1) / 2.0);

    std::array<std::int32_t, 3> mine{r, r, r};
    std::vector<std::int32_t> all(3 * static_cast<std::size_t>(n));
    world.allgather(mine, all);
    for (int k = 0; k < n; k++) EXPECT(all[3 * static_cast<std::size_t>(k)] == k);

    std::vector<std::uint64_t> b(4, r == 0 ? 42u : 0u);
    world.broadcast(b, 0);
    EXPECT(b[3] == 42u);

    std::vector<nexar::bfloat16> h(2, nexar::bfloat16{0x3f80});  // 1.0
    world.allreduce(h, nexar::Op::sum);
    EXPECT(n != 1 || h[0].bits == 0x3f80);

    // the flight record names the last call; a path that cannot be written throws
    {
        const std::string path = "/tmp/nexar-cpp-flight-" + std::to_string(getpid()) + ".json";
        world.dump_flight_record(path);
        std::FILE* fp = std::fopen(path.c_str(), "r");
        EXPECT(fp != nullptr);
        std::string text;
        char chunk[4096];
        for (std::size_t k; (k = std::fread(chunk, 1, sizeof chunk, fp)) > 0;) text.append(chunk, k);
        std::fclose(fp);
        std::remove(path.c_str());
        EXPECT(text.find("\"call\": \"allreduce(bfloat16, count=2, sum)\"") != std::string::npos);
        bool threw = false;
        try {
            world.dump_flight_record("/nonexistent-dir/x/flight.json");
        } catch (const nexar::Error&) {
            threw = true;
        }
        EXPECT(threw);
    }

    // statistics: traffic counted once there are peers; no relaying yet
    {
        const nexar_stats_t s = world.stats();
        EXPECT(s.struct_size == sizeof(nexar_stats_t));
        EXPECT(s.relayed_bytes == 0);
        EXPECT(n == 1 || (s.messages_sent > 0 && s.bytes_sent > 0 && s.bytes_received > 0));
        EXPECT(n != 1 || s.bytes_sent == 0);
    }

    std::vector<float> f(8, 1.0f), g(8);
    nexar::Request q1 = world.iallreduce(f.data(), g.data(), f.size(), nexar::Op::max);
    nexar::Request q2 = world.ibarrier();
    q2.wait();
    q1.wait();
    EXPECT(g[7] == 1.0f);

    // Bucketed allreduce: blocking (tiny buckets: several of them) and not.
    {
        std::vector<std::vector<float>> bufs{std::vector<float>(3, r + 1.0f),
                                             std::vector<float>(0),
                                             std::vector<float>(1000, 2.0f * r)};
        world.allreduce_multi(bufs, nexar::Op::sum, 64);
        EXPECT(bufs[0][2] == n * (n + 1) / 2.0f && bufs[2][999] == n * (n - 1) * 1.0f);
        nexar::Request q = world.iallreduce_multi(bufs, nexar::Op::max);
        q.wait();
        EXPECT(bufs[0][0] == n * (n + 1) / 2.0f);
        float* ptrs[1] = {bufs[2].data()};
        std::size_t cnt[1] = {bufs[2].size()};
        world.allreduce_multi(ptrs, cnt, 1, nexar::Op::min);
        EXPECT(bufs[2][0] == n * (n - 1) * 1.0f);
    }
    // Compressed allreduce: ratio 1 is a plain sum; TopK with a residual.
    {
        std::vector<float> x(6, r + 1.0f), res(6, 0.0f);
        world.allreduce_compressed(x.data(), nullptr, x.size(), NEXAR_COMPRESS_TOPK, 1.0);
        EXPECT(x[5] == n * (n + 1) / 2.0f);
        std::vector<float> y{0, 0, 5.0f, 0, 0, 1.0f};
        world.allreduce_compressed(y.data(), res.data(), y.size(), NEXAR_COMPRESS_TOPK, 0.1);
        EXPECT(y[2] == 5.0f * n && y[5] == 0.0f && res[5] == 1.0f && res[2] == 0.0f);
    }

    // The other non-blocking collectives, against what they must give, and
    // test_any / wait_all over a vector of requests.
    {
        const int root = n - 1;
        std::vector<std::int64_t> mine(2, r), gat(static_cast<std::size_t>(2 * n)), sca(2),
            scn(1), src(static_cast<std::size_t>(2 * n));
        for (std::size_t k = 0; k < src.size(); k++) src[k] = static_cast<std::int64_t>(k);
        std::vector<std::size_t> cnt(static_cast<std::size_t>(n), 1), dsp(static_cast<std::size_t>(n));
        for (std::size_t k = 0; k < dsp.size(); k++) dsp[k] = k;
        std::vector<std::int64_t> agv(static_cast<std::size_t>(n));
        std::vector<nexar::Request> reqs;
        reqs.push_back(world.igather(mine.data(), gat.data(), 2, root));
        reqs.push_back(world.iscatter(src.data(), sca.data(), 2, root));
        reqs.push_back(world.iscan(mine.data(), scn.data(), 1, nexar::Op::sum));
        reqs.push_back(world.iallgatherv(mine.data(), 1, agv.data(), cnt.data(), dsp.data()));
        std::size_t first = reqs.size();
        for (int spins = 0; first == reqs.size(); spins++) {
            first = nexar::test_any(reqs);
            EXPECT(spins < 100000000);
        }
        EXPECT(first < reqs.size());
        nexar::wait_all(reqs);
        if (r == root)
            for (int k = 0; k < n; k++) EXPECT(gat[2 * static_cast<std::size_t>(k)] == k);
        EXPECT(sca[0] == 2 * r && sca[1] == 2 * r + 1);
        EXPECT(scn[0] == static_cast<std::int64_t>(r) * (r + 1) / 2);
        for (int k = 0; k < n; k++) EXPECT(agv[static_cast<std::size_t>(k)] == k);
    }

    nexar::Comm half = world.split(r % 2, r);
    EXPECT(half && half.size() == (n + 1 - r % 2) / 2);
    std::vector<std::int64_t> s(1, 1), t(1);
    half.scan(s, t, nexar::Op::sum);
    EXPECT(t[0] == half.rank() + 1);

    nexar::Comm none = world.split(nexar::undefined, 0);
    EXPECT(!none);

    try {
        world.broadcast(v, n + 5);
        EXPECT(false);
    } catch (const nexar::Error& e) {
        EXPECT(e.code() == NEXAR_ERR_INVALID_ARGUMENT);
        EXPECT(std::string(e.what()).find("root") != std::string::npos);
    }
    // A child made by fork() gets nexar::Error(NEXAR_ERR_FORKED) at once and
    // leaves the parent's world alone (_exit: no destructors run there).
    std::fflush(nullptr);
    pid_t child = fork();
    EXPECT(child >= 0);
    if (child == 0) {
        std::signal(SIGALRM, SIG_DFL);
        alarm(10);  // a hung call fails the test
        try {
            world.barrier();
        } catch (const nexar::Error& e) {
            const bool named = std::string(e.what()).find("nexar_barrier") != std::string::npos;
            _exit(e.code() == NEXAR_ERR_FORKED && named ? 0 : 2);
        }
        _exit(3);
    }
    int status = 0;
    EXPECT(waitpid(child, &status, 0) == child);
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    // RPC: serve, call the next rank, a handler's exception comes back.
    world.serve(1, [r](int from, std::string_view req) {
        return std::to_string(r) + "<-" + std::to_string(from) + ":" + std::string(req);
    });
    world.serve(2, [](int, std::string_view) -> std::string { throw std::runtime_error("nope"); });
    world.serve(3, [](int, std::string_view) -> std::string {
        std::this_thread::sleep_for(std::chrono::seconds(2));
        return "late";
    });
    world.barrier();
    {
        const int next = (r + 1) % n;
        EXPECT(world.call(next, 1, "hi") == std::to_string(next) + "<-" + std::to_string(r) + ":hi");
        try {
            world.call(next, 2);
            EXPECT(false);
        } catch (const nexar::Error& e) {
            EXPECT(e.code() == NEXAR_ERR_INTERNAL && std::string(e.what()).find("nope") != std::string::npos);
        }
        // Non-blocking: several in flight, replies matched; errors and the
        // deadline come back through get() and ready().
        std::vector<nexar::Call> calls;
        for (int i = 0; i < 6; i++) calls.push_back(world.icall(i % n, 1, "c" + std::to_string(i)));
        for (int i = 0; i < 6; i++) {
            EXPECT(calls[i].get() == std::to_string(i % n) + "<-" + std::to_string(r) + ":c" + std::to_string(i));
            EXPECT(calls[i].ready());
        }
        nexar::Call bad = world.icall(next, 2);
        try {
            bad.get();
            EXPECT(false);
        } catch (const nexar::Error& e) {
            EXPECT(e.code() == NEXAR_ERR_INTERNAL && std::string(e.what()).find("nope") != std::string::npos);
        }
        nexar::Call unknown = world.icall(next, 9);
        try {
            unknown.get();
            EXPECT(false);
        } catch (const nexar::Error& e) {
            EXPECT(e.code() == NEXAR_ERR_INVALID_ARGUMENT);
        }
        auto t0 = std::chrono::steady_clock::now();
        try {
            world.call(next, 3, "", std::chrono::milliseconds(200));
            EXPECT(false);
        } catch (const nexar::Error& e) {
            EXPECT(e.code() == NEXAR_ERR_TIMEOUT);
        }
        nexar::Call late = world.icall(next, 3, "", std::chrono::milliseconds(200));
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        try {
            late.ready();
            EXPECT(false);
        } catch (const nexar::Error& e) {
            EXPECT(e.code() == NEXAR_ERR_TIMEOUT);
        }
        EXPECT(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1800));
    }
    world.barrier();

    nexar::Comm moved = std::move(world);
    EXPECT(!world && moved);
    moved.barrier();

    // Failure notification: with 3 ranks, the last one dies; the others'
    // handler (set before the move: it moves with the Comm) hears of it
    // once, and failed() lists it.
    if (n == 3) {
        std::atomic<int> calls{0}, who{-1};
        moved.on_failure([&](int rank, nexar_result_t code, const std::string& msg) {
            EXPECT(code == NEXAR_ERR_PEER_DOWN && !msg.empty());
            who = rank;
            calls++;
        });
        nexar::Comm again = std::move(moved);
        EXPECT(again.failed().empty());
        again.barrier();
        // Rank 2 dies once the others are past the barrier: a death on one
        // host is seen at once and must not fail a barrier still finishing.
        int one = 1;
        if (r == 2) {
            again.recv(&one, 1, nexar::any_source, 99);
            again.recv(&one, 1, nexar::any_source, 99);
            std::fflush(nullptr);
            _exit(0);  // dies without a goodbye
        }
        again.send(&one, 1, 2, 99);
        for (int i = 0; i < 3000 && calls == 0; i++) usleep(10000);
        EXPECT(calls == 1 && who == 2);
        EXPECT(again.failed() == std::vector<int>{2});
        // Recovery: agree and shrink (refused under the default policy).
        try {
            again.agree();
            EXPECT(false);
        } catch (const nexar::Error& e) {
            EXPECT(e.code() == NEXAR_ERR_UNAVAILABLE);
        }
        again.set_failure_policy(NEXAR_ON_FAILURE_MANUAL);
        EXPECT(again.failure_policy() == NEXAR_ON_FAILURE_MANUAL);
        auto ag = again.agree(~std::uint64_t{0} ^ (std::uint64_t{1} << r));
        EXPECT(ag.flag == ~std::uint64_t{3} && ag.failed == std::vector<int>{2});
        nexar::Comm survivors = again.shrink();
        EXPECT(again.revoked() && survivors.size() == 2 && survivors.rank() == r);
        std::vector<int> v{r + 1};
        survivors.allreduce(v, nexar::Op::sum);
        EXPECT(v[0] == 3);
        // Growth: nobody waits, so grow keeps the two survivors; a joiner
        // with the wrong token is refused.
        nexar::Comm grown = survivors.grow();
        EXPECT(grown.size() == 2 && grown.rank() == r);
        std::vector<int> w{r + 1};
        grown.allreduce(w, nexar::Op::sum);
        EXPECT(w[0] == 3);
        std::string addrs = grown.join_addrs();
        EXPECT(!addrs.empty() && addrs.find(',') != std::string::npos);
        if (r == 0) {
            try {
                (void)nexar::Comm::join(addrs, "not the token", std::chrono::milliseconds{3000});
                EXPECT(false);
            } catch (const nexar::Error& e) {
                EXPECT(e.code() == NEXAR_ERR_AUTH);
            }
        }
        std::printf("rank %d/%d: test_cpp ok (nexar %s)\n", r, n, nexar::version().c_str());
        return 0;
    }
    std::printf("rank %d/%d: test_cpp ok (nexar %s)\n", r, n, nexar::version().c_str());
    return 0;
}
