// test_cpp_device: the C++ wrapper's _stream methods with CUDA device
// memory, against the fake CUDA runtime (tests/fakes/cudart: device memory
// the host cannot read, streams that run after a delay on threads of their
// own). The program links the fake and NEXAR_CUDART names the same file,
// so libnexar and this program share one runtime. Inputs are written by
// copies queued on the stream and results read back on it: a call that did
// not wait for the stream, or whose results were not ordered on it, reads
// or leaves the fake's fill bytes (0xDE) and fails element by element.
#include <nexar/nexar.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// The runtime's entry points, with its signatures (no CUDA header needed).
extern "C" {
typedef void* cudaStream_t;
int cudaMalloc(void** p, std::size_t n);
int cudaFree(void* p);
int cudaMemcpyAsync(void* dst, const void* src, std::size_t n, int kind, cudaStream_t s);
int cudaMallocHost(void** p, std::size_t n);
int cudaFreeHost(void* p);
int cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags);
int cudaStreamSynchronize(cudaStream_t s);
}

#define EXPECT(cond, ...)                                                  \
    do {                                                                   \
        if (!(cond)) {                                                     \
            std::fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                             \
            std::fprintf(stderr, "\n");                                    \
            std::exit(1);                                                  \
        }                                                                  \
    } while (0)
#define CU(call)                                                            \
    do {                                                                    \
        int e_ = (call);                                                    \
        EXPECT(e_ == 0, "%s -> cudaError %d", #call, e_);                   \
    } while (0)

namespace {

enum { H2D = 1, D2H = 2 };

// Device is n elements of device memory, written and read on stream s
// through pinned host memory.
template <class T>
struct Device {
    T* p = nullptr;
    std::size_t n;
    cudaStream_t s;
    T* pin = nullptr;
    Device(std::size_t n_, cudaStream_t s_) : n(n_), s(s_) {
        CU(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)));
        CU(cudaMallocHost(reinterpret_cast<void**>(&pin), n * sizeof(T)));
    }
    ~Device() {
        cudaFree(p);
        cudaFreeHost(pin);
    }
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;
    // put queues a copy of v onto the stream (the host returns at once).
    void put(const std::vector<T>& v) {
        std::memcpy(pin, v.data(), n * sizeof(T));
        CU(cudaMemcpyAsync(p, pin, n * sizeof(T), H2D, s));
    }
    // get is the contents after the work queued on the stream so far.
    std::vector<T> get() {
        CU(cudaMemcpyAsync(pin, p, n * sizeof(T), D2H, s));
        CU(cudaStreamSynchronize(s));
        return std::vector<T>(pin, pin + n);
    }
};

template <class T>
void expect_eq(const std::vector<T>& got, const std::vector<T>& want, const char* what) {
    EXPECT(got.size() == want.size(), "%s: %zu elements, want %zu", what, got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); i++) {
        EXPECT(got[i] == want[i], "%s[%zu] = %lld, want %lld", what, i, static_cast<long long>(got[i]),
               static_cast<long long>(want[i]));
    }
}

}  // namespace

int main() {
    nexar::Comm world = nexar::Comm::from_env();
    const int r = world.rank(), n = world.size();
    const std::size_t un = static_cast<std::size_t>(n);
    cudaStream_t s;
    CU(cudaStreamCreateWithFlags(&s, 1));  // cudaStreamNonBlocking
    const std::size_t count = 1001;

    {  // allreduce_stream, int64 sum, out of place and in place
        std::vector<std::int64_t> in(count), want(count);
        for (std::size_t i = 0; i < count; i++) {
            in[i] = r * 1000000 + static_cast<std::int64_t>(i);
            want[i] = static_cast<std::int64_t>(i) * n + 1000000LL * n * (n - 1) / 2;
        }
        Device<std::int64_t> a(count, s), b(count, s);
        a.put(in);
        world.allreduce_stream(a.p, b.p, count, nexar::Op::sum, s);
        expect_eq(b.get(), want, "allreduce_stream");
        expect_eq(a.get(), in, "allreduce_stream sendbuf");
        world.allreduce_stream(a.p, a.p, count, nexar::Op::sum, s);
        expect_eq(a.get(), want, "allreduce_stream in place");
    }
    {  // allreduce_stream, float max (the element type picks the datatype)
        std::vector<float> in(count), want(count);
        for (std::size_t i = 0; i < count; i++) {
            in[i] = static_cast<float>(r) + 0.5f * static_cast<float>(i);
            want[i] = static_cast<float>(n - 1) + 0.5f * static_cast<float>(i);
        }
        Device<float> a(count, s);
        a.put(in);
        world.allreduce_stream(a.p, a.p, count, nexar::Op::max, s);
        std::vector<float> got = a.get();
        for (std::size_t i = 0; i < count; i++) EXPECT(got[i] == want[i], "max[%zu] = %g, want %g", i, got[i], want[i]);
    }
    {  // broadcast_stream from the last rank
        const int root = n - 1;
        std::vector<std::int32_t> v(count);
        for (std::size_t i = 0; i < count; i++) v[i] = static_cast<std::int32_t>(i * 7 + 3);
        Device<std::int32_t> a(count, s);
        a.put(r == root ? v : std::vector<std::int32_t>(count, -1));
        world.broadcast_stream(a.p, count, root, s);
        expect_eq(a.get(), v, "broadcast_stream");
    }
    {  // allgather_stream
        std::vector<std::int64_t> mine(count), want(count * un);
        for (std::size_t i = 0; i < count; i++) mine[i] = r * 10000 + static_cast<std::int64_t>(i);
        for (std::size_t k = 0; k < un; k++)
            for (std::size_t i = 0; i < count; i++) want[k * count + i] = static_cast<std::int64_t>(k) * 10000 + static_cast<std::int64_t>(i);
        Device<std::int64_t> a(count, s), b(count * un, s);
        a.put(mine);
        world.allgather_stream(a.p, b.p, count, s);
        expect_eq(b.get(), want, "allgather_stream");
    }
    {  // reduce_scatter_stream: block k of rank j holds j + k*100 + i
        std::vector<std::int64_t> in(count * un), want(count);
        for (std::size_t k = 0; k < un; k++)
            for (std::size_t i = 0; i < count; i++) in[k * count + i] = r + static_cast<std::int64_t>(k * 100 + i);
        for (std::size_t i = 0; i < count; i++)
            want[i] = static_cast<std::int64_t>(n) * (n - 1) / 2 + n * static_cast<std::int64_t>(static_cast<std::size_t>(r) * 100 + i);
        Device<std::int64_t> a(count * un, s), b(count, s);
        a.put(in);
        world.reduce_scatter_stream(a.p, b.p, count, nexar::Op::sum, s);
        expect_eq(b.get(), want, "reduce_scatter_stream");
    }
    {  // reduce_stream to rank 0, int64 sum; the other ranks pass recv nullptr
        std::vector<std::int64_t> in(count), want(count);
        for (std::size_t i = 0; i < count; i++) {
            in[i] = r * 1000000 + static_cast<std::int64_t>(i);
            want[i] = static_cast<std::int64_t>(i) * n + 1000000LL * n * (n - 1) / 2;
        }
        Device<std::int64_t> a(count, s), b(count, s);
        a.put(in);
        world.reduce_stream(a.p, r == 0 ? b.p : nullptr, count, nexar::Op::sum, 0, s);
        if (r == 0) expect_eq(b.get(), want, "reduce_stream");
        expect_eq(a.get(), in, "reduce_stream sendbuf");
    }
    {  // alltoall_stream: block j of rank r goes to block r of rank j
        std::vector<std::int32_t> in(count * un), want(count * un);
        for (std::size_t j = 0; j < un; j++)
            for (std::size_t i = 0; i < count; i++) {
                in[j * count + i] = static_cast<std::int32_t>(r * 100000 + static_cast<int>(j * 1000 + i));
                want[j * count + i] = static_cast<std::int32_t>(static_cast<int>(j) * 100000 + r * 1000 + static_cast<int>(i));
            }
        Device<std::int32_t> a(count * un, s), b(count * un, s);
        a.put(in);
        world.alltoall_stream(a.p, b.p, count, s);
        expect_eq(b.get(), want, "alltoall_stream");
    }
    {  // alltoallv_stream: rank r sends r+j+1 elements to rank j, packed
        std::vector<std::size_t> sc(un), sd(un), rc(un), rd(un);
        std::size_t sn = 0, rn = 0;
        for (std::size_t j = 0; j < un; j++) {
            sc[j] = static_cast<std::size_t>(r) + j + 1;
            sd[j] = sn;
            sn += sc[j];
            rc[j] = j + static_cast<std::size_t>(r) + 1;
            rd[j] = rn;
            rn += rc[j];
        }
        std::vector<std::int64_t> in(sn), want(rn);
        for (std::size_t j = 0; j < un; j++) {
            for (std::size_t k = 0; k < sc[j]; k++) in[sd[j] + k] = r * 1000 + static_cast<std::int64_t>(j * 100 + k);
            for (std::size_t k = 0; k < rc[j]; k++) want[rd[j] + k] = static_cast<std::int64_t>(j) * 1000 + r * 100 + static_cast<std::int64_t>(k);
        }
        Device<std::int64_t> a(sn, s), b(rn, s);
        a.put(in);
        world.alltoallv_stream(a.p, sc.data(), sd.data(), b.p, rc.data(), rd.data(), s);
        expect_eq(b.get(), want, "alltoallv_stream");
    }
    {  // gather_stream to the last rank, then scatter_stream back from it
        const int root = n - 1;
        std::vector<std::int64_t> mine(count), all(count * un);
        for (std::size_t i = 0; i < count; i++) mine[i] = r * 10000 + static_cast<std::int64_t>(i);
        for (std::size_t k = 0; k < un; k++)
            for (std::size_t i = 0; i < count; i++) all[k * count + i] = static_cast<std::int64_t>(k) * 10000 + static_cast<std::int64_t>(i);
        Device<std::int64_t> a(count, s), b(count * un, s), c(count, s);
        a.put(mine);
        world.gather_stream(a.p, r == root ? b.p : nullptr, count, root, s);
        if (r == root) expect_eq(b.get(), all, "gather_stream");
        world.scatter_stream(r == root ? b.p : nullptr, c.p, count, root, s);
        expect_eq(c.get(), mine, "scatter_stream");
    }
    if (n > 1) {  // send_stream / recv_stream around a ring
        const int next = (r + 1) % n, prev = (r + n - 1) % n;
        std::vector<std::uint8_t> out(count), want(count);
        for (std::size_t i = 0; i < count; i++) {
            out[i] = static_cast<std::uint8_t>(r * 31 + static_cast<int>(i));
            want[i] = static_cast<std::uint8_t>(prev * 31 + static_cast<int>(i));
        }
        Device<std::uint8_t> a(count, s), b(count, s);
        a.put(out);
        if (r % 2 == 0) {
            world.send_stream(a.p, count, next, 5, s);
            world.recv_stream(b.p, count, prev, 5, s);
        } else {
            world.recv_stream(b.p, count, prev, 5, s);
            world.send_stream(a.p, count, next, 5, s);
        }
        expect_eq(b.get(), want, "recv_stream");
    }
    {  // a bad argument throws nexar::Error naming it
        bool threw = false;
        try {
            world.allreduce_stream<std::int64_t>(nullptr, nullptr, 4, nexar::Op::sum, s);
        } catch (const nexar::Error& e) {
            threw = e.code() == NEXAR_ERR_INVALID_ARGUMENT;
        }
        EXPECT(threw, "allreduce_stream of NULL buffers did not throw NEXAR_ERR_INVALID_ARGUMENT");
    }
    {  // a bad root throws nexar::Error naming it
        Device<std::int64_t> a(count * un, s);
        std::string what;
        try {
            world.gather_stream(a.p, a.p, count, n, s);
        } catch (const nexar::Error& e) {
            if (e.code() == NEXAR_ERR_INVALID_ARGUMENT) what = e.what();
        }
        EXPECT(what.find("nexar_gather_stream") != std::string::npos && what.find("root") != std::string::npos,
               "gather_stream with root %d: %s", n, what.c_str());
    }
    std::printf("rank %d: cpp device ok\n", r);
    return 0;
}
