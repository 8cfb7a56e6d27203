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
    std::printf("rank %d: cpp device ok\n", r);
    return 0;
}
