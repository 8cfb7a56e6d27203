// nexar.hpp - header-only C++17 wrapper over the nexar C ABI (nexar.h).
//
// SPDX-License-Identifier: Apache-2.0
//
//   nexar::Comm world = nexar::Comm::from_env();
//   std::vector<float> grad(n);
//   world.allreduce(grad, nexar::Op::sum);        // in place
//   nexar::Request r = world.iallreduce(a, b, n, nexar::Op::max);
//   r.wait();
//
// Every failing call throws nexar::Error (code() and what(), the latter
// carrying nexar_last_error()). Comm and Request are move-only RAII owners;
// handle() gives the C handle for interop. Thread-safety is that of the C
// API (see nexar.h): one object may be used from several threads as far as
// the C functions it calls allow; moving or destroying it is not concurrent-safe.
// In a child made by fork() without exec() every call throws nexar::Error
// with code NEXAR_ERR_FORKED, and destructors there release nothing.
#ifndef NEXAR_NEXAR_HPP
#define NEXAR_NEXAR_HPP

#include <nexar.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace nexar {

// float16 and bfloat16 are storage types for half-precision elements: the
// raw 16 bits, which nexar reduces in float32.
struct float16 {
    std::uint16_t bits;
};
struct bfloat16 {
    std::uint16_t bits;
};

// datatype_of<T>::value is the nexar_datatype_t of element type T.
template <class T>
struct datatype_of;  // undefined: T is not a nexar element type

#define NEXAR_HPP_DATATYPE(T, V) \
    template <>                  \
    struct datatype_of<T> : std::integral_constant<nexar_datatype_t, V> {}
// @generated datatype_of: go generate ./internal/abi
NEXAR_HPP_DATATYPE(std::int8_t, NEXAR_INT8);
NEXAR_HPP_DATATYPE(std::uint8_t, NEXAR_UINT8);
NEXAR_HPP_DATATYPE(std::int32_t, NEXAR_INT32);
NEXAR_HPP_DATATYPE(std::uint32_t, NEXAR_UINT32);
NEXAR_HPP_DATATYPE(std::int64_t, NEXAR_INT64);
NEXAR_HPP_DATATYPE(std::uint64_t, NEXAR_UINT64);
NEXAR_HPP_DATATYPE(float16, NEXAR_FLOAT16);
NEXAR_HPP_DATATYPE(bfloat16, NEXAR_BFLOAT16);
NEXAR_HPP_DATATYPE(float, NEXAR_FLOAT32);
NEXAR_HPP_DATATYPE(double, NEXAR_FLOAT64);
// @end datatype_of
#undef NEXAR_HPP_DATATYPE

template <class T>
inline constexpr nexar_datatype_t datatype_v = datatype_of<std::remove_cv_t<T>>::value;

// Op names the reduction operators of nexar_op_t.
enum class Op : int {
    sum = NEXAR_SUM,
    prod = NEXAR_PROD,
    min = NEXAR_MIN,
    max = NEXAR_MAX,
    avg = NEXAR_AVG,
    band = NEXAR_BAND,
    bor = NEXAR_BOR,
    bxor = NEXAR_BXOR,
};

inline constexpr int any_source = NEXAR_ANY_SOURCE;
inline constexpr int undefined = NEXAR_UNDEFINED;

// Error is thrown by every failing call.
class Error : public std::exception {
public:
    Error(nexar_result_t code, std::string message) : code_(code), msg_(std::move(message)) {}
    nexar_result_t code() const noexcept { return code_; }
    const char* what() const noexcept override { return msg_.c_str(); }

private:
    nexar_result_t code_;
    std::string msg_;
};

// Status describes a completed receive.
using Status = nexar_status_t;

namespace detail {

inline void check(nexar_result_t r) {
    if (r != NEXAR_SUCCESS) {
        std::string msg = nexar_result_string(r);
        const char* detail = nexar_last_error();
        if (detail != nullptr && detail[0] != '\0') {
            msg += ": ";
            msg += detail;
        }
        throw Error(r, std::move(msg));
    }
}

inline void require(bool ok, const char* what) {
    if (!ok) {
        throw Error(NEXAR_ERR_INVALID_ARGUMENT, std::string("invalid argument: ") + what);
    }
}

inline nexar_op_t op(Op o) noexcept { return static_cast<nexar_op_t>(o); }

// A contiguous container: std::data and std::size work on it.
template <class C, class = void>
struct is_contiguous : std::false_type {};
template <class C>
struct is_contiguous<C, std::void_t<decltype(std::data(std::declval<C&>())),
                                    decltype(std::size(std::declval<C&>()))>>
    : std::negation<std::is_pointer<std::remove_cv_t<std::remove_reference_t<C>>>> {};

template <class C>
using enable_container = std::enable_if_t<is_contiguous<C>::value>;

template <class C>
using elem_t = std::remove_cv_t<std::remove_pointer_t<decltype(std::data(std::declval<C&>()))>>;

}  // namespace detail

// Request owns a nexar_request_t. The destructor waits for the operation
// (ignoring its result, since buffers must outlive it) and frees it; call
// wait() to see errors.
class Request {
public:
    Request() noexcept = default;
    explicit Request(nexar_request_t h) noexcept : h_(h) {}
    Request(Request&& o) noexcept : h_(std::exchange(o.h_, NEXAR_REQUEST_NULL)) {}
    Request& operator=(Request&& o) noexcept {
        if (this != &o) {
            reset();
            h_ = std::exchange(o.h_, NEXAR_REQUEST_NULL);
        }
        return *this;
    }
    Request(const Request&) = delete;
    Request& operator=(const Request&) = delete;
    ~Request() { reset(); }

    // wait blocks until the operation completes; throws its error.
    void wait() { detail::check(nexar_wait(h_)); }

    // test reports whether the operation has completed; throws its error.
    bool test() {
        int done = 0;
        detail::check(nexar_test(h_, &done));
        return done != 0;
    }

    // status describes a completed receive (zeros for other operations).
    Status status() const {
        Status st{};
        detail::check(nexar_request_status(h_, &st));
        return st;
    }

    nexar_request_t handle() const noexcept { return h_; }
    explicit operator bool() const noexcept { return h_ != NEXAR_REQUEST_NULL; }

    // release gives up ownership and returns the C handle.
    nexar_request_t release() noexcept { return std::exchange(h_, NEXAR_REQUEST_NULL); }

private:
    void reset() noexcept {
        if (h_ != NEXAR_REQUEST_NULL) {
            (void)nexar_wait(h_);
            (void)nexar_request_free(h_);
            h_ = NEXAR_REQUEST_NULL;
        }
    }
    nexar_request_t h_ = NEXAR_REQUEST_NULL;
};

// Call is an RPC in flight (Comm::icall), a future of its reply: get()
// waits and returns it (throwing the call's error, every time it is asked),
// ready() tells without waiting. It owns a copy of the request and the
// C request; the destructor waits for the call to end (at its deadline at
// the latest) and frees what the library allocated. Not safe for
// concurrent use; move it between threads.
class Call {
public:
    Call() = default;
    Call(Call&& o) noexcept = default;
    Call& operator=(Call&& o) noexcept {
        if (this != &o) {
            req_ = std::move(o.req_);  // waits for our call first: st_ must outlive it
            st_ = std::move(o.st_);
        }
        return *this;
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    ~Call() {
        req_ = Request();  // waits, then frees the request
        if (st_) nexar_free(st_->reply);
    }

    // get waits for the reply and returns it; throws the call's error.
    std::string get() {
        req_.wait();
        return take();
    }

    // ready reports whether the call has ended; throws its error then.
    bool ready() {
        if (!req_.test()) return false;
        take();
        return true;
    }

    explicit operator bool() const noexcept { return static_cast<bool>(st_); }

private:
    friend class Comm;
    struct State {
        std::string request;  // kept until the call ends
        void* reply = nullptr;
        std::size_t len = 0;
        std::string result;
        bool taken = false;
    };
    std::string take() {
        if (!st_->taken) {
            st_->result.assign(static_cast<const char*>(st_->reply), st_->len);
            nexar_free(st_->reply);
            st_->reply = nullptr;
            st_->taken = true;
        }
        return st_->result;
    }
    std::unique_ptr<State> st_;
    Request req_;
};

// test_any returns the index of a request that has completed (throwing
// its error), or reqs.size() when none has yet. Empty (moved-from or
// released) requests are skipped.
inline std::size_t test_any(std::vector<Request>& reqs) {
    std::vector<nexar_request_t> hs;
    hs.reserve(reqs.size());
    for (const Request& r : reqs) {
        hs.push_back(r.handle());
    }
    std::size_t index = reqs.size();
    int done = 0;
    detail::check(nexar_testany(hs.size(), hs.data(), &index, &done));
    return done ? index : reqs.size();
}

// wait_all waits for every request, then throws the first error seen.
inline void wait_all(std::vector<Request>& reqs) {
    std::exception_ptr first;
    for (Request& r : reqs) {
        try {
            r.wait();
        } catch (...) {
            if (!first) {
                first = std::current_exception();
            }
        }
    }
    if (first) {
        std::rethrow_exception(first);
    }
}

// FailureHandler is told, on a library thread, of each member of a Comm
// found failed: its rank, the code (NEXAR_ERR_PEER_DOWN) and why. What it
// throws is dropped (nexar_comm_set_failure_handler).
using FailureHandler = std::function<void(int rank, nexar_result_t code, const std::string& message)>;

// RPCHandler serves one RPC: the caller's rank and the request; it returns
// the reply. A nexar::Error it throws reaches the caller with its code, any
// other exception as NEXAR_ERR_INTERNAL, both with what().
using RPCHandler = std::function<std::string(int from, std::string_view request)>;

// Comm owns a nexar_comm_t. The destructor destroys it (locally).
class Comm {
public:
    Comm() noexcept = default;
    explicit Comm(nexar_comm_t h) noexcept : h_(h) {}
    explicit Comm(const nexar_config_t& cfg) { detail::check(nexar_comm_init(&cfg, &h_)); }
    Comm(Comm&& o) noexcept
        : h_(std::exchange(o.h_, NEXAR_COMM_NULL)),
          handlers_(std::move(o.handlers_)),
          rpc_handlers_(std::move(o.rpc_handlers_)) {}
    Comm& operator=(Comm&& o) noexcept {
        if (this != &o) {
            reset();
            h_ = std::exchange(o.h_, NEXAR_COMM_NULL);
            handlers_ = std::move(o.handlers_);
            rpc_handlers_ = std::move(o.rpc_handlers_);
        }
        return *this;
    }
    Comm(const Comm&) = delete;
    Comm& operator=(const Comm&) = delete;
    ~Comm() { reset(); }

    // from_env joins the world described by the launcher's environment.
    static Comm from_env() {
        nexar_comm_t h = NEXAR_COMM_NULL;
        detail::check(nexar_comm_init_from_env(&h));
        return Comm(h);
    }

    // join waits in a member's lobby of a running job until the members
    // grow, and returns this process's communicator in the grown world
    // (nexar_comm_join). addrs: the seed's or any member's lobby address,
    // or a comma-separated list; timeout 0: the library default.
    static Comm join(const std::string& addrs, const std::string& token,
                     std::chrono::milliseconds timeout = std::chrono::milliseconds{0}) {
        nexar_config_t cfg = NEXAR_CONFIG_INIT;
        cfg.seed_addr = addrs.c_str();
        cfg.token = token.data();
        cfg.token_len = token.size();
        cfg.timeout_ms = static_cast<std::int64_t>(timeout.count());
        nexar_comm_t h = NEXAR_COMM_NULL;
        detail::check(nexar_comm_join(&cfg, &h));
        return Comm(h);
    }

    nexar_comm_t handle() const noexcept { return h_; }
    explicit operator bool() const noexcept { return h_ != NEXAR_COMM_NULL; }
    // release gives up ownership of the handle. Handlers set by on_failure
    // stay registered and are kept alive for good (leaked), since the
    // handle may outlive this object.
    nexar_comm_t release() noexcept {
        for (auto& p : handlers_) {
            (void)p.release();
        }
        handlers_.clear();
        for (auto& p : rpc_handlers_) {
            (void)p.release();
        }
        rpc_handlers_.clear();
        return std::exchange(h_, NEXAR_COMM_NULL);
    }

    int rank() const {
        int r = 0;
        detail::check(nexar_comm_rank(h_, &r));
        return r;
    }
    int size() const {
        int s = 0;
        detail::check(nexar_comm_size(h_, &s));
        return s;
    }

    // split returns the communicator of this rank's color, ordered by key;
    // an empty Comm for a negative color.
    Comm split(int color, int key) const {
        nexar_comm_t h = NEXAR_COMM_NULL;
        detail::check(nexar_comm_split(h_, color, key, &h));
        return Comm(h);
    }

    void abort() { detail::check(nexar_comm_abort(h_)); }

    // --- RPC ---------------------------------------------------------------

    // serve makes fn the handler of RPC function id (an empty fn removes
    // it); it runs on a library thread, several at once. Handlers stay
    // alive as long as this Comm.
    void serve(std::uint32_t id, RPCHandler fn) {
        if (!fn) {
            detail::check(nexar_rpc_register(h_, id, nullptr, nullptr));
            return;
        }
        auto p = std::make_unique<RPCHandler>(std::move(fn));
        detail::check(nexar_rpc_register(h_, id, &Comm::call_rpc, p.get()));
        rpc_handlers_.push_back(std::move(p));
    }

    // call calls RPC function id on rank peer and returns the reply; the
    // handler's error is thrown as nexar::Error. timeout > 0 is the call's
    // own deadline (NEXAR_ERR_TIMEOUT at it; the communicator's timeout
    // still bounds it); 0 leaves the communicator's.
    std::string call(int peer, std::uint32_t id, std::string_view request = {},
                     std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
        void* reply = nullptr;
        std::size_t len = 0;
        detail::check(nexar_rpc_call_timeout(h_, peer, id, request.data(), request.size(),
                                             static_cast<std::int64_t>(timeout.count()), &reply,
                                             &len));
        std::string out(static_cast<const char*>(reply), len);
        nexar_free(reply);
        return out;
    }

    // icall starts calling RPC function id on rank peer and returns at
    // once; the Call's get() gives the reply. Errors of the call (the
    // handler's, an unknown function, a lost peer, the deadline) are thrown
    // by get() or ready(); bad arguments at once. timeout as call's: the
    // call ends at it even when nobody waits.
    Call icall(int peer, std::uint32_t id, std::string_view request = {},
               std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
        Call c;
        c.st_ = std::make_unique<Call::State>();
        c.st_->request.assign(request.data(), request.size());
        nexar_request_t q = NEXAR_REQUEST_NULL;
        detail::check(nexar_rpc_icall(h_, peer, id, c.st_->request.data(), c.st_->request.size(),
                                      static_cast<std::int64_t>(timeout.count()), &c.st_->reply,
                                      &c.st_->len, &q));
        c.req_ = Request(q);
        return c;
    }

    // --- failure notification ---------------------------------------------

    // failed returns the ranks of the members found failed so far, in the
    // order learned (nexar_comm_get_failed).
    std::vector<int> failed() const {
        std::size_t n = 0;
        detail::check(nexar_comm_get_failed(h_, nullptr, 0, &n));
        std::vector<int> ranks(n);
        while (n > 0) {
            std::size_t got = 0;
            detail::check(nexar_comm_get_failed(h_, ranks.data(), ranks.size(), &got));
            if (got <= ranks.size()) {
                ranks.resize(got);
                break;
            }
            ranks.resize(got); // more failed meanwhile
        }
        return ranks;
    }

    // on_failure makes fn the failure handler (an empty fn removes it):
    // it is called for every failure not reported to an earlier handler,
    // on a library thread, one call at a time. Handlers stay alive as
    // long as this Comm (a replaced one may still be running).
    void on_failure(FailureHandler fn) {
        if (!fn) {
            detail::check(nexar_comm_set_failure_handler(h_, nullptr, nullptr));
            return;
        }
        auto p = std::make_unique<FailureHandler>(std::move(fn));
        detail::check(nexar_comm_set_failure_handler(h_, &Comm::call_failure, p.get()));
        handlers_.push_back(std::move(p));
    }

    // --- recovery without restart (nexar.h; docs/fault-tolerance.md) -------

    // set_failure_policy: what a member's failure does to this communicator
    // (NEXAR_ON_FAILURE_ABORT, _MANUAL or _SHRINK).
    void set_failure_policy(nexar_failure_policy_t p) { detail::check(nexar_comm_set_failure_policy(h_, p)); }
    nexar_failure_policy_t failure_policy() const {
        nexar_failure_policy_t p = NEXAR_ON_FAILURE_ABORT;
        detail::check(nexar_comm_get_failure_policy(h_, &p));
        return p;
    }

    // revoke fails every pending and later call here and on every member.
    void revoke() { detail::check(nexar_comm_revoke(h_)); }
    bool revoked() const {
        int f = 0;
        detail::check(nexar_comm_is_revoked(h_, &f));
        return f != 0;
    }

    // Agreement is what every surviving member's agree returns.
    struct Agreement {
        std::uint64_t flag;      // AND of the flags of the members that took part
        std::vector<int> failed; // the members left out, ascending
    };

    // agree is fault-tolerant agreement among the live members (every member
    // calls it; nexar_comm_agree).
    Agreement agree(std::uint64_t flag = ~std::uint64_t{0}) {
        std::vector<int> failed(static_cast<std::size_t>(size()));
        std::size_t n = 0;
        detail::check(nexar_comm_agree(h_, &flag, failed.data(), failed.size(), &n));
        failed.resize(std::min(n, failed.size()));
        return Agreement{flag, std::move(failed)};
    }

    // shrink returns the survivors' communicator (every live member calls it).
    Comm shrink() {
        nexar_comm_t h = NEXAR_COMM_NULL;
        detail::check(nexar_comm_shrink(h_, &h));
        return Comm(h);
    }

    // grow admits the processes waiting to join (Comm::join) and returns the
    // grown communicator: the live members in order, then the joiners
    // (every live member calls it; nexar_comm_grow).
    Comm grow() {
        nexar_comm_t h = NEXAR_COMM_NULL;
        detail::check(nexar_comm_grow(h_, &h));
        return Comm(h);
    }

    // join_addrs lists the live members' lobby addresses, where a process
    // started later joins (nexar_comm_get_join_addrs), comma-separated.
    std::string join_addrs() const {
        std::size_t need = 0;
        nexar_result_t rc = nexar_comm_get_join_addrs(h_, nullptr, 0, &need);
        if (rc != NEXAR_SUCCESS && rc != NEXAR_ERR_TRUNCATED) {
            detail::check(rc);
        }
        std::string s(need, '\0');
        detail::check(nexar_comm_get_join_addrs(h_, s.data(), s.size(), &need));
        s.resize(need > 0 ? need - 1 : 0);
        return s;
    }

    // --- point-to-point ---------------------------------------------------

    template <class T>
    void send(const T* buf, std::size_t count, int peer, std::uint64_t tag = 0) {
        detail::check(nexar_send(buf, count, datatype_v<T>, peer, tag, h_));
    }
    template <class C, class = detail::enable_container<const C>>
    void send(const C& c, int peer, std::uint64_t tag = 0) {
        send(std::data(c), std::size(c), peer, tag);
    }

    template <class T>
    Status recv(T* buf, std::size_t count, int peer, std::uint64_t tag = 0) {
        Status st{};
        detail::check(nexar_recv_status(buf, count, datatype_v<T>, peer, tag, h_, &st));
        return st;
    }
    template <class C, class = detail::enable_container<C>>
    Status recv(C& c, int peer, std::uint64_t tag = 0) {
        return recv(std::data(c), std::size(c), peer, tag);
    }

    template <class T>
    [[nodiscard]] Request isend(const T* buf, std::size_t count, int peer, std::uint64_t tag = 0) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_isend(buf, count, datatype_v<T>, peer, tag, h_, &r));
        return Request(r);
    }
    template <class C, class = detail::enable_container<const C>>
    [[nodiscard]] Request isend(const C& c, int peer, std::uint64_t tag = 0) {
        return isend(std::data(c), std::size(c), peer, tag);
    }

    template <class T>
    [[nodiscard]] Request irecv(T* buf, std::size_t count, int peer, std::uint64_t tag = 0) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_irecv(buf, count, datatype_v<T>, peer, tag, h_, &r));
        return Request(r);
    }
    template <class C, class = detail::enable_container<C>>
    [[nodiscard]] Request irecv(C& c, int peer, std::uint64_t tag = 0) {
        return irecv(std::data(c), std::size(c), peer, tag);
    }

    // --- collectives: pointer + count -------------------------------------
    // Pass the same pointer as send and recv for the in-place form.

    template <class T>
    void allreduce(const T* send, T* recv, std::size_t count, Op op) {
        detail::check(nexar_allreduce(send, recv, count, datatype_v<T>, detail::op(op), h_));
    }
    template <class T>
    void broadcast(T* buf, std::size_t count, int root) {
        detail::check(nexar_broadcast(buf, count, datatype_v<T>, root, h_));
    }
    template <class T>
    void reduce(const T* send, T* recv, std::size_t count, Op op, int root) {
        detail::check(nexar_reduce(send, recv, count, datatype_v<T>, detail::op(op), root, h_));
    }
    template <class T>
    void allgather(const T* send, T* recv, std::size_t sendcount) {
        detail::check(nexar_allgather(send, recv, sendcount, datatype_v<T>, h_));
    }
    template <class T>
    void allgatherv(const T* send, std::size_t sendcount, T* recv, const std::size_t* recvcounts,
                    const std::size_t* displs) {
        detail::check(nexar_allgatherv(send, sendcount, recv, recvcounts, displs, datatype_v<T>, h_));
    }
    template <class T>
    void reduce_scatter(const T* send, T* recv, std::size_t recvcount, Op op) {
        detail::check(
            nexar_reduce_scatter(send, recv, recvcount, datatype_v<T>, detail::op(op), h_));
    }
    template <class T>
    void alltoall(const T* send, T* recv, std::size_t count_per_peer) {
        detail::check(nexar_alltoall(send, recv, count_per_peer, datatype_v<T>, h_));
    }
    template <class T>
    void alltoallv(const T* send, const std::size_t* sendcounts, const std::size_t* sdispls,
                   T* recv, const std::size_t* recvcounts, const std::size_t* rdispls) {
        detail::check(nexar_alltoallv(send, sendcounts, sdispls, recv, recvcounts, rdispls,
                                      datatype_v<T>, h_));
    }
    template <class T>
    void gather(const T* send, T* recv, std::size_t sendcount, int root) {
        detail::check(nexar_gather(send, recv, sendcount, datatype_v<T>, root, h_));
    }
    template <class T>
    void gatherv(const T* send, std::size_t sendcount, T* recv, const std::size_t* recvcounts,
                 const std::size_t* displs, int root) {
        detail::check(
            nexar_gatherv(send, sendcount, recv, recvcounts, displs, datatype_v<T>, root, h_));
    }
    template <class T>
    void scatter(const T* send, T* recv, std::size_t recvcount, int root) {
        detail::check(nexar_scatter(send, recv, recvcount, datatype_v<T>, root, h_));
    }
    template <class T>
    void scatterv(const T* send, const std::size_t* sendcounts, const std::size_t* displs, T* recv,
                  std::size_t recvcount, int root) {
        detail::check(
            nexar_scatterv(send, sendcounts, displs, recv, recvcount, datatype_v<T>, root, h_));
    }
    template <class T>
    void scan(const T* send, T* recv, std::size_t count, Op op) {
        detail::check(nexar_scan(send, recv, count, datatype_v<T>, detail::op(op), h_));
    }
    template <class T>
    void exscan(const T* send, T* recv, std::size_t count, Op op) {
        detail::check(nexar_exscan(send, recv, count, datatype_v<T>, detail::op(op), h_));
    }
    void barrier() { detail::check(nexar_barrier(h_)); }

    // --- stream-ordered: the _stream variants (CUDA) ----------------------
    // Each is the blocking call ordered on stream, a cudaStream_t (nullptr:
    // the legacy default stream); buffers may be device or host memory. The
    // call waits for the work enqueued on stream before it and returns once
    // its host part is done: device results reach the buffers in stream
    // order (synchronize the stream before reading them on the host). A
    // non-null stream where libnexar found no CUDA runtime throws
    // nexar::Error (NEXAR_ERR_INVALID_ARGUMENT, saying why). nexar.h has the
    // rest: staging, NCCL within a host, GPUDirect for send and recv.
    template <class T>
    void allreduce_stream(const T* send, T* recv, std::size_t count, Op op, void* stream) {
        detail::check(nexar_allreduce_stream(send, recv, count, datatype_v<T>, detail::op(op), h_, stream));
    }
    template <class T>
    void broadcast_stream(T* buf, std::size_t count, int root, void* stream) {
        detail::check(nexar_broadcast_stream(buf, count, datatype_v<T>, root, h_, stream));
    }
    // allgather_stream: recv holds size() * sendcount elements.
    template <class T>
    void allgather_stream(const T* send, T* recv, std::size_t sendcount, void* stream) {
        detail::check(nexar_allgather_stream(send, recv, sendcount, datatype_v<T>, h_, stream));
    }
    // reduce_scatter_stream: send holds size() * recvcount elements.
    template <class T>
    void reduce_scatter_stream(const T* send, T* recv, std::size_t recvcount, Op op, void* stream) {
        detail::check(
            nexar_reduce_scatter_stream(send, recv, recvcount, datatype_v<T>, detail::op(op), h_, stream));
    }
    // reduce_stream: recv is used on root only (nullptr elsewhere).
    template <class T>
    void reduce_stream(const T* send, T* recv, std::size_t count, Op op, int root, void* stream) {
        detail::check(
            nexar_reduce_stream(send, recv, count, datatype_v<T>, detail::op(op), root, h_, stream));
    }
    // alltoall_stream: send and recv hold size() * count_per_peer elements.
    template <class T>
    void alltoall_stream(const T* send, T* recv, std::size_t count_per_peer, void* stream) {
        detail::check(nexar_alltoall_stream(send, recv, count_per_peer, datatype_v<T>, h_, stream));
    }
    // alltoallv_stream: the four arrays are host memory, read before the
    // call returns.
    template <class T>
    void alltoallv_stream(const T* send, const std::size_t* sendcounts, const std::size_t* sdispls,
                          T* recv, const std::size_t* recvcounts, const std::size_t* rdispls,
                          void* stream) {
        detail::check(nexar_alltoallv_stream(send, sendcounts, sdispls, recv, recvcounts, rdispls,
                                             datatype_v<T>, h_, stream));
    }
    // gather_stream: root's recv holds size() * sendcount elements (nullptr
    // elsewhere).
    template <class T>
    void gather_stream(const T* send, T* recv, std::size_t sendcount, int root, void* stream) {
        detail::check(nexar_gather_stream(send, recv, sendcount, datatype_v<T>, root, h_, stream));
    }
    // scatter_stream: root's send holds size() * recvcount elements (nullptr
    // elsewhere).
    template <class T>
    void scatter_stream(const T* send, T* recv, std::size_t recvcount, int root, void* stream) {
        detail::check(nexar_scatter_stream(send, recv, recvcount, datatype_v<T>, root, h_, stream));
    }
    template <class T>
    void send_stream(const T* buf, std::size_t count, int peer, std::uint64_t tag, void* stream) {
        detail::check(nexar_send_stream(buf, count, datatype_v<T>, peer, tag, h_, stream));
    }
    // recv_stream reports no Status (nexar_recv_stream has none): a message
    // longer than count elements throws, as recv does.
    template <class T>
    void recv_stream(T* buf, std::size_t count, int peer, std::uint64_t tag, void* stream) {
        detail::check(nexar_recv_stream(buf, count, datatype_v<T>, peer, tag, h_, stream));
    }

    // --- collectives: contiguous containers -------------------------------

    // allreduce in place.
    template <class C, class = detail::enable_container<C>>
    void allreduce(C& buf, Op op) {
        allreduce(std::data(buf), std::data(buf), std::size(buf), op);
    }
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void allreduce(const C1& send, C2& recv, Op op) {
        detail::require(std::size(recv) >= std::size(send), "allreduce: recv smaller than send");
        allreduce(std::data(send), std::data(recv), std::size(send), op);
    }
    template <class C, class = detail::enable_container<C>>
    void broadcast(C& buf, int root) {
        broadcast(std::data(buf), std::size(buf), root);
    }
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void reduce(const C1& send, C2& recv, Op op, int root) {
        detail::require(rank() != root || std::size(recv) >= std::size(send),
                        "reduce: recv smaller than send on root");
        reduce(std::data(send), std::data(recv), std::size(send), op, root);
    }
    // allgather: recv must hold size() * send.size() elements.
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void allgather(const C1& send, C2& recv) {
        detail::require(std::size(recv) >= std::size(send) * static_cast<std::size_t>(size()),
                        "allgather: recv must hold size() * send.size() elements");
        allgather(std::data(send), std::data(recv), std::size(send));
    }
    // allgatherv: rank r's send lands at recv[displs[r]], counts[r] elements.
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void allgatherv(const C1& send, C2& recv, const std::vector<std::size_t>& counts,
                    const std::vector<std::size_t>& displs) {
        const std::size_t n = static_cast<std::size_t>(size());
        detail::require(counts.size() == n && displs.size() == n,
                        "allgatherv: counts and displs need size() entries");
        allgatherv(std::data(send), std::size(send), std::data(recv), counts.data(), displs.data());
    }
    // reduce_scatter: send holds size() * recv.size() elements.
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void reduce_scatter(const C1& send, C2& recv, Op op) {
        detail::require(std::size(send) >= std::size(recv) * static_cast<std::size_t>(size()),
                        "reduce_scatter: send must hold size() * recv.size() elements");
        reduce_scatter(std::data(send), std::data(recv), std::size(recv), op);
    }
    // alltoall: both hold size() equal blocks.
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void alltoall(const C1& send, C2& recv) {
        const std::size_t n = static_cast<std::size_t>(size());
        detail::require(std::size(send) % n == 0 && std::size(recv) >= std::size(send),
                        "alltoall: send must be size() equal blocks and recv as large");
        alltoall(std::data(send), std::data(recv), std::size(send) / n);
    }
    // gather: recv (root only) must hold size() * send.size() elements.
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void gather(const C1& send, C2& recv, int root) {
        detail::require(rank() != root ||
                            std::size(recv) >= std::size(send) * static_cast<std::size_t>(size()),
                        "gather: recv must hold size() * send.size() elements on root");
        gather(std::data(send), std::data(recv), std::size(send), root);
    }
    // scatter: send (root only) holds size() * recv.size() elements.
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void scatter(const C1& send, C2& recv, int root) {
        detail::require(rank() != root ||
                            std::size(send) >= std::size(recv) * static_cast<std::size_t>(size()),
                        "scatter: send must hold size() * recv.size() elements on root");
        scatter(std::data(send), std::data(recv), std::size(recv), root);
    }
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void scan(const C1& send, C2& recv, Op op) {
        detail::require(std::size(recv) >= std::size(send), "scan: recv smaller than send");
        scan(std::data(send), std::data(recv), std::size(send), op);
    }
    template <class C1, class C2, class = detail::enable_container<const C1>,
              class = detail::enable_container<C2>>
    void exscan(const C1& send, C2& recv, Op op) {
        detail::require(std::size(recv) >= std::size(send), "exscan: recv smaller than send");
        exscan(std::data(send), std::data(recv), std::size(send), op);
    }

    // --- bucketed and compressed allreduce ---------------------------------
    // allreduce_multi reduces every buffer in place (bufs[i]: counts[i]
    // elements), packed into buckets of at most bucket_bytes (0: 25 MiB);
    // see nexar_allreduce_multi. iallreduce_multi is its non-blocking form:
    // the buffers must stay valid until the Request completes.

    template <class T>
    void allreduce_multi(T* const* bufs, const std::size_t* counts, std::size_t n, Op op,
                         std::size_t bucket_bytes = 0) {
        std::vector<void*> p(bufs, bufs + n);
        detail::check(nexar_allreduce_multi(nullptr, p.data(), counts, n, datatype_v<T>,
                                            detail::op(op), bucket_bytes, h_));
    }
    template <class C, class = detail::enable_container<C>>
    void allreduce_multi(std::vector<C>& bufs, Op op, std::size_t bucket_bytes = 0) {
        std::vector<void*> p;
        std::vector<std::size_t> n;
        multi_args(bufs, p, n);
        detail::check(nexar_allreduce_multi(nullptr, p.data(), n.data(), n.size(),
                                            datatype_v<multi_value_t<C>>, detail::op(op),
                                            bucket_bytes, h_));
    }
    template <class C, class = detail::enable_container<C>>
    [[nodiscard]] Request iallreduce_multi(std::vector<C>& bufs, Op op,
                                           std::size_t bucket_bytes = 0) {
        std::vector<void*> p;
        std::vector<std::size_t> n;
        multi_args(bufs, p, n);
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_iallreduce_multi(nullptr, p.data(), n.data(), n.size(),
                                             datatype_v<multi_value_t<C>>, detail::op(op),
                                             bucket_bytes, h_, &r));
        return Request(r);
    }

    // allreduce_compressed sums a sparsified buf over the ranks in place;
    // residual (count floats, or nullptr) is the caller's error feedback.
    // See nexar_allreduce_compressed.
    void allreduce_compressed(float* buf, float* residual, std::size_t count,
                              nexar_compress_t method, double ratio, std::uint64_t seed = 0) {
        detail::check(nexar_allreduce_compressed(buf, residual, count, NEXAR_FLOAT32, method, ratio,
                                                 seed, h_));
    }

   private:
    template <class C>
    using multi_value_t = std::remove_cv_t<std::remove_reference_t<decltype(*std::data(std::declval<C&>()))>>;
    template <class C>
    static void multi_args(std::vector<C>& bufs, std::vector<void*>& p, std::vector<std::size_t>& n) {
        p.reserve(bufs.size());
        n.reserve(bufs.size());
        for (auto& b : bufs) {
            p.push_back(static_cast<void*>(std::data(b)));
            n.push_back(std::size(b));
        }
    }

   public:
    // --- non-blocking collectives -------------------------------------------
    // Buffers must stay valid until the Request completes.

    template <class T>
    [[nodiscard]] Request iallreduce(const T* send, T* recv, std::size_t count, Op op) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(
            nexar_iallreduce(send, recv, count, datatype_v<T>, detail::op(op), h_, &r));
        return Request(r);
    }
    template <class C, class = detail::enable_container<C>>
    [[nodiscard]] Request iallreduce(C& buf, Op op) {
        return iallreduce(std::data(buf), std::data(buf), std::size(buf), op);
    }
    template <class T>
    [[nodiscard]] Request ibroadcast(T* buf, std::size_t count, int root) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_ibroadcast(buf, count, datatype_v<T>, root, h_, &r));
        return Request(r);
    }
    template <class C, class = detail::enable_container<C>>
    [[nodiscard]] Request ibroadcast(C& buf, int root) {
        return ibroadcast(std::data(buf), std::size(buf), root);
    }
    template <class T>
    [[nodiscard]] Request ireduce(const T* send, T* recv, std::size_t count, Op op, int root) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(
            nexar_ireduce(send, recv, count, datatype_v<T>, detail::op(op), root, h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request iallgather(const T* send, T* recv, std::size_t sendcount) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_iallgather(send, recv, sendcount, datatype_v<T>, h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request ireduce_scatter(const T* send, T* recv, std::size_t recvcount, Op op) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_ireduce_scatter(send, recv, recvcount, datatype_v<T>, detail::op(op),
                                            h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request ialltoall(const T* send, T* recv, std::size_t count_per_peer) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_ialltoall(send, recv, count_per_peer, datatype_v<T>, h_, &r));
        return Request(r);
    }
    [[nodiscard]] Request ibarrier() {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_ibarrier(h_, &r));
        return Request(r);
    }
    // The non-blocking forms of the rest take the blocking form's
    // arguments; counts/displs arrays are copied by the call.
    template <class T>
    [[nodiscard]] Request iallgatherv(const T* send, std::size_t sendcount, T* recv,
                                      const std::size_t* recvcounts, const std::size_t* displs) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_iallgatherv(send, sendcount, recv, recvcounts, displs, datatype_v<T>,
                                        h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request ialltoallv(const T* send, const std::size_t* sendcounts,
                                     const std::size_t* sdispls, T* recv,
                                     const std::size_t* recvcounts, const std::size_t* rdispls) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_ialltoallv(send, sendcounts, sdispls, recv, recvcounts, rdispls,
                                       datatype_v<T>, h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request igather(const T* send, T* recv, std::size_t sendcount, int root) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_igather(send, recv, sendcount, datatype_v<T>, root, h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request igatherv(const T* send, std::size_t sendcount, T* recv,
                                   const std::size_t* recvcounts, const std::size_t* displs,
                                   int root) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_igatherv(send, sendcount, recv, recvcounts, displs, datatype_v<T>,
                                     root, h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request iscatter(const T* send, T* recv, std::size_t recvcount, int root) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_iscatter(send, recv, recvcount, datatype_v<T>, root, h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request iscatterv(const T* send, const std::size_t* sendcounts,
                                    const std::size_t* displs, T* recv, std::size_t recvcount,
                                    int root) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_iscatterv(send, sendcounts, displs, recv, recvcount, datatype_v<T>,
                                      root, h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request iscan(const T* send, T* recv, std::size_t count, Op op) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_iscan(send, recv, count, datatype_v<T>, detail::op(op), h_, &r));
        return Request(r);
    }
    template <class T>
    [[nodiscard]] Request iexscan(const T* send, T* recv, std::size_t count, Op op) {
        nexar_request_t r = NEXAR_REQUEST_NULL;
        detail::check(nexar_iexscan(send, recv, count, datatype_v<T>, detail::op(op), h_, &r));
        return Request(r);
    }

    // --- diagnostics (docs/diagnostics.md) ----------------------------------

    // Writes this communicator's flight record (its last operations) as
    // JSON to path; `nexar diagnose DIR` reads every rank's.
    void dump_flight_record(const std::string& path) const {
        detail::check(nexar_comm_dump_flight_record(h_, path.c_str()));
    }

    // --- memory and traffic statistics (docs/memory.md) ---------------------

    // stats: this communicator's memory and traffic (nexar_comm_get_stats:
    // which figures are per process and which per communicator). Safe from
    // any thread.
    nexar_stats_t stats() const {
        nexar_stats_t s = NEXAR_STATS_INIT;
        detail::check(nexar_comm_get_stats(h_, &s));
        return s;
    }

private:
    void reset() noexcept {
        if (h_ != NEXAR_COMM_NULL) {
            (void)nexar_comm_destroy(h_); // after it, no handler runs
            h_ = NEXAR_COMM_NULL;
        }
        handlers_.clear();
        rpc_handlers_.clear();
    }
    static char* c_message(const char* s) noexcept {
        std::size_t n = std::strlen(s) + 1;
        char* m = static_cast<char*>(std::malloc(n));
        if (m != nullptr) {
            std::memcpy(m, s, n);
        }
        return m;
    }
    static nexar_result_t call_rpc(nexar_comm_t, int from, std::uint32_t, const void* req,
                                   std::size_t req_len, void** reply, std::size_t* reply_len,
                                   void* user) noexcept {
        try {
            std::string out = (*static_cast<RPCHandler*>(user))(
                from, std::string_view(static_cast<const char*>(req), req_len));
            if (!out.empty()) {
                void* m = std::malloc(out.size());
                if (m == nullptr) {
                    return NEXAR_ERR_INTERNAL;
                }
                std::memcpy(m, out.data(), out.size());
                *reply = m;
                *reply_len = out.size();
            }
            return NEXAR_SUCCESS;
        } catch (const Error& e) {
            *reply = c_message(e.what());
            return e.code();
        } catch (const std::exception& e) {
            *reply = c_message(e.what());
            return NEXAR_ERR_INTERNAL;
        } catch (...) {
            return NEXAR_ERR_INTERNAL;
        }
    }
    static void call_failure(nexar_comm_t, int rank, nexar_result_t code, const char* message,
                             void* user) noexcept {
        try {
            (*static_cast<FailureHandler*>(user))(rank, code, message);
        } catch (...) {
        }
    }
    nexar_comm_t h_ = NEXAR_COMM_NULL;
    std::vector<std::unique_ptr<FailureHandler>> handlers_;
    std::vector<std::unique_ptr<RPCHandler>> rpc_handlers_;
};

// version returns the loaded library's version as "major.minor.patch".
inline std::string version() {
    int ma = 0, mi = 0, pa = 0;
    nexar_get_version(&ma, &mi, &pa);
    return std::to_string(ma) + "." + std::to_string(mi) + "." + std::to_string(pa);
}

}  // namespace nexar

#endif  // NEXAR_NEXAR_HPP
