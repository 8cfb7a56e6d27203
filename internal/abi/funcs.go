package abi

// The functions of the C ABI that capi/entry.c defines: each is described
// once here, and `go generate ./internal/abi` writes its prototype into
// include/nexar.h (the documentation above each stays hand-written) and its
// shim into capi/entry.c (refuse in a forked child, then call the Go
// export nxgo_*). A family (Forms) is the blocking call, its non-blocking
// form nexar_iNAME (one more parameter, the nexar_request_t* req out) and
// its stream-ordered form nexar_NAME_stream (one more, the void* stream),
// written once. abigen's test checks that every function has its Go export
// with as many parameters, and that nexar.h declares no other nexar_*
// function but the hand-written ones (HandWritten).

// Forms is the set of forms a function comes in.
type Forms uint8

const (
	// Blocking is nexar_NAME(params).
	Blocking Forms = 1 << iota
	// NonBlocking is nexar_iNAME(params, nexar_request_t* req).
	NonBlocking
	// Stream is nexar_NAME_stream(params, void* stream).
	Stream
)

// Func is one function (or family) of the C ABI.
type Func struct {
	Name   string // without the nexar_ prefix
	Params string // the C parameter list, as nexar.h declares it
	Forms  Forms  // default Blocking
	// Guard names the handle a call refused in a forked child belongs to
	// ("communicator", "request", "seed"); default: the kind of the first
	// handle passed by value, none (NULL) where there is none.
	Guard string
	// Go is the Go export's call, where it is not nxgo_NAME with the
	// parameters in order: arguments that name a parameter are converted
	// as the parameter would be, others are written as they are.
	Go string
}

// HandWritten are the nexar_* functions nexar.h declares that are defined
// in C by hand (capi/lasterror.c, capi/entry.c), not as shims.
var HandWritten = []string{"nexar_result_string", "nexar_last_error", "nexar_get_version", "nexar_free"}

// Funcs returns the shim functions, in the order entry.c defines them.
func Funcs() []Func { return append([]Func(nil), funcs...) }

var funcs = []Func{
	{Name: "comm_init_from_env", Params: "nexar_comm_t* comm"},
	{Name: "comm_init", Params: "const nexar_config_t* config, nexar_comm_t* comm"},
	{Name: "comm_destroy", Params: "nexar_comm_t comm"},
	{Name: "comm_abort", Params: "nexar_comm_t comm"},
	{Name: "comm_rank", Params: "nexar_comm_t comm, int* rank"},
	{Name: "comm_size", Params: "nexar_comm_t comm, int* size"},
	{Name: "comm_split", Params: "nexar_comm_t comm, int color, int key, nexar_comm_t* newcomm"},
	{Name: "seed_start", Params: "const char* bind_addr, int world_size, const void* token, size_t token_len, nexar_seed_t* seed, char* addr, size_t addr_len"},
	{Name: "seed_close", Params: "nexar_seed_t seed"},
	{Name: "comm_get_error", Params: "nexar_comm_t comm, nexar_result_t* error"},
	{Name: "comm_get_path", Params: "nexar_comm_t comm, int peer, char* buf, size_t size, size_t* len"},
	{Name: "comm_get_failed", Params: "nexar_comm_t comm, int* ranks, size_t capacity, size_t* count"},
	{Name: "comm_set_failure_handler", Params: "nexar_comm_t comm, nexar_failure_fn fn, void* user"},
	{Name: "comm_set_failure_policy", Params: "nexar_comm_t comm, nexar_failure_policy_t policy"},
	{Name: "comm_get_failure_policy", Params: "nexar_comm_t comm, nexar_failure_policy_t* policy"},
	{Name: "comm_revoke", Params: "nexar_comm_t comm"},
	{Name: "comm_is_revoked", Params: "nexar_comm_t comm, int* flag"},
	{Name: "comm_agree", Params: "nexar_comm_t comm, uint64_t* flag, int* failed, size_t capacity, size_t* count"},
	{Name: "comm_shrink", Params: "nexar_comm_t comm, nexar_comm_t* newcomm"},
	{Name: "comm_grow", Params: "nexar_comm_t comm, nexar_comm_t* newcomm"},
	{Name: "comm_join", Params: "const nexar_config_t* config, nexar_comm_t* comm"},
	{Name: "comm_get_join_addrs", Params: "nexar_comm_t comm, char* buf, size_t len, size_t* needed"},
	{Name: "rpc_register", Params: "nexar_comm_t comm, uint32_t fn, nexar_rpc_handler_t handler, void* user"},
	{Name: "rpc_register_lent", Params: "nexar_comm_t comm, uint32_t fn, nexar_rpc_lent_handler_t handler, void* user"},
	{Name: "rpc_call", Params: "nexar_comm_t comm, int peer, uint32_t fn, const void* req, size_t req_len, void** reply, size_t* reply_len", Go: "nxgo_rpc_call(comm, peer, fn, req, req_len, 0, 0, reply, reply_len)"},
	{Name: "rpc_call_timeout", Params: "nexar_comm_t comm, int peer, uint32_t fn, const void* req, size_t req_len, int64_t timeout_ms, void** reply, size_t* reply_len", Go: "nxgo_rpc_call(comm, peer, fn, req, req_len, 1, timeout_ms, reply, reply_len)"},
	{Name: "rpc_call_into", Params: "nexar_comm_t comm, int peer, uint32_t fn, const void* req, size_t req_len, int64_t timeout_ms, nexar_rpc_alloc_t alloc, void* user, size_t* reply_len"},
	{Name: "rpc_icall", Params: "nexar_comm_t comm, int peer, uint32_t fn, const void* req, size_t req_len, int64_t timeout_ms, void** reply, size_t* reply_len, nexar_request_t* request"},
	{Name: "send", Params: "const void* buf, size_t count, nexar_datatype_t dt, int peer, uint64_t tag, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "recv", Params: "void* buf, size_t count, nexar_datatype_t dt, int peer, uint64_t tag, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "recv_status", Params: "void* buf, size_t count, nexar_datatype_t dt, int peer, uint64_t tag, nexar_comm_t comm, nexar_status_t* status"},
	{Name: "allreduce", Params: "const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "broadcast", Params: "void* buf, size_t count, nexar_datatype_t dt, int root, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "reduce", Params: "const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt, nexar_op_t op, int root, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "allgather", Params: "const void* sendbuf, void* recvbuf, size_t sendcount, nexar_datatype_t dt, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "allgatherv", Params: "const void* sendbuf, size_t sendcount, void* recvbuf, const size_t* recvcounts, const size_t* displs, nexar_datatype_t dt, nexar_comm_t comm", Forms: Blocking | NonBlocking},
	{Name: "reduce_scatter", Params: "const void* sendbuf, void* recvbuf, size_t recvcount, nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "alltoall", Params: "const void* sendbuf, void* recvbuf, size_t count_per_peer, nexar_datatype_t dt, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "alltoallv", Params: "const void* sendbuf, const size_t* sendcounts, const size_t* sdispls, void* recvbuf, const size_t* recvcounts, const size_t* rdispls, nexar_datatype_t dt, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "gather", Params: "const void* sendbuf, void* recvbuf, size_t sendcount, nexar_datatype_t dt, int root, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "gatherv", Params: "const void* sendbuf, size_t sendcount, void* recvbuf, const size_t* recvcounts, const size_t* displs, nexar_datatype_t dt, int root, nexar_comm_t comm", Forms: Blocking | NonBlocking},
	{Name: "scatter", Params: "const void* sendbuf, void* recvbuf, size_t recvcount, nexar_datatype_t dt, int root, nexar_comm_t comm", Forms: Blocking | NonBlocking | Stream},
	{Name: "scatterv", Params: "const void* sendbuf, const size_t* sendcounts, const size_t* displs, void* recvbuf, size_t recvcount, nexar_datatype_t dt, int root, nexar_comm_t comm", Forms: Blocking | NonBlocking},
	{Name: "scan", Params: "const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm", Forms: Blocking | NonBlocking},
	{Name: "exscan", Params: "const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm", Forms: Blocking | NonBlocking},
	{Name: "barrier", Params: "nexar_comm_t comm", Forms: Blocking | NonBlocking},
	{Name: "allreduce_multi", Params: "const void* const* sendbufs, void* const* recvbufs, const size_t* counts, size_t nbufs, nexar_datatype_t dt, nexar_op_t op, size_t bucket_bytes, nexar_comm_t comm", Forms: Blocking | NonBlocking},
	{Name: "allreduce_compressed", Params: "void* buf, void* residual, size_t count, nexar_datatype_t dt, nexar_compress_t method, double ratio, uint64_t seed, nexar_comm_t comm"},
	{Name: "waitall", Params: "size_t count, nexar_request_t* reqs, nexar_result_t* results", Guard: "request"},
	{Name: "testany", Params: "size_t count, nexar_request_t* reqs, size_t* index, int* done", Guard: "request"},
	{Name: "wait", Params: "nexar_request_t req"},
	{Name: "test", Params: "nexar_request_t req, int* done"},
	{Name: "request_status", Params: "nexar_request_t req, nexar_status_t* status"},
	{Name: "request_free", Params: "nexar_request_t req"},
	{Name: "comm_dump_flight_record", Params: "nexar_comm_t comm, const char* path"},
	{Name: "comm_get_stats", Params: "nexar_comm_t comm, nexar_stats_t* stats"},
	{Name: "device_adapter_install", Params: "const nexar_device_adapter_t* adapter"},
}
