// _nexar: the thin pybind11 layer between Python and include/nexar.h.
//
// It takes raw addresses (integers) and element counts; turning numpy
// arrays, buffer-protocol objects and torch tensors into addresses is done in
// Python (nexar/_buffers.py), which also keeps the objects alive. Every call
// that may block releases the GIL. Errors become a C++ NexarError, translated
// into the Python exception built by the factory nexar/_errors.py installs.
//
// The Go runtime inside libnexar.so does not survive fork() without exec():
// a pthread_atfork child handler marks the child, and every call made there
// raises instead of hanging in a runtime whose threads are gone.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <pthread.h>
#ifdef __linux__
#include <sys/mman.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

extern "C" {
#include "nexar.h"
}

namespace py = pybind11;

namespace {

std::atomic<bool> g_forked{false};

void on_fork_child() { g_forked.store(true); }

// NexarError carries a nexar_result_t and the detail from nexar_last_error.
struct NexarError : std::exception {
    int code;
    std::string msg;
    NexarError(int c, std::string m) : code(c), msg(std::move(m)) {}
    const char* what() const noexcept override { return msg.c_str(); }
};

// ForkError is raised for any call made in a forked child.
struct ForkError : std::exception {
    const char* what() const noexcept override {
        return "nexar: libnexar cannot be used in a child created by fork() without exec(); "
               "start worker processes with the 'spawn' start method (multiprocessing / "
               "torch.multiprocessing set_start_method('spawn')) or subprocess";
    }
};

py::object g_error_factory;  // set by nexar._errors: (code, message) -> exception instance

// make_error is the Python exception object for a nexar result (and -2:
// a forked child), as the exception translator below raises it.
py::object make_error(int code, const std::string& msg) {
    if (g_error_factory && !g_error_factory.is_none()) return g_error_factory(code, msg);
    return py::reinterpret_steal<py::object>(PyObject_CallFunction(PyExc_RuntimeError, "s", msg.c_str()));
}

void check_fork() {
    if (g_forked.load()) throw ForkError();
}

// check turns a result into an exception. It must run on the thread that made
// the call: nexar_last_error is thread-local.
inline void check(nexar_result_t rc) {
    if (rc != NEXAR_SUCCESS) {
        const char* detail = nexar_last_error();
        std::string msg = (detail && *detail) ? detail : nexar_result_string(rc);
        throw NexarError(static_cast<int>(rc), msg);
    }
}

// Blocking calls: release the GIL around the C call, fetch the error detail
// on the same OS thread before reacquiring.
#define NX_CALL(expr)                          \
    do {                                       \
        check_fork();                          \
        nexar_result_t rc_;                    \
        {                                      \
            py::gil_scoped_release release_;   \
            rc_ = (expr);                      \
        }                                      \
        check(rc_);                            \
    } while (0)

using addr_t = std::uintptr_t;
using handle_t = std::uintptr_t;

inline nexar_comm_t C(handle_t h) { return reinterpret_cast<nexar_comm_t>(h); }
inline nexar_request_t R(handle_t h) { return reinterpret_cast<nexar_request_t>(h); }
inline void* P(addr_t a) { return reinterpret_cast<void*>(a); }
inline nexar_datatype_t D(int dt) { return static_cast<nexar_datatype_t>(dt); }
inline nexar_op_t O(int op) { return static_cast<nexar_op_t>(op); }

py::tuple status_tuple(const nexar_status_t& st) {
    return py::make_tuple(st.source, st.tag, st.count, st.bytes);
}

// View is a buffer export held for the length of one call, for the fast
// paths below. get fails (false, no Python error set) when the object needs
// the general path in nexar/_buffers.py: no buffer protocol (torch tensors),
// not writable where it must be, not C-contiguous, or an element type that
// path would map differently (it then also produces the error messages).
struct View {
    Py_buffer v{};
    bool held = false;
    nexar_datatype_t dt = NEXAR_UINT8;

    bool get(py::handle o, bool writable) {
        if (!PyObject_CheckBuffer(o.ptr())) return false;
        if (PyObject_GetBuffer(o.ptr(), &v, writable ? PyBUF_RECORDS : PyBUF_RECORDS_RO) != 0) {
            PyErr_Clear();
            return false;
        }
        held = true;
        return PyBuffer_IsContiguous(&v, 'C') && datatype();
    }
    size_t count() const { return static_cast<size_t>(v.len / v.itemsize); }
    ~View() {
        if (held) PyBuffer_Release(&v);
    }

   private:
    // The struct-module formats numpy and the standard library export for
    // native little-endian integers and floats; everything else (bfloat16,
    // bool, big-endian, int16, ...) takes the general path.
    bool datatype() {
        const char* f = v.format ? v.format : "B";
        if (*f == '@' || *f == '=' || *f == '<') ++f;
        if (f[0] == 0 || f[1] != 0) return false;
        const Py_ssize_t n = v.itemsize;
        switch (f[0]) {
            case 'b': return n == 1 && set(NEXAR_INT8);
            case 'B': return n == 1 && set(NEXAR_UINT8);
            case 'i': case 'l': case 'q':
                return (n == 4 && set(NEXAR_INT32)) || (n == 8 && set(NEXAR_INT64));
            case 'I': case 'L': case 'Q':
                return (n == 4 && set(NEXAR_UINT32)) || (n == 8 && set(NEXAR_UINT64));
            case 'e': return n == 2 && set(NEXAR_FLOAT16);
            case 'f': return n == 4 && set(NEXAR_FLOAT32);
            case 'd': return n == 8 && set(NEXAR_FLOAT64);
            default: return false;
        }
    }
    bool set(nexar_datatype_t d) {
        dt = d;
        return true;
    }
};

// FailureHandler holds a Python callable registered with
// nexar_comm_set_failure_handler; a capsule owns it, and the Python Comm
// keeps the capsule until nexar_comm_destroy has returned (after which the
// library never calls it).
struct FailureHandler {
    py::object fn;
};

bool interpreter_gone() {
#if PY_VERSION_HEX >= 0x030D0000
    return !Py_IsInitialized() || Py_IsFinalizing();
#else
    return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// call_failure runs on a library thread: it takes the GIL for the call. An
// exception the callable raises goes to sys.unraisablehook. Nothing is
// called once the interpreter is shutting down (a thread that takes the GIL
// then would be ended, and this one belongs to the Go runtime).
void call_failure(nexar_comm_t, int rank, nexar_result_t code, const char* message, void* user) {
    if (interpreter_gone()) return;
    py::gil_scoped_acquire gil;
    try {
        static_cast<FailureHandler*>(user)->fn(rank, static_cast<int>(code), std::string(message));
    } catch (py::error_already_set& e) {
        e.discard_as_unraisable("nexar failure handler");
    } catch (...) {
    }
}

// LibraryGIL takes the GIL on a library thread for an RPC handler. The
// first time on a thread it makes the thread's Python thread state and keeps
// it (one extra PyGILState count, never released): creating and deleting
// one per call, as a plain gil_scoped_acquire on a thread without one does,
// costs microseconds on every call. The state is the PyGILState one, so
// nested PyGILState_Ensure (pybind11, other extensions) finds it.
class LibraryGIL {
public:
    LibraryGIL() {
        thread_local bool kept = false;
        if (!kept) {
            (void)PyGILState_Ensure();
            PyEval_SaveThread();
            kept = true;
        }
        st_ = PyGILState_Ensure();
    }
    ~LibraryGIL() { PyGILState_Release(st_); }
    LibraryGIL(const LibraryGIL&) = delete;
    LibraryGIL& operator=(const LibraryGIL&) = delete;

private:
    PyGILState_STATE st_;
};

// RPCHandler holds a Python callable served under a function id
// (nexar_rpc_register); a capsule owns it, kept by the Python Comm until
// nexar_comm_destroy has returned (which waits for running handlers).
struct RPCHandler {
    py::object fn;
};

// RPCCall holds what a nexar_rpc_icall needs until its request completes:
// the request bytes and the reply's out-parameters. A capsule owns it, kept
// by the Python RPCFuture (in its Comm's pending set until it completes or
// the Comm is closed), so the library never writes to freed memory: it
// writes the reply only inside nexar_wait/nexar_test on that request.
struct RPCCall {
    std::string req;
    void* reply = nullptr;
    size_t len = 0;
    ~RPCCall() { nexar_free(reply); }
};

// ReplyInto is where nexar_rpc_call_into puts a reply: a caller's buffer
// (dst, cap), else a new bytes object that the library fills without the
// GIL (one copy, no intermediate malloc).
struct ReplyInto {
    void* dst = nullptr;
    size_t cap = 0;
    py::object bytes;
    bool no_memory = false;
    std::string detail;
};

void* reply_into_out(size_t len, void* user) {
    auto* r = static_cast<ReplyInto*>(user);
    return len <= r->cap ? r->dst : nullptr;
}

// reply_into_bytes runs on the calling thread, which released the GIL:
// it takes it back only to make the bytes object.
void* reply_into_bytes(size_t len, void* user) {
    auto* r = static_cast<ReplyInto*>(user);
    py::gil_scoped_acquire gil;
    PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(len));
    if (b == nullptr) {
        PyErr_Clear();
        r->no_memory = true;
        return nullptr;
    }
    r->bytes = py::reinterpret_steal<py::object>(b);
    return PyBytes_AS_STRING(b);
}

char* c_message(const std::string& s) {
    char* m = static_cast<char*>(std::malloc(s.size() + 1));
    if (m != nullptr) std::memcpy(m, s.c_str(), s.size() + 1);
    return m;
}

// release_reply releases the bytes object a handler's reply was sent from
// (on a library thread: it takes the GIL).
void release_reply(void* owner) {
    if (interpreter_gone()) return;  // leaked: nothing may run Python now
    LibraryGIL gil;
    Py_DECREF(static_cast<PyObject*>(owner));
}

// reply_lend_min is the smallest reply lent to the library as the bytes
// object itself: below it a copy costs less than taking the GIL again to
// release the object once the reply is sent.
constexpr Py_ssize_t reply_lend_min = 64 << 10;

// call_rpc runs on a library thread (a nexar_rpc_lent_handler_t): it takes
// the GIL and calls fn(from, request: bytes); the result's bytes are the
// reply, sent straight from the bytes object when large. An exception
// fails the call with its type name and message (and its nexar code when
// it is a nexar.Error, else NEXAR_ERR_INTERNAL).
nexar_result_t call_rpc(nexar_comm_t, int from, uint32_t, const void* req, size_t req_len,
                        nexar_rpc_reply_t* reply, void* user) {
    if (interpreter_gone()) return NEXAR_ERR_CLOSED;
    LibraryGIL gil;
    try {
        py::object out = static_cast<RPCHandler*>(user)->fn(
            from, py::bytes(static_cast<const char*>(req), req_len));
        if (out.is_none()) return NEXAR_SUCCESS;
        // bytes as they are, anything else through bytes().
        py::bytes b = PyBytes_Check(out.ptr()) ? py::reinterpret_borrow<py::bytes>(out) : py::bytes(out);
        char* data = nullptr;
        Py_ssize_t n = 0;
        if (PyBytes_AsStringAndSize(b.ptr(), &data, &n) != 0) throw py::error_already_set();
        if (n == 0) return NEXAR_SUCCESS;
        if (n >= reply_lend_min) {
            // Lent: bytes are immutable and the reference keeps them.
            reply->data = data;
            reply->len = static_cast<size_t>(n);
            reply->release = release_reply;
            reply->owner = b.release().ptr();
            return NEXAR_SUCCESS;
        }
        void* m = std::malloc(static_cast<size_t>(n));
        if (m == nullptr) return NEXAR_ERR_INTERNAL;
        std::memcpy(m, data, static_cast<size_t>(n));
        reply->data = m;
        reply->len = static_cast<size_t>(n);
        reply->release = std::free;
        reply->owner = m;
        return NEXAR_SUCCESS;
    } catch (py::error_already_set& e) {
        int code = NEXAR_ERR_INTERNAL;
        if (py::hasattr(e.value(), "code")) {
            try {
                int c = e.value().attr("code").cast<int>();
                if (c > 0 && c < NEXAR_ERR_FORKED) code = c;
            } catch (...) {
            }
        }
        std::string type = py::str(e.type().attr("__name__"));
        std::string msg = py::str(e.value());
        char* m = c_message(type + ": " + msg);
        reply->data = m;
        reply->release = std::free;
        reply->owner = m;
        return static_cast<nexar_result_t>(code);
    } catch (std::exception& e) {
        char* m = c_message(e.what());
        reply->data = m;
        reply->release = std::free;
        reply->owner = m;
        return NEXAR_ERR_INTERNAL;
    }
}

// ---- torch tensors, without libtorch ------------------------------------
// The torch backend's synchronous and started collectives of one plain
// tensor are decided and made here in one call: reading a tensor's and an
// options object's attributes from Python costs several microseconds per
// call, from C a fraction of one. Only the Python C API is used (no
// libtorch: one build serves every torch version); the dtype objects, the
// reduce ops and torch.strided come from nexar.torch once
// (torch_kinds_set). Anything this code does not recognise (a CUDA or
// sparse tensor, a view that is not contiguous, a conjugate or negative
// bit, an element type or op that needs staging, an attribute missing in
// this torch) is left to the group's general method (torch_run answers
// 0), which also produces the error messages.
struct TorchKinds {
    std::vector<std::pair<py::object, nexar_datatype_t>> dtypes;  // torch.dtype -> nexar dtype
    int ops[16];                                                    // RedOpType value -> nexar op, -1: not taken
    py::object strided;
    py::object sum;  // ReduceOp.SUM (a RedOpType), which a ReduceOp compares equal to
    // interned attribute names
    py::object is_cpu, layout, dtype, is_contiguous, is_conj, is_neg, data_ptr, numel, element_size,
        reduce_op, op, async_op, root_rank;
};
TorchKinds* g_torch = nullptr;  // made once, under the GIL; never freed (module lifetime)

bool float_dtype(nexar_datatype_t d) {
    return d == NEXAR_FLOAT16 || d == NEXAR_BFLOAT16 || d == NEXAR_FLOAT32 || d == NEXAR_FLOAT64;
}

// PlainTensor is one dense, contiguous CPU tensor's memory: get answers
// false (no Python error set) for anything else.
struct PlainTensor {
    void* addr = nullptr;
    size_t count = 0;       // elements
    int dt = -1;            // nexar dtype, -1: not one libnexar reduces as it is
    size_t elem = 0;        // element size, when asked for

    // reduced: for a reduction, whose element type must be one libnexar
    // reduces as it is (real types only: no conjugate bit to look at);
    // otherwise any element type, and its size is read.
    bool get(py::handle t, bool reduced) {
        const TorchKinds& k = *g_torch;
        if (!attr_true(t, k.is_cpu)) return false;
        PyObject* d = PyObject_GetAttr(t.ptr(), k.dtype.ptr());
        if (d == nullptr) return clear();
        for (const auto& e : k.dtypes)
            if (e.first.ptr() == d) dt = e.second;
        Py_DECREF(d);
        if (reduced && dt < 0) return false;
        PyObject* lay = PyObject_GetAttr(t.ptr(), k.layout.ptr());
        if (lay == nullptr) return clear();
        bool strided = lay == k.strided.ptr();
        Py_DECREF(lay);
        if (!strided || !flag(t, k.is_contiguous, true) || (!reduced && !flag(t, k.is_conj, false)) ||
            !flag(t, k.is_neg, false))
            return clear();
        if (!call_size(t, k.data_ptr, reinterpret_cast<size_t*>(&addr)) || !call_size(t, k.numel, &count))
            return clear();
        if (!reduced && !call_size(t, k.element_size, &elem)) return clear();
        return true;
    }

   private:
    static bool clear() {
        PyErr_Clear();
        return false;
    }
    static bool attr_true(py::handle o, const py::object& name) {
        PyObject* v = PyObject_GetAttr(o.ptr(), name.ptr());
        if (v == nullptr) return clear();
        bool yes = v == Py_True;
        Py_DECREF(v);
        return yes;
    }
    // flag: whether method name() of o answers want (false on an error).
    static bool flag(py::handle o, const py::object& name, bool want) {
        PyObject* v = PyObject_CallMethodNoArgs(o.ptr(), name.ptr());
        if (v == nullptr) return false;
        bool yes = v == (want ? Py_True : Py_False);
        Py_DECREF(v);
        return yes;
    }
    static bool call_size(py::handle o, const py::object& name, size_t* out) {
        PyObject* v = PyObject_CallMethodNoArgs(o.ptr(), name.ptr());
        if (v == nullptr) return false;
        size_t x = PyLong_AsSize_t(v);
        Py_DECREF(v);
        if (x == static_cast<size_t>(-1) && PyErr_Occurred()) return false;
        *out = x;
        return true;
    }
};

// TorchOpts is what a collective's options object says: asyncOp (true
// without opts or where this torch has no such field, as the backend
// always read it), the reduce op, the root.
struct TorchOpts {
    bool async = true;
    int op = NEXAR_SUM;
    int root = 0;

    // get answers false (no Python error set) for a reduce op libnexar
    // does not take as it is (PREMUL_SUM) or options it cannot read.
    bool get(py::handle opts, bool reduces, bool rooted) {
        if (opts.is_none()) return true;
        const TorchKinds& k = *g_torch;
        PyObject* a = PyObject_GetAttr(opts.ptr(), k.async_op.ptr());
        if (a == nullptr) {
            PyErr_Clear();  // a torch without asyncOp: asynchronous, as before
        } else {
            async = a == Py_True;
            Py_DECREF(a);
        }
        if (reduces) {
            PyObject* r = PyObject_GetAttr(opts.ptr(), k.reduce_op.ptr());
            if (r == nullptr) return clear();
            // SUM, the common case, by one comparison: reading .op makes
            // two Python objects.
            int sum = PyObject_RichCompareBool(r, k.sum.ptr(), Py_EQ);
            if (sum == 1) {
                Py_DECREF(r);
                op = NEXAR_SUM;
                return rooted ? root_of(opts) : true;
            }
            if (sum < 0) PyErr_Clear();
            PyObject* kind = PyObject_GetAttr(r, k.op.ptr());
            Py_DECREF(r);
            if (kind == nullptr) return clear();
            Py_ssize_t v = PyNumber_AsSsize_t(kind, nullptr);
            Py_DECREF(kind);
            if (v == -1 && PyErr_Occurred()) return clear();
            if (v < 0 || v >= 16 || k.ops[v] < 0) return false;
            op = k.ops[v];
        }
        return rooted ? root_of(opts) : true;
    }

   private:
    bool root_of(py::handle opts) {
        PyObject* r = PyObject_GetAttr(opts.ptr(), g_torch->root_rank.ptr());
        if (r == nullptr) return clear();
        long v = PyLong_AsLong(r);
        Py_DECREF(r);
        if (v == -1 && PyErr_Occurred()) return clear();
        if (v < INT_MIN || v > INT_MAX) return false;
        root = static_cast<int>(v);
        return true;
    }
    static bool clear() {
        PyErr_Clear();
        return false;
    }
};

size_t dtype_size(int dt) {
    switch (dt) {
        case NEXAR_INT8: case NEXAR_UINT8: return 1;
        case NEXAR_FLOAT16: case NEXAR_BFLOAT16: return 2;
        case NEXAR_INT32: case NEXAR_UINT32: case NEXAR_FLOAT32: return 4;
        default: return 8;
    }
}

// Large tensors on huge pages. torch's CPU allocator leaves a tensor on
// 4 KiB pages (numpy's arrays from 4 MiB and nexar's own buffers are on
// transparent huge pages); on those, the cross-memory copy that moves
// large payloads between ranks pins every 4 KiB page of the sender's
// buffer, and every copy and reduction over the tensor misses the TLB once
// per 4 KiB (in a VM, a two-level page walk): a 16 MiB all_reduce took
// 1.3-1.4x as long as over the same tensor on huge pages
// (docs/performance.md, "The torch path"). A buffer this process reduces
// or broadcasts a second time (a DDP bucket, a gradient, a reused tensor)
// is therefore moved onto huge pages in place, once: MADV_COLLAPSE on its
// 2 MiB-aligned interior (Linux 6.1+; contents unchanged, the kernel
// copies them into huge pages). A one-off tensor is left alone: collapsing
// costs about 0.3 ms per MiB, repaid after a few calls. Failures (an older
// kernel, pinned or shared pages, no free huge page) leave the buffer as
// it was. min_bytes 0 turns it off (NEXAR_TORCH_HUGEPAGE_MIN).
struct HugeRanges {
    struct Range {
        uintptr_t addr = 0;
        size_t len = 0;
        uint64_t used = 0;  // clock of the last use, 0: free slot
        bool collapsed = false;
    };
    std::array<Range, 32> r{};
    uint64_t clock = 0;
    size_t min_bytes = 0;

    // second_use records a use of [addr, addr+len) and reports whether it is
    // the range's second: the caller collapses it then. Under the GIL.
    bool second_use(uintptr_t addr, size_t len) {
        if (min_bytes == 0 || len < min_bytes) return false;
        ++clock;
        Range* lru = &r[0];
        for (auto& e : r) {
            if (e.used != 0 && e.addr == addr && e.len == len) {
                e.used = clock;
                if (e.collapsed) return false;
                e.collapsed = true;
                return true;
            }
            if (e.used < lru->used) lru = &e;
        }
        *lru = Range{addr, len, clock, false};
        return false;
    }
};
HugeRanges g_huge;

// collapse_huge moves the 2 MiB-aligned interior of [addr, addr+len) onto
// huge pages; called without the GIL.
void collapse_huge(uintptr_t addr, size_t len) {
#ifdef __linux__
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
    constexpr uintptr_t huge = uintptr_t(2) << 20;
    const uintptr_t lo = (addr + huge - 1) & ~(huge - 1), hi = (addr + len) & ~(huge - 1);
    if (hi > lo) (void)madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_COLLAPSE);
#else
    (void)addr;
    (void)len;
#endif
}

// huge_pages_for: the tensor memory of a call, collapsed on its second use.
void huge_pages_for(void* addr, size_t len) {
    if (g_huge.second_use(reinterpret_cast<uintptr_t>(addr), len)) {
        py::gil_scoped_release release;
        collapse_huge(reinterpret_cast<uintptr_t>(addr), len);
    }
}

// The collectives with a C fast path (TorchCall's kind).
enum TorchKind { kTorchAllreduce = 0, kTorchBroadcast = 1 };
const char* const kTorchKindNames[] = {"allreduce", "broadcast"};

// torch_run makes collective kind of one plain CPU tensor t in place with
// torch's options opts on communicator c: 0 when t or opts need the
// general path (nothing done), 1 when done (opts.asyncOp false; the GIL
// released meanwhile), 2 when started (*q: its request). A failure throws
// NexarError (ForkError in a forked child).
int torch_run(int kind, py::handle t, py::handle opts, handle_t c, nexar_request_t* q) {
    if (g_torch == nullptr) return 0;
    TorchOpts o;
    PlainTensor p;
    if (kind == kTorchAllreduce) {
        if (!o.get(opts, true, false) || !p.get(t, true)) return 0;
        const bool fl = float_dtype(static_cast<nexar_datatype_t>(p.dt));
        if ((o.op == NEXAR_AVG && !fl) || ((o.op == NEXAR_BAND || o.op == NEXAR_BOR || o.op == NEXAR_BXOR) && fl))
            return 0;
        huge_pages_for(p.addr, p.count * dtype_size(p.dt));
        if (!o.async) {
            NX_CALL(nexar_allreduce(p.addr, p.addr, p.count, D(p.dt), O(o.op), C(c)));
            return 1;
        }
        NX_CALL(nexar_iallreduce(p.addr, p.addr, p.count, D(p.dt), O(o.op), C(c), q));
        return 2;
    }
    if (!o.get(opts, false, true) || !p.get(t, false)) return 0;
    const size_t n = p.count * p.elem;
    huge_pages_for(p.addr, n);
    if (!o.async) {
        NX_CALL(nexar_broadcast(p.addr, n, NEXAR_UINT8, o.root, C(c)));
        return 1;
    }
    NX_CALL(nexar_ibroadcast(p.addr, n, NEXAR_UINT8, o.root, C(c), q));
    return 2;
}

// TorchGate says whether a group's fast calls may run in the caller's
// thread: blocked counts what forbids it (operations queued on the group's
// worker, a batch being coalesced, the group shut down). Read and changed
// under the GIL only.
struct TorchGate {
    int blocked = 0;
};

// TorchCall is a ProcessGroup's collective method implemented in C, set
// as an attribute of the group (which torch's ProcessGroup trampoline
// finds before the class's method): called as method(tensors, opts=None).
// One plain CPU tensor with the gate open is decided and made here
// (torch_run): done, it returns None (torch's collectives then skip the
// wait); started, the group's _started_work(name, tensors, handle) makes
// its Work; failed, its _failed(name, tensors, error). Anything else goes
// to the group's general method (slow). It holds the group weakly: no
// cycle through the group's own attribute. No Python frame runs on the
// fast path, so Dynamo's frame hook never sees one. Called with the GIL.
struct TorchCall {
    PyObject_HEAD
    int kind;
    handle_t comm;
    TorchGate* gate;
    PyObject* gate_obj;  // owns gate
    PyObject* group;     // weakref to the ProcessGroup
    PyObject* slow;      // name of the group's general method
};

// torch_call_group is the method's group (a new reference), or nullptr
// with a Python error set.
PyObject* torch_call_group(TorchCall* self) {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject* g = nullptr;
    if (PyWeakref_GetRef(self->group, &g) < 0) return nullptr;
#else
    PyObject* g = PyWeakref_GetObject(self->group);  // borrowed
    if (g == nullptr) return nullptr;
    if (g == Py_None) g = nullptr;
    Py_XINCREF(g);
#endif
    if (g == nullptr) PyErr_SetString(PyExc_RuntimeError, "nexar: the process group of this method is gone");
    return g;
}

PyObject* torch_call_slow(TorchCall* self, PyObject* args, PyObject* kwargs) {
    PyObject* g = torch_call_group(self);
    if (g == nullptr) return nullptr;
    PyObject* fn = PyObject_GetAttr(g, self->slow);
    Py_DECREF(g);
    if (fn == nullptr) return nullptr;
    PyObject* out = PyObject_Call(fn, args, kwargs);
    Py_DECREF(fn);
    return out;
}

// torch_call_abandon: a started operation whose Work could not be made
// (a Python error is set). Nothing will hold the tensor once the caller
// returns, and libnexar writes it until the operation ends: wait for that
// here (GIL released, the communicator's timeout bounds it), then free the
// request. The Python error is kept for the caller.
void torch_call_abandon(nexar_request_t q) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    Py_BEGIN_ALLOW_THREADS
    (void)nexar_wait(q);
    (void)nexar_request_free(q);
    Py_END_ALLOW_THREADS
    PyErr_Restore(type, value, tb);
}

PyObject* torch_call(PyObject* o, PyObject* args, PyObject* kwargs) {
    auto* self = reinterpret_cast<TorchCall*>(o);
    const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if (self->gate->blocked != 0 || (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0) || nargs < 1 ||
        nargs > 2)
        return torch_call_slow(self, args, kwargs);
    PyObject* tensors = PyTuple_GET_ITEM(args, 0);
    PyObject* opts = nargs == 2 ? PyTuple_GET_ITEM(args, 1) : Py_None;
    PyObject* t = nullptr;
    if (PyList_CheckExact(tensors) && PyList_GET_SIZE(tensors) == 1)
        t = PyList_GET_ITEM(tensors, 0);
    else if (PyTuple_CheckExact(tensors) && PyTuple_GET_SIZE(tensors) == 1)
        t = PyTuple_GET_ITEM(tensors, 0);
    if (t == nullptr) return torch_call_slow(self, args, kwargs);
    nexar_request_t q = NEXAR_REQUEST_NULL;
    int r = 0;
    py::object err;
    try {
        try {
            r = torch_run(self->kind, t, opts, self->comm, &q);
        } catch (const NexarError& e) {
            err = make_error(e.code, e.msg);
        } catch (const ForkError& e) {
            err = make_error(-2, e.what());
        }
    } catch (py::error_already_set& e) {
        e.restore();
        return nullptr;
    } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    }
    if (r == 1) Py_RETURN_NONE;
    if (r == 0 && !err) return torch_call_slow(self, args, kwargs);
    PyObject* g = torch_call_group(self);
    PyObject* out = nullptr;
    if (g != nullptr) {
        const char* name = kTorchKindNames[self->kind];
        out = err ? PyObject_CallMethod(g, "_failed", "sOO", name, tensors, err.ptr())
                  : PyObject_CallMethod(g, "_started_work", "sOK", name, tensors,
                                        static_cast<unsigned long long>(reinterpret_cast<handle_t>(q)));
        Py_DECREF(g);
    }
    if (out == nullptr && r == 2) torch_call_abandon(q);
    return out;
}

void torch_call_dealloc(PyObject* o) {
    auto* self = reinterpret_cast<TorchCall*>(o);
    PyTypeObject* type = Py_TYPE(o);
    Py_XDECREF(self->gate_obj);
    Py_XDECREF(self->group);
    Py_XDECREF(self->slow);
    type->tp_free(o);
    Py_DECREF(type);  // a heap type: each instance holds its type
}

PyTypeObject* g_torch_call_type = nullptr;  // made at module import (PyType_FromSpec)

PyTypeObject* make_torch_call_type() {
    static PyType_Slot slots[] = {
        {Py_tp_dealloc, reinterpret_cast<void*>(torch_call_dealloc)},
        {Py_tp_call, reinterpret_cast<void*>(torch_call)},
        {Py_tp_doc, const_cast<char*>("A ProcessGroup collective method implemented in C (nexar.torch's fast path).")},
        {0, nullptr},
    };
    static PyType_Spec spec = {"nexar._nexar.TorchCall", sizeof(TorchCall), 0, Py_TPFLAGS_DEFAULT, slots};
    return reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&spec));
}

}  // namespace

PYBIND11_MODULE(_nexar, m) {
    m.doc() = "Low-level binding of include/nexar.h (addresses and counts). Use the nexar package.";

    pthread_atfork(nullptr, nullptr, on_fork_child);

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const NexarError& e) {
            if (g_error_factory && !g_error_factory.is_none()) {
                py::object exc = g_error_factory(e.code, e.msg);
                PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
            } else {
                PyErr_SetString(PyExc_RuntimeError, e.msg.c_str());
            }
        } catch (const ForkError& e) {
            if (g_error_factory && !g_error_factory.is_none()) {
                py::object exc = g_error_factory(-2, std::string(e.what()));
                PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
            } else {
                PyErr_SetString(PyExc_RuntimeError, e.what());
            }
        }
    });

    m.def("_set_error_factory", [](py::object f) { g_error_factory = std::move(f); });
    m.def("_forked", []() { return g_forked.load(); });
    // Release the factory before the interpreter tears down.
    py::module_::import("atexit").attr("register")(
        py::cpp_function([]() { g_error_factory = py::object(); }));

    // buffer_address returns the address of a C-contiguous buffer export.
    // The caller keeps a memoryview of the object alive, which pins it.
    m.def("buffer_address", [](py::object obj) {
        Py_buffer view;
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
        auto addr = reinterpret_cast<addr_t>(view.buf);
        PyBuffer_Release(&view);
        return addr;
    });

    // buffer_info describes an object's buffer export in one call (the
    // Python-level equivalents each cost a microsecond or more):
    // (address, nbytes, itemsize, format, c_contiguous, readonly).
    m.def("buffer_info", [](py::object obj) {
        Py_buffer view;
        if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
        auto addr = reinterpret_cast<addr_t>(view.buf);
        py::tuple t = py::make_tuple(addr, static_cast<Py_ssize_t>(view.len), static_cast<Py_ssize_t>(view.itemsize),
                                     std::string(view.format ? view.format : "B"),
                                     PyBuffer_IsContiguous(&view, 'C') != 0, view.readonly != 0);
        PyBuffer_Release(&view);
        return t;
    });

    m.attr("ANY_SOURCE") = NEXAR_ANY_SOURCE;
    m.attr("UNDEFINED") = NEXAR_UNDEFINED;
    m.attr("HEADER_VERSION") =
        py::make_tuple(NEXAR_VERSION_MAJOR, NEXAR_VERSION_MINOR, NEXAR_VERSION_PATCH);

    m.def("result_string", [](int code) {
        return std::string(nexar_result_string(static_cast<nexar_result_t>(code)));
    });
    m.def("version", []() {
        check_fork();
        int a = 0, b = 0, c = 0;
        nexar_get_version(&a, &b, &c);
        return py::make_tuple(a, b, c);
    });

    // ---- communicators -------------------------------------------------
    m.def("comm_init_from_env", []() {
        nexar_comm_t c = NEXAR_COMM_NULL;
        NX_CALL(nexar_comm_init_from_env(&c));
        return reinterpret_cast<handle_t>(c);
    });
    m.def(
        "comm_init",
        [](int rank, int world_size, std::string seed, py::bytes token, std::string bind_addr,
           std::string advertise_addr, int64_t timeout_ms, int64_t connect_timeout_ms,
           int64_t heartbeat_interval_ms, int64_t heartbeat_timeout_ms,
           int64_t max_buffered_bytes, py::dict knobs) {
            std::string tok = token;  // copied: the C call copies it again
            nexar_config_t cfg = NEXAR_CONFIG_INIT;
            // knobs: nexar_config_t's appended fields by name (nexar.Comm's
            // keyword arguments); the strings live in `held` until the call.
            std::deque<std::string> held;
            const std::pair<const char*, const char**> strs[] = {
                {"topology", &cfg.topology},           {"schedules", &cfg.schedules},
                {"bulk", &cfg.bulk},                   {"memory_profile", &cfg.memory_profile},
                {"failure_policy", &cfg.failure_policy}, {"join_addr", &cfg.join_addr},
                {"cuda_runtime", &cfg.cuda_runtime},   {"nccl_library", &cfg.nccl_library},
                {"ibverbs_library", &cfg.ibverbs_library}, {"rdma_device", &cfg.rdma_device},
            };
            const std::pair<const char*, int*> ints[] = {
                {"bulk_plaintext", &cfg.bulk_plaintext}, {"bulk_conns", &cfg.bulk_conns},
                {"min_world_size", &cfg.min_world_size}, {"max_world_size", &cfg.max_world_size},
            };
            for (auto item : knobs) {
                std::string key = py::str(item.first);
                bool found = false;
                for (const auto& f : strs) {
                    if (key == f.first) {
                        held.push_back(py::str(item.second));
                        *f.second = held.back().c_str();
                        found = true;
                    }
                }
                for (const auto& f : ints) {
                    if (key == f.first) {
                        *f.second = item.second.cast<int>();
                        found = true;
                    }
                }
                if (key == "spin_wait_us") {
                    cfg.spin_wait_us = item.second.cast<int64_t>();
                    found = true;
                }
                if (!found) {
                    throw py::value_error("nexar: comm_init: " + key + " is not a field of nexar_config_t");
                }
            }
            cfg.rank = rank;
            cfg.world_size = world_size;
            cfg.seed_addr = seed.empty() ? nullptr : seed.c_str();
            cfg.token = tok.empty() ? nullptr : tok.data();
            cfg.token_len = tok.size();
            cfg.bind_addr = bind_addr.empty() ? nullptr : bind_addr.c_str();
            cfg.advertise_addr = advertise_addr.empty() ? nullptr : advertise_addr.c_str();
            cfg.timeout_ms = timeout_ms;
            cfg.connect_timeout_ms = connect_timeout_ms;
            cfg.heartbeat_interval_ms = heartbeat_interval_ms;
            cfg.heartbeat_timeout_ms = heartbeat_timeout_ms;
            cfg.max_buffered_bytes = max_buffered_bytes;
            nexar_comm_t c = NEXAR_COMM_NULL;
            NX_CALL(nexar_comm_init(&cfg, &c));
            return reinterpret_cast<handle_t>(c);
        },
        py::arg("rank"), py::arg("world_size"), py::arg("seed") = "", py::arg("token") = py::bytes(),
        py::arg("bind_addr") = "", py::arg("advertise_addr") = "", py::arg("timeout_ms") = 0,
        py::arg("connect_timeout_ms") = 0, py::arg("heartbeat_interval_ms") = 0,
        py::arg("heartbeat_timeout_ms") = 0, py::arg("max_buffered_bytes") = 0,
        py::arg("knobs") = py::dict());
    m.def("comm_destroy", [](handle_t c) { NX_CALL(nexar_comm_destroy(C(c))); });

    // ---- seeds ---------------------------------------------------------
    m.def(
        "seed_start",
        [](std::string bind_addr, int world_size, py::bytes token) {
            std::string tok = token;
            nexar_seed_t s = nullptr;
            char addr[128] = {0};
            NX_CALL(nexar_seed_start(bind_addr.c_str(), world_size, tok.data(), tok.size(), &s,
                                     addr, sizeof addr));
            return py::make_tuple(reinterpret_cast<handle_t>(s), std::string(addr));
        },
        py::arg("bind_addr"), py::arg("world_size"), py::arg("token"));
    m.def("seed_close", [](handle_t s) { NX_CALL(nexar_seed_close(reinterpret_cast<nexar_seed_t>(s))); });
    m.def("comm_abort", [](handle_t c) { NX_CALL(nexar_comm_abort(C(c))); });
    m.def("comm_rank", [](handle_t c) {
        int r = -1;
        NX_CALL(nexar_comm_rank(C(c), &r));
        return r;
    });
    m.def("comm_size", [](handle_t c) {
        int s = -1;
        NX_CALL(nexar_comm_size(C(c), &s));
        return s;
    });
    m.def("comm_split", [](handle_t c, int color, int key) {
        nexar_comm_t n = NEXAR_COMM_NULL;
        NX_CALL(nexar_comm_split(C(c), color, key, &n));
        return reinterpret_cast<handle_t>(n);
    });
    m.def("comm_get_failed", [](handle_t c) {
        size_t n = 0;
        NX_CALL(nexar_comm_get_failed(C(c), nullptr, 0, &n));
        std::vector<int> ranks(n);
        while (n > 0) {
            size_t got = 0;
            NX_CALL(nexar_comm_get_failed(C(c), ranks.data(), ranks.size(), &got));
            bool fits = got <= ranks.size();
            ranks.resize(got);
            if (fits) break;
        }
        return ranks;
    });
    // ---- recovery (nexar_comm_revoke, _agree, _shrink, failure policy) ----
    m.def("comm_set_failure_policy", [](handle_t c, int p) {
        NX_CALL(nexar_comm_set_failure_policy(C(c), static_cast<nexar_failure_policy_t>(p)));
    });
    m.def("comm_get_failure_policy", [](handle_t c) {
        nexar_failure_policy_t p = NEXAR_ON_FAILURE_ABORT;
        NX_CALL(nexar_comm_get_failure_policy(C(c), &p));
        return static_cast<int>(p);
    });
    m.def("comm_revoke", [](handle_t c) { NX_CALL(nexar_comm_revoke(C(c))); });
    m.def("comm_is_revoked", [](handle_t c) {
        int f = 0;
        NX_CALL(nexar_comm_is_revoked(C(c), &f));
        return f != 0;
    });
    // comm_agree(c, flag) -> (flag, [failed ranks]); blocks without the GIL.
    m.def("comm_agree", [](handle_t c, uint64_t flag) {
        int size = 0;
        NX_CALL(nexar_comm_size(C(c), &size));
        std::vector<int> failed(static_cast<size_t>(size > 0 ? size : 1));
        size_t n = 0;
        NX_CALL(nexar_comm_agree(C(c), &flag, failed.data(), failed.size(), &n));
        failed.resize(std::min(n, failed.size()));
        return py::make_tuple(flag, failed);
    });
    m.def("comm_shrink", [](handle_t c) {
        nexar_comm_t n = NEXAR_COMM_NULL;
        NX_CALL(nexar_comm_shrink(C(c), &n));
        return reinterpret_cast<handle_t>(n);
    });
    m.def("comm_grow", [](handle_t c) {
        nexar_comm_t n = NEXAR_COMM_NULL;
        NX_CALL(nexar_comm_grow(C(c), &n));
        return reinterpret_cast<handle_t>(n);
    });
    // comm_join(addrs, token, timeout_ms) waits, without the GIL, until the
    // members grow.
    m.def("comm_join", [](std::string addrs, py::bytes token, int64_t timeout_ms) {
        std::string tok = token;
        nexar_config_t cfg = NEXAR_CONFIG_INIT;
        cfg.seed_addr = addrs.empty() ? nullptr : addrs.c_str();
        cfg.token = tok.empty() ? nullptr : tok.data();
        cfg.token_len = tok.size();
        cfg.timeout_ms = timeout_ms;
        nexar_comm_t c = NEXAR_COMM_NULL;
        NX_CALL(nexar_comm_join(&cfg, &c));
        return reinterpret_cast<handle_t>(c);
    });
    m.def("comm_join_addrs", [](handle_t c) {
        size_t need = 0;
        nexar_result_t rc = nexar_comm_get_join_addrs(C(c), nullptr, 0, &need);
        if (rc != NEXAR_SUCCESS && rc != NEXAR_ERR_TRUNCATED) {
            check(rc);
        }
        std::string s(need, '\0');
        check(nexar_comm_get_join_addrs(C(c), s.data(), s.size(), &need));
        s.resize(need > 0 ? need - 1 : 0);
        return s;
    });
    // comm_set_failure_handler(c, fn or None) -> a capsule owning fn (None
    // when removed), to keep until the communicator is destroyed.
    m.def("comm_set_failure_handler", [](handle_t c, py::object fn) -> py::object {
        if (fn.is_none()) {
            NX_CALL(nexar_comm_set_failure_handler(C(c), nullptr, nullptr));
            return py::none();
        }
        auto* h = new FailureHandler{fn};
        py::capsule owner(h, [](void* p) { delete static_cast<FailureHandler*>(p); });
        NX_CALL(nexar_comm_set_failure_handler(C(c), call_failure, h));
        return std::move(owner);
    });
    // rpc_register(c, fn_id, callable or None) -> a capsule owning the
    // callable (None when removed), to keep until the communicator is
    // destroyed.
    m.def("rpc_register", [](handle_t c, uint32_t id, py::object fn) -> py::object {
        if (fn.is_none()) {
            NX_CALL(nexar_rpc_register_lent(C(c), id, nullptr, nullptr));
            return py::none();
        }
        auto* h = new RPCHandler{fn};
        py::capsule owner(h, [](void* p) { delete static_cast<RPCHandler*>(p); });
        NX_CALL(nexar_rpc_register_lent(C(c), id, call_rpc, h));
        return std::move(owner);
    });
    // rpc_call(c, peer, fn_id, request, timeout_ms) -> reply (timeout_ms 0:
    // the communicator's timeout only).
    m.def("rpc_call", [](handle_t c, int peer, uint32_t id, py::object req, int64_t timeout_ms, py::object out) {
        // The request is read in place: its buffer export pins it through
        // the call, which releases the GIL.
        Py_buffer in;
        if (PyObject_GetBuffer(req.ptr(), &in, PyBUF_C_CONTIGUOUS) != 0) {
            PyErr_Clear();  // no contiguous buffer: through bytes(), as before
            req = py::reinterpret_steal<py::object>(PyObject_Bytes(req.ptr()));
            if (!req || PyObject_GetBuffer(req.ptr(), &in, PyBUF_C_CONTIGUOUS) != 0) throw py::error_already_set();
        }
        ReplyInto into;
        Py_buffer ob{};
        bool have_out = !out.is_none();
        if (have_out) {
            if (PyObject_GetBuffer(out.ptr(), &ob, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
                PyBuffer_Release(&in);
                throw py::error_already_set();
            }
            into.dst = ob.buf;
            into.cap = static_cast<size_t>(ob.len);
        }
        size_t len = 0;
        nexar_result_t rc;
        check_fork();
        {
            py::gil_scoped_release release_;
            rc = nexar_rpc_call_into(C(c), peer, id, in.buf, static_cast<size_t>(in.len), timeout_ms,
                                     have_out ? reply_into_out : reply_into_bytes, &into, &len);
            if (rc != NEXAR_SUCCESS) into.detail = nexar_last_error();  // this thread's, before the GIL
        }
        PyBuffer_Release(&in);
        if (have_out) PyBuffer_Release(&ob);
        if (into.no_memory) throw std::bad_alloc();
        if (rc != NEXAR_SUCCESS) {
            std::string msg = !into.detail.empty() ? into.detail : nexar_result_string(rc);
            if (rc == NEXAR_ERR_TRUNCATED && have_out)
                msg += " (out holds " + std::to_string(into.cap) + " bytes)";
            throw NexarError(static_cast<int>(rc), msg);
        }
        if (have_out) return py::object(py::int_(len));
        if (!into.bytes) return py::object(py::bytes());
        return into.bytes;
    });
    // rpc_icall(c, peer, fn_id, request, timeout_ms) -> (request handle, a
    // capsule owning the RPCCall); rpc_reply(capsule) -> the reply, once the
    // request completed successfully.
    m.def("rpc_icall", [](handle_t c, int peer, uint32_t id, py::bytes req, int64_t timeout_ms) {
        auto* st = new RPCCall{std::string(req)};
        py::capsule owner(st, [](void* p) { delete static_cast<RPCCall*>(p); });
        nexar_request_t q = NEXAR_REQUEST_NULL;
        NX_CALL(nexar_rpc_icall(C(c), peer, id, st->req.data(), st->req.size(), timeout_ms, &st->reply,
                                &st->len, &q));
        return py::make_tuple(reinterpret_cast<handle_t>(q), std::move(owner));
    });
    m.def("rpc_reply", [](py::capsule owner) {
        auto* st = owner.get_pointer<RPCCall>();
        py::bytes out(static_cast<const char*>(st->reply), st->len);
        nexar_free(st->reply);
        st->reply = nullptr;
        st->len = 0;
        return out;
    });
    m.def("comm_get_path", [](handle_t c, int peer) {
        std::string buf(64, '\0');
        size_t n = 0;
        NX_CALL(nexar_comm_get_path(C(c), peer, &buf[0], buf.size(), &n));
        if (n >= buf.size()) {  // longer than the first guess: ask again with room
            buf.assign(n + 1, '\0');
            NX_CALL(nexar_comm_get_path(C(c), peer, &buf[0], buf.size(), &n));
        }
        buf.resize(std::min(n, buf.size() - 1));
        return buf;
    });
    m.def("comm_get_error", [](handle_t c) {
        nexar_result_t e = NEXAR_SUCCESS;
        NX_CALL(nexar_comm_get_error(C(c), &e));
        return static_cast<int>(e);
    });

    // ---- point-to-point --------------------------------------------------
    m.def("send", [](addr_t buf, size_t count, int dt, int peer, uint64_t tag, handle_t c) {
        NX_CALL(nexar_send(P(buf), count, D(dt), peer, tag, C(c)));
    });
    m.def("recv", [](addr_t buf, size_t count, int dt, int peer, uint64_t tag, handle_t c) {
        nexar_status_t st{};
        NX_CALL(nexar_recv_status(P(buf), count, D(dt), peer, tag, C(c), &st));
        return status_tuple(st);
    });

    // ---- blocking collectives ---------------------------------------------
    m.def("allreduce", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c) {
        NX_CALL(nexar_allreduce(P(s), P(r), n, D(dt), O(op), C(c)));
    });
    m.def("broadcast", [](addr_t b, size_t n, int dt, int root, handle_t c) {
        NX_CALL(nexar_broadcast(P(b), n, D(dt), root, C(c)));
    });
    m.def("reduce", [](addr_t s, addr_t r, size_t n, int dt, int op, int root, handle_t c) {
        NX_CALL(nexar_reduce(P(s), P(r), n, D(dt), O(op), root, C(c)));
    });
    m.def("allgather", [](addr_t s, addr_t r, size_t n, int dt, handle_t c) {
        NX_CALL(nexar_allgather(P(s), P(r), n, D(dt), C(c)));
    });
    m.def("allgatherv", [](addr_t s, size_t n, addr_t r, std::vector<size_t> counts,
                           std::vector<size_t> displs, int dt, handle_t c) {
        NX_CALL(nexar_allgatherv(P(s), n, P(r), counts.data(), displs.data(), D(dt), C(c)));
    });
    m.def("reduce_scatter", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c) {
        NX_CALL(nexar_reduce_scatter(P(s), P(r), n, D(dt), O(op), C(c)));
    });
    m.def("alltoall", [](addr_t s, addr_t r, size_t n, int dt, handle_t c) {
        NX_CALL(nexar_alltoall(P(s), P(r), n, D(dt), C(c)));
    });
    m.def("alltoallv", [](addr_t s, std::vector<size_t> sc, std::vector<size_t> sd, addr_t r,
                          std::vector<size_t> rc, std::vector<size_t> rd, int dt, handle_t c) {
        NX_CALL(nexar_alltoallv(P(s), sc.data(), sd.data(), P(r), rc.data(), rd.data(), D(dt),
                                C(c)));
    });
    m.def("gather", [](addr_t s, addr_t r, size_t n, int dt, int root, handle_t c) {
        NX_CALL(nexar_gather(P(s), P(r), n, D(dt), root, C(c)));
    });
    m.def("gatherv", [](addr_t s, size_t n, addr_t r, std::vector<size_t> counts,
                        std::vector<size_t> displs, int dt, int root, handle_t c) {
        NX_CALL(nexar_gatherv(P(s), n, P(r), counts.empty() ? nullptr : counts.data(),
                              displs.empty() ? nullptr : displs.data(), D(dt), root, C(c)));
    });
    m.def("scatter", [](addr_t s, addr_t r, size_t n, int dt, int root, handle_t c) {
        NX_CALL(nexar_scatter(P(s), P(r), n, D(dt), root, C(c)));
    });
    m.def("scatterv", [](addr_t s, std::vector<size_t> counts, std::vector<size_t> displs,
                         addr_t r, size_t n, int dt, int root, handle_t c) {
        NX_CALL(nexar_scatterv(P(s), counts.empty() ? nullptr : counts.data(),
                               displs.empty() ? nullptr : displs.data(), P(r), n, D(dt), root,
                               C(c)));
    });
    m.def("scan", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c) {
        NX_CALL(nexar_scan(P(s), P(r), n, D(dt), O(op), C(c)));
    });
    m.def("exscan", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c) {
        NX_CALL(nexar_exscan(P(s), P(r), n, D(dt), O(op), C(c)));
    });
    m.def("barrier", [](handle_t c) { NX_CALL(nexar_barrier(C(c))); });

    // ---- stream-ordered variants (CUDA device memory; stream: a cudaStream_t)
    m.def("allreduce_stream", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c,
                                 addr_t st) {
        NX_CALL(nexar_allreduce_stream(P(s), P(r), n, D(dt), O(op), C(c), P(st)));
    });
    m.def("broadcast_stream", [](addr_t b, size_t n, int dt, int root, handle_t c, addr_t st) {
        NX_CALL(nexar_broadcast_stream(P(b), n, D(dt), root, C(c), P(st)));
    });
    m.def("allgather_stream", [](addr_t s, addr_t r, size_t n, int dt, handle_t c, addr_t st) {
        NX_CALL(nexar_allgather_stream(P(s), P(r), n, D(dt), C(c), P(st)));
    });
    m.def("reduce_scatter_stream", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c,
                                      addr_t st) {
        NX_CALL(nexar_reduce_scatter_stream(P(s), P(r), n, D(dt), O(op), C(c), P(st)));
    });
    m.def("send_stream", [](addr_t buf, size_t count, int dt, int peer, uint64_t tag, handle_t c,
                            addr_t st) {
        NX_CALL(nexar_send_stream(P(buf), count, D(dt), peer, tag, C(c), P(st)));
    });
    m.def("recv_stream", [](addr_t buf, size_t count, int dt, int peer, uint64_t tag, handle_t c,
                            addr_t st) {
        NX_CALL(nexar_recv_stream(P(buf), count, D(dt), peer, tag, C(c), P(st)));
    });

    // ---- fast paths ---------------------------------------------------------
    // The blocking collectives most called with small buffers, taking the
    // objects themselves: for a contiguous numpy array (or any buffer export
    // with a plain native format) the lookup in Python costs more than an
    // 8-byte allreduce. Each returns False, having done nothing, when the
    // arguments need the general path, which then checks them and raises.
    m.def("allreduce_fast", [](py::handle s, py::handle r, int op, handle_t c) {
        View vs, vr;
        if (r.is_none()) {
            if (!vs.get(s, true)) return false;
            NX_CALL(nexar_allreduce(vs.v.buf, vs.v.buf, vs.count(), vs.dt, O(op), C(c)));
            return true;
        }
        if (!vs.get(s, false) || !vr.get(r, true) || vs.dt != vr.dt || vs.v.len != vr.v.len) return false;
        NX_CALL(nexar_allreduce(vs.v.buf, vr.v.buf, vs.count(), vs.dt, O(op), C(c)));
        return true;
    });
    m.def("broadcast_fast", [](py::handle b, int root, bool is_root, handle_t c) {
        View v;
        if (!v.get(b, !is_root)) return false;
        NX_CALL(nexar_broadcast(v.v.buf, v.count(), v.dt, root, C(c)));
        return true;
    });
    // allgather: r holds size blocks of s's length. reduce_scatter: s holds
    // size blocks of r's length. alltoall: equal lengths, size blocks.
    m.def("allgather_fast", [](py::handle s, py::handle r, int size, handle_t c) {
        View vs, vr;
        if (!vs.get(s, false) || !vr.get(r, true) || vs.dt != vr.dt || vs.v.len * size != vr.v.len) return false;
        NX_CALL(nexar_allgather(vs.v.buf, vr.v.buf, vs.count(), vs.dt, C(c)));
        return true;
    });
    m.def("reduce_scatter_fast", [](py::handle s, py::handle r, int op, int size, handle_t c) {
        View vs, vr;
        if (!vs.get(s, false) || !vr.get(r, true) || vs.dt != vr.dt || vr.v.len * size != vs.v.len) return false;
        NX_CALL(nexar_reduce_scatter(vs.v.buf, vr.v.buf, vr.count(), vr.dt, O(op), C(c)));
        return true;
    });
    m.def("alltoall_fast", [](py::handle s, py::handle r, int size, handle_t c) {
        View vs, vr;
        if (!vs.get(s, false) || !vr.get(r, true) || vs.dt != vr.dt || vs.v.len != vr.v.len ||
            vs.count() % static_cast<size_t>(size) != 0)
            return false;
        NX_CALL(nexar_alltoall(vs.v.buf, vr.v.buf, vs.count() / size, vs.dt, C(c)));
        return true;
    });

    // ---- non-blocking ------------------------------------------------------
    // Starting calls do not block for long, but they may take the runtime's
    // locks, so they release the GIL too.
#define NX_START(expr)                         \
    nexar_request_t q = NEXAR_REQUEST_NULL;    \
    NX_CALL(expr);                             \
    return reinterpret_cast<handle_t>(q)

    m.def("isend", [](addr_t b, size_t n, int dt, int peer, uint64_t tag, handle_t c) {
        NX_START(nexar_isend(P(b), n, D(dt), peer, tag, C(c), &q));
    });
    m.def("irecv", [](addr_t b, size_t n, int dt, int peer, uint64_t tag, handle_t c) {
        NX_START(nexar_irecv(P(b), n, D(dt), peer, tag, C(c), &q));
    });
    m.def("iallreduce", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c) {
        NX_START(nexar_iallreduce(P(s), P(r), n, D(dt), O(op), C(c), &q));
    });
    m.def("ibroadcast", [](addr_t b, size_t n, int dt, int root, handle_t c) {
        NX_START(nexar_ibroadcast(P(b), n, D(dt), root, C(c), &q));
    });
    m.def("ireduce", [](addr_t s, addr_t r, size_t n, int dt, int op, int root, handle_t c) {
        NX_START(nexar_ireduce(P(s), P(r), n, D(dt), O(op), root, C(c), &q));
    });
    m.def("iallgather", [](addr_t s, addr_t r, size_t n, int dt, handle_t c) {
        NX_START(nexar_iallgather(P(s), P(r), n, D(dt), C(c), &q));
    });
    m.def("ireduce_scatter", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c) {
        NX_START(nexar_ireduce_scatter(P(s), P(r), n, D(dt), O(op), C(c), &q));
    });
    m.def("ialltoall", [](addr_t s, addr_t r, size_t n, int dt, handle_t c) {
        NX_START(nexar_ialltoall(P(s), P(r), n, D(dt), C(c), &q));
    });
    m.def("ibarrier", [](handle_t c) { NX_START(nexar_ibarrier(C(c), &q)); });
    // The rest of the non-blocking collectives; libnexar copies the counts
    // and displacements, so the vectors may go when the call returns.
    m.def("igather", [](addr_t s, addr_t r, size_t n, int dt, int root, handle_t c) {
        NX_START(nexar_igather(P(s), P(r), n, D(dt), root, C(c), &q));
    });
    m.def("iscatter", [](addr_t s, addr_t r, size_t n, int dt, int root, handle_t c) {
        NX_START(nexar_iscatter(P(s), P(r), n, D(dt), root, C(c), &q));
    });
    m.def("iscan", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c) {
        NX_START(nexar_iscan(P(s), P(r), n, D(dt), O(op), C(c), &q));
    });
    m.def("iexscan", [](addr_t s, addr_t r, size_t n, int dt, int op, handle_t c) {
        NX_START(nexar_iexscan(P(s), P(r), n, D(dt), O(op), C(c), &q));
    });
    m.def("iallgatherv", [](addr_t s, size_t n, addr_t r, std::vector<size_t> counts,
                            std::vector<size_t> displs, int dt, handle_t c) {
        NX_START(nexar_iallgatherv(P(s), n, P(r), counts.data(), displs.data(), D(dt), C(c), &q));
    });
    m.def("igatherv", [](addr_t s, size_t n, addr_t r, std::vector<size_t> counts,
                         std::vector<size_t> displs, int dt, int root, handle_t c) {
        NX_START(nexar_igatherv(P(s), n, P(r), counts.data(), displs.data(), D(dt), root, C(c), &q));
    });
    m.def("iscatterv", [](addr_t s, std::vector<size_t> counts, std::vector<size_t> displs, addr_t r,
                          size_t n, int dt, int root, handle_t c) {
        NX_START(nexar_iscatterv(P(s), counts.data(), displs.data(), P(r), n, D(dt), root, C(c), &q));
    });
    m.def("ialltoallv", [](addr_t s, std::vector<size_t> sc, std::vector<size_t> sd, addr_t r,
                           std::vector<size_t> rc, std::vector<size_t> rd, int dt, handle_t c) {
        NX_START(nexar_ialltoallv(P(s), sc.data(), sd.data(), P(r), rc.data(), rd.data(), D(dt),
                                  C(c), &q));
    });

    // ---- bucketed and compressed allreduce (in place) -----------------------
    m.def("allreduce_multi", [](std::vector<addr_t> bufs, std::vector<size_t> counts, int dt,
                                int op, size_t bucket, handle_t c) {
        if (bufs.size() != counts.size()) throw std::invalid_argument("allreduce_multi: bufs and counts differ in length");
        std::vector<void*> p(bufs.size());
        for (size_t i = 0; i < bufs.size(); i++) p[i] = P(bufs[i]);
        NX_CALL(nexar_allreduce_multi(nullptr, p.data(), counts.data(), p.size(), D(dt), O(op),
                                      bucket, C(c)));
    });
    m.def("iallreduce_multi", [](std::vector<addr_t> bufs, std::vector<size_t> counts, int dt,
                                 int op, size_t bucket, handle_t c) {
        if (bufs.size() != counts.size()) throw std::invalid_argument("iallreduce_multi: bufs and counts differ in length");
        std::vector<void*> p(bufs.size());
        for (size_t i = 0; i < bufs.size(); i++) p[i] = P(bufs[i]);
        NX_START(nexar_iallreduce_multi(nullptr, p.data(), counts.data(), p.size(), D(dt), O(op),
                                        bucket, C(c), &q));
    });
    m.def("allreduce_compressed", [](addr_t buf, addr_t residual, size_t n, int dt, int method,
                                     double ratio, uint64_t seed, handle_t c) {
        NX_CALL(nexar_allreduce_compressed(P(buf), P(residual), n, D(dt),
                                           static_cast<nexar_compress_t>(method), ratio, seed, C(c)));
    });
#undef NX_START

    // ---- torch tensors (nexar.torch's fast paths; see TorchKinds) ------------
    // torch_kinds_set(dtypes: {torch.dtype: nexar dtype}, ops: {RedOpType
    // value: nexar op}, strided: torch.strided, sum: ReduceOp.SUM,
    // hugepage_min: HugeRanges' smallest buffer, 0: off), once, before the
    // calls below.
    m.def("torch_kinds_set", [](py::dict dtypes, py::dict ops, py::object strided, py::object sum,
                                size_t hugepage_min) {
        auto* k = new TorchKinds();
        for (auto item : dtypes)
            k->dtypes.emplace_back(py::reinterpret_borrow<py::object>(item.first),
                                   static_cast<nexar_datatype_t>(item.second.cast<int>()));
        for (int& o : k->ops) o = -1;
        for (auto item : ops) {
            int v = item.first.cast<int>();
            if (v < 0 || v >= 16) throw std::invalid_argument("torch_kinds_set: reduce op value out of range");
            k->ops[v] = item.second.cast<int>();
        }
        k->strided = std::move(strided);
        k->sum = std::move(sum);
        for (auto [field, name] : {std::pair{&k->is_cpu, "is_cpu"}, {&k->layout, "layout"}, {&k->dtype, "dtype"},
                                   {&k->is_contiguous, "is_contiguous"}, {&k->is_conj, "is_conj"},
                                   {&k->is_neg, "is_neg"}, {&k->data_ptr, "data_ptr"}, {&k->numel, "numel"},
                                   {&k->element_size, "element_size"}, {&k->reduce_op, "reduceOp"}, {&k->op, "op"},
                                   {&k->async_op, "asyncOp"}, {&k->root_rank, "rootRank"}})
            *field = py::reinterpret_steal<py::object>(PyUnicode_InternFromString(name));
        g_huge.min_bytes = hugepage_min;
        delete g_torch;  // only ever replaced under the GIL, by a second import
        g_torch = k;
    });
    // TorchGate and torch_method(kind, comm, gate, group, slow): a
    // group's collective method in C (TorchCall); kind "allreduce" or
    // "broadcast", group the ProcessGroup (held weakly), slow the name of
    // its general method.
    py::class_<TorchGate>(m, "TorchGate")
        .def(py::init<>())
        .def_readwrite("blocked", &TorchGate::blocked);
    g_torch_call_type = make_torch_call_type();
    if (g_torch_call_type == nullptr) throw py::error_already_set();
    m.def("torch_method", [](const std::string& kind, handle_t c, py::object gate, py::object group,
                             const std::string& slow) {
        int k = -1;
        for (int i = 0; i < 2; i++)
            if (kind == kTorchKindNames[i]) k = i;
        if (k < 0) throw std::invalid_argument("torch_method: kind must be allreduce or broadcast, not " + kind);
        TorchGate* g = gate.cast<TorchGate*>();
        PyObject* ref = PyWeakref_NewRef(group.ptr(), nullptr);
        if (ref == nullptr) throw py::error_already_set();
        auto* self = PyObject_New(TorchCall, g_torch_call_type);
        if (self == nullptr) {
            Py_DECREF(ref);
            throw py::error_already_set();
        }
        self->kind = k;
        self->comm = c;
        self->gate = g;
        self->gate_obj = gate.release().ptr();
        self->group = ref;
        self->slow = PyUnicode_InternFromString(slow.c_str());
        return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(self));
    });

    m.def("wait", [](handle_t q) { NX_CALL(nexar_wait(R(q))); });
    // wait_free: nexar_wait, then nexar_request_free whatever the wait
    // returned (one call for a waiter that is done with the request).
    m.def("wait_free", [](handle_t q) {
        check_fork();
        nexar_result_t rc;
        std::string detail;
        {
            py::gil_scoped_release release_;
            rc = nexar_wait(R(q));
            if (rc != NEXAR_SUCCESS) {
                const char* d = nexar_last_error();  // this thread's, before the free
                detail = (d && *d) ? d : nexar_result_string(rc);
            }
            (void)nexar_request_free(R(q));
        }
        if (rc != NEXAR_SUCCESS) throw NexarError(static_cast<int>(rc), detail);
    });
    m.def("testany", [](std::vector<handle_t> qs) {
        std::vector<nexar_request_t> hs;
        hs.reserve(qs.size());
        for (handle_t q : qs) hs.push_back(R(q));
        size_t index = 0;
        int done = 0;
        NX_CALL(nexar_testany(hs.size(), hs.data(), &index, &done));
        return py::make_tuple(done != 0, index);
    });
    m.def("test", [](handle_t q) {
        int done = 0;
        NX_CALL(nexar_test(R(q), &done));
        return done != 0;
    });
    m.def("request_status", [](handle_t q) {
        nexar_status_t st{};
        NX_CALL(nexar_request_status(R(q), &st));
        return status_tuple(st);
    });
    m.def("request_free", [](handle_t q) { NX_CALL(nexar_request_free(R(q))); });

    // ---- diagnostics ---------------------------------------------------
    m.def("comm_dump_flight_record", [](handle_t c, std::string path) {
        NX_CALL(nexar_comm_dump_flight_record(C(c), path.c_str()));
    });

    // ---- memory and traffic statistics ---------------------------------
    m.def("comm_get_stats", [](handle_t c) {
        nexar_stats_t s = NEXAR_STATS_INIT;
        NX_CALL(nexar_comm_get_stats(C(c), &s));
        py::dict d;
        d["bytes_buffered"] = s.bytes_buffered;
        d["scratch_bytes"] = s.scratch_bytes;
        d["ring_bytes"] = s.ring_bytes;
        d["relayed_bytes"] = s.relayed_bytes;
        d["messages_sent"] = s.messages_sent;
        d["bytes_sent"] = s.bytes_sent;
        d["bytes_received"] = s.bytes_received;
        return d;
    });
}
