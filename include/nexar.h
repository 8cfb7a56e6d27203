/*
 * nexar.h - the C ABI of libnexar, a distributed communication runtime
 * (point-to-point messages and collectives between processes).
 *
 * SPDX-License-Identifier: Apache-2.0
 *
 * Conventions
 * -----------
 * - Functions are nexar_<object>_<verb>, types nexar_*_t, macros NEXAR_*.
 * - Every function except nexar_result_string, nexar_last_error and
 *   nexar_get_version returns a nexar_result_t: NEXAR_SUCCESS (0) or an
 *   error code. On error, nexar_last_error() returns a message naming the
 *   function and the argument or peer at fault.
 * - Counts are size_t and count ELEMENTS of the given datatype, never bytes.
 *   A count whose byte size overflows size_t is NEXAR_ERR_INVALID_ARGUMENT.
 *   A NULL buffer is allowed only when its count is 0.
 * - Argument order follows MPI and NCCL:
 *   (sendbuf, recvbuf, count, datatype, op, root, comm[, request]).
 * - In place: passing the same pointer as sendbuf and recvbuf means "the
 *   input is already in recvbuf" wherever that makes sense; each function
 *   says what it means for it. Other overlaps are undefined.
 * - Handles (nexar_comm_t, nexar_request_t) are opaque. Every call validates
 *   them: an unknown, NULL or destroyed handle gives NEXAR_ERR_INVALID_HANDLE,
 *   never a crash. Handle values are never reused within a process.
 * - Collectives on one communicator must be called in the same order on
 *   every member. Mismatched calls (different kind, count, datatype, op or
 *   root) fail with NEXAR_ERR_MISMATCH instead of corrupting data.
 * - fork() without exec(): in a child made that way, every function that
 *   returns a nexar_result_t (creating a communicator included) returns
 *   NEXAR_ERR_FORKED at once, without touching the parent's communicators,
 *   requests, connections or shared memory; nexar_last_error() names the
 *   function and the parent's pid. The parent is unaffected and carries on.
 *   nexar_result_string, nexar_last_error and nexar_get_version work there.
 *
 * Threads
 * -------
 * Every function may be called from any thread. Calls on different
 * communicators from different threads are fully independent. On ONE
 * communicator, point-to-point calls and request functions may be made from
 * several threads at once; collectives are memory-safe from several threads
 * too, but since their order must agree across ranks, issue the collectives
 * of one communicator from one thread at a time (or order them yourself).
 * nexar_last_error() is per thread.
 *
 * Limits of the implementation (a Go runtime inside a shared library)
 * -------------------------------------------------------------------
 * - Load exactly one copy of libnexar.so per process and never dlclose it.
 * - After fork() without exec() the library is unusable in the child (the
 *   Go runtime's threads do not survive fork; see NEXAR_ERR_FORKED): start
 *   worker processes with fork+exec or posix_spawn (Python: the "spawn"
 *   start method). A child that never calls nexar is fine.
 * - Signal handlers installed by the host program must use SA_ONSTACK.
 */
#ifndef NEXAR_H
#define NEXAR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Versions
 * --------------------------------------------------------------------- */

/* @generated version: go generate ./internal/abi */
#define NEXAR_VERSION_MAJOR 0
#define NEXAR_VERSION_MINOR 1
#define NEXAR_VERSION_PATCH 0
/* @end version */

/* NEXAR_VERSION encodes a version as one comparable integer. */
#define NEXAR_VERSION(major, minor, patch) \
    ((major) * 10000 + (minor) * 100 + (patch))

/* NEXAR_VERSION_CODE is the version of this header. */
#define NEXAR_VERSION_CODE \
    NEXAR_VERSION(NEXAR_VERSION_MAJOR, NEXAR_VERSION_MINOR, NEXAR_VERSION_PATCH)

/* ------------------------------------------------------------------------
 * Types
 * --------------------------------------------------------------------- */

/* nexar_result_t is the result of every call. Values are part of the ABI:
 * codes are only ever appended, never renumbered. */
/* @generated result: go generate ./internal/abi */
typedef enum nexar_result {
    NEXAR_SUCCESS = 0,
    NEXAR_ERR_INVALID_ARGUMENT = 1, /* bad pointer, count, datatype, op, root, peer, config */
    NEXAR_ERR_INVALID_HANDLE = 2,   /* unknown, NULL or destroyed comm/request handle */
    NEXAR_ERR_MISMATCH = 3,         /* ranks made different collective calls */
    NEXAR_ERR_PEER_DOWN = 4,        /* a peer process died or became unreachable */
    NEXAR_ERR_TIMEOUT = 5,          /* the operation did not finish in time */
    NEXAR_ERR_ABORTED = 6,          /* the communicator was aborted */
    NEXAR_ERR_CLOSED = 7,           /* the communicator was closed */
    NEXAR_ERR_AUTH = 8,             /* authentication with the seed or a peer failed */
    NEXAR_ERR_TRUNCATED = 9,        /* a message was larger than the receive buffer */
    NEXAR_ERR_UNAVAILABLE = 10,     /* a feature or device is not available */
    NEXAR_ERR_INTERNAL = 11,        /* a bug in nexar; the message says more */
    NEXAR_ERR_FORKED = 12,          /* called in a child made by fork() without exec() */
    NEXAR_ERR_REVOKED = 13,         /* the communicator was revoked; agree and shrink still work on it */
    NEXAR_ERR_NO_QUORUM = 14        /* this side of a failure or partition lacks a quorum of the last membership */
} nexar_result_t;
/* @end result */

/* nexar_datatype_t is an element type. Values are part of the ABI. */
/* @generated datatype: go generate ./internal/abi */
typedef enum nexar_datatype {
    NEXAR_INT8 = 0,
    NEXAR_UINT8 = 1,
    NEXAR_INT32 = 2,
    NEXAR_UINT32 = 3,
    NEXAR_INT64 = 4,
    NEXAR_UINT64 = 5,
    NEXAR_FLOAT16 = 6,  /* IEEE 754 binary16 */
    NEXAR_BFLOAT16 = 7, /* bfloat16 (upper half of a float32) */
    NEXAR_FLOAT32 = 8,
    NEXAR_FLOAT64 = 9
} nexar_datatype_t;
/* @end datatype */

/* nexar_op_t is a reduction operator. Values are part of the ABI.
 * NEXAR_AVG is defined for floating types only; NEXAR_BAND, NEXAR_BOR and
 * NEXAR_BXOR for integer types only. Half types are reduced in float32 and
 * rounded to nearest even. NaN propagates through MIN and MAX. */
/* @generated op: go generate ./internal/abi */
typedef enum nexar_op {
    NEXAR_SUM = 0,
    NEXAR_PROD = 1,
    NEXAR_MIN = 2,
    NEXAR_MAX = 3,
    NEXAR_AVG = 4, /* sum divided by the number of ranks */
    NEXAR_BAND = 5,
    NEXAR_BOR = 6,
    NEXAR_BXOR = 7
} nexar_op_t;
/* @end op */

/* nexar_comm_t is a communicator: a group of ranks 0..size-1. */
typedef struct nexar_comm_s* nexar_comm_t;

/* nexar_request_t is an operation started by a non-blocking call. */
typedef struct nexar_request_s* nexar_request_t;

#define NEXAR_COMM_NULL ((nexar_comm_t)0)
#define NEXAR_REQUEST_NULL ((nexar_request_t)0)

/* NEXAR_ANY_SOURCE as the peer of a receive matches a message from any rank. */
#define NEXAR_ANY_SOURCE (-1)

/* NEXAR_UNDEFINED as the color of nexar_comm_split means "not a member". */
#define NEXAR_UNDEFINED (-1)

/* nexar_status_t describes a completed receive. */
typedef struct nexar_status {
    int source;       /* rank that sent the message */
    uint64_t tag;     /* tag of the message */
    size_t count;     /* number of ELEMENTS received (<= the posted count) */
    size_t bytes;     /* number of bytes received */
    uint64_t reserved_[4];
} nexar_status_t;

/* nexar_config_t configures nexar_comm_init. Always initialize it with
 * NEXAR_CONFIG_INIT, then set the fields you need; struct_size lets later
 * versions append fields without breaking programs built against this one
 * (a program built against an older header passes its smaller size, and
 * the fields it lacks take the environment's values or the defaults).
 * A zero/NULL field means "unset": the NEXAR_* environment variable of the
 * same knob, read at the call, else the library default
 * (docs/reference/env.md). So an explicit field beats the environment, and
 * the environment beats the default, on every entry point. A string field
 * takes the forms its variable takes; a bad one fails the call with
 * NEXAR_ERR_INVALID_ARGUMENT naming the field and the accepted forms. */
typedef struct nexar_config {
    size_t struct_size;            /* sizeof(nexar_config_t); set by NEXAR_CONFIG_INIT */
    int rank;                      /* this process's rank, or -1: assigned by the seed in join order */
    int world_size;                /* number of ranks (required, >= 1) */
    const char* seed_addr;         /* rendezvous "host:port"; rank 0 runs it embedded */
    const void* token;             /* cluster secret shared by all ranks */
    size_t token_len;              /* bytes in token */
    const char* bind_addr;         /* local UDP "host:port" to listen on (default: the IP that
                                      routes to the seed, e.g. 127.0.0.1 for a local job, a free
                                      port; "0.0.0.0:0" for every interface) */
    const char* advertise_addr;    /* address peers should dial (default: the bound IP) */
    int64_t timeout_ms;            /* deadline of each blocking operation */
    int64_t connect_timeout_ms;    /* deadline of rendezvous and mesh set-up */
    int64_t heartbeat_interval_ms; /* how often peers are probed */
    int64_t heartbeat_timeout_ms;  /* silence after which a peer is down */
    int64_t max_buffered_bytes;    /* bound on early-arrival buffering, per process */
    /* Appended: the knobs that only the environment reached before (struct_size says whether
       a program has them). */
    const char* topology;          /* NEXAR_TOPOLOGY: "full", "kregular:K", "hypercube", "ondemand:M";
                                      every rank the same */
    const char* schedules;         /* NEXAR_SCHEDULES: "fit", "rank" or a topology; every rank the same */
    const char* bulk;              /* NEXAR_BULK: "auto", "tcp", "shm", "rdma" or "off" */
    int bulk_plaintext;            /* NEXAR_BULK_PLAINTEXT: nonzero declares the network trusted (bulk TCP
                                      without TLS, RDMA under "auto"); 0: the environment, else TLS */
    int bulk_conns;                /* NEXAR_BULK_CONNS: TCP connections per peer, 1 to 16 */
    int64_t spin_wait_us;          /* NEXAR_SPIN_WAIT in microseconds; negative: never spin */
    const char* memory_profile;    /* NEXAR_MEMORY_PROFILE: "default", "training" or "inference" */
    const char* failure_policy;    /* NEXAR_ON_FAILURE: "abort", "manual" or "shrink" */
    int min_world_size;            /* NEXAR_MIN_WORLD_SIZE */
    int max_world_size;            /* NEXAR_MAX_WORLD_SIZE */
    const char* join_addr;         /* NEXAR_JOIN_ADDR: this rank's lobby, UDP "host:port" */
    const char* cuda_runtime;      /* NEXAR_CUDART: the CUDA runtime to load */
    const char* nccl_library;      /* NEXAR_NCCL: the NCCL to load */
    const char* ibverbs_library;   /* NEXAR_IBVERBS: the libibverbs to load */
    const char* rdma_device;       /* NEXAR_IB_HCA: "device" or "device:port" */
} nexar_config_t;

#define NEXAR_CONFIG_INIT                                                                   \
    { sizeof(nexar_config_t), -1, 0, NULL, NULL, 0, NULL, NULL, 0, 0, 0, 0, 0,              \
      NULL, NULL, NULL, 0, 0, 0, NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL }

/* ------------------------------------------------------------------------
 * Errors and version
 * --------------------------------------------------------------------- */

/* nexar_result_string returns a static, human-readable name for code
 * ("unknown result" for a code this library does not know).
 * Result: never NULL; must not be freed.
 * Thread-safety: safe from any thread. */
const char* nexar_result_string(nexar_result_t code);

/* nexar_last_error returns a description of the most recent failing nexar
 * call made BY THE CALLING THREAD, naming the function and the argument or
 * peer at fault, e.g. "nexar_send: buf is NULL but count is 4".
 * Successful calls leave it unchanged.
 * Result: never NULL ("" if no call has failed on this thread); owned by
 * the library and valid until the next nexar call on this thread.
 * Thread-safety: the message is thread-local. */
const char* nexar_last_error(void);

/* nexar_get_version stores the version of the loaded library (which may
 * differ from NEXAR_VERSION_* of the header you compiled against).
 * Args: major, minor, patch: out; each may be NULL to skip it.
 * Thread-safety: safe from any thread. */
void nexar_get_version(int* major, int* minor, int* patch);

/* ------------------------------------------------------------------------
 * Communicators
 * --------------------------------------------------------------------- */

/* nexar_comm_init_from_env creates the world communicator from the
 * environment of the launcher: NEXAR_RANK, NEXAR_WORLD_SIZE, NEXAR_SEED,
 * NEXAR_TOKEN (set by `nexar run`), else torchrun's RANK, WORLD_SIZE,
 * MASTER_ADDR, MASTER_PORT, else Slurm's or Open MPI's variables.
 * The environment is read when the function is called (with getenv), so
 * variables the program sets with setenv() before a call are seen, also
 * after an earlier init; don't change the environment from another thread
 * during the call.
 * Blocks until every rank has joined (rendezvous plus connection set-up).
 * Formation failures and initialising again: as nexar_comm_init.
 * Args: comm: out; receives the new handle (NEXAR_COMM_NULL on failure).
 * Result: NEXAR_SUCCESS; NEXAR_ERR_INVALID_ARGUMENT (comm NULL, missing or
 * bad variables); NEXAR_ERR_TIMEOUT; NEXAR_ERR_AUTH; NEXAR_ERR_PEER_DOWN;
 * NEXAR_ERR_FORKED (in a child made by fork() without exec()).
 * Thread-safety: safe from any thread; each call creates a new world. */
nexar_result_t nexar_comm_init_from_env(nexar_comm_t* comm);

/* nexar_comm_init creates the world communicator from an explicit
 * configuration. Blocks until every rank has joined, at most
 * connect_timeout_ms; a rank that destroys its communicator, exits or is
 * lost before the world has formed makes the call fail within seconds with
 * NEXAR_ERR_PEER_DOWN naming that rank.
 * Initialising again: a world may be destroyed and created again with the
 * same configuration (same seed address), as with destroy_process_group and
 * init_process_group. Rank 0's embedded seed serves one formation and is
 * closed as soon as the world has formed, which frees its address; a rank
 * that reaches the previous world's seed before then waits for the next
 * one, until connect_timeout_ms (then NEXAR_ERR_TIMEOUT saying so).
 * Args: config: initialized with NEXAR_CONFIG_INIT; read during the call
 *       only (strings and token are copied).
 *       comm: out; receives the new handle (NEXAR_COMM_NULL on failure).
 * Result: as nexar_comm_init_from_env; NEXAR_ERR_INVALID_ARGUMENT also for
 * a bad config (struct_size too small, world_size < 1, rank out of range).
 * Thread-safety: safe from any thread; each call creates a new world. */
nexar_result_t nexar_comm_init(const nexar_config_t* config, nexar_comm_t* comm);

/* nexar_comm_destroy releases a communicator and everything it holds.
 * It is local (no communication with other ranks). Pending operations fail
 * with NEXAR_ERR_CLOSED; requests stay valid handles until freed. If comm
 * had failed (say NEXAR_ERR_PEER_DOWN naming rank 2), the other ranks are
 * told why along with its departure, and their communicators fail with the
 * same code and rank ("... reported by rank 1, which then destroyed its
 * communicator"), not with rank 1's departure. A new
 * world may then be created with the same configuration (nexar_comm_init).
 * Destroying a handle twice gives NEXAR_ERR_INVALID_HANDLE. In a child made
 * by fork() without exec() it returns NEXAR_ERR_FORKED and releases
 * nothing: the communicator, its connections and shared memory belong to
 * the parent, which goes on using them.
 * Args: comm: the communicator.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE or NEXAR_ERR_FORKED.
 * Thread-safety: safe from any thread, but no other thread may be using
 * comm at the same time unless it is prepared to get NEXAR_ERR_CLOSED or
 * NEXAR_ERR_INVALID_HANDLE. */
nexar_result_t nexar_comm_destroy(nexar_comm_t comm);

/* nexar_comm_abort makes every pending and later operation on comm fail
 * with NEXAR_ERR_ABORTED, on this rank at once and on the other ranks as
 * soon as they notice. The handle must still be destroyed.
 * Args: comm: the communicator.
 * Result: NEXAR_SUCCESS or NEXAR_ERR_INVALID_HANDLE.
 * Thread-safety: safe from any thread, also while other threads are blocked
 * in calls on comm (that is what it is for). */
nexar_result_t nexar_comm_abort(nexar_comm_t comm);

/* nexar_comm_rank stores this process's rank in comm (0..size-1).
 * Args: comm; rank: out, non-NULL.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_rank(nexar_comm_t comm, int* rank);

/* nexar_comm_size stores the number of ranks in comm.
 * Args: comm; size: out, non-NULL.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_size(nexar_comm_t comm, int* size);

/* nexar_comm_split partitions comm: ranks passing the same color form a new
 * communicator, ordered by key (ties by their rank in comm). Collective
 * over comm. A rank passing color NEXAR_UNDEFINED (any negative color)
 * joins none and gets NEXAR_COMM_NULL.
 * Args: comm; color; key; newcomm: out, non-NULL.
 * Result: NEXAR_SUCCESS or an error of a collective.
 * Thread-safety: as for collectives. */
nexar_result_t nexar_comm_split(nexar_comm_t comm, int color, int key, nexar_comm_t* newcomm);

/* nexar_comm_get_error stores the communicator's sticky failure:
 * NEXAR_SUCCESS while healthy, else the code that broke it (for example
 * NEXAR_ERR_PEER_DOWN found by the background failure detector, or
 * reported by a rank that destroyed its communicator after it failed; a
 * rank that was stopped past the heartbeat timeout and resumed gets
 * NEXAR_ERR_PEER_DOWN saying the others declared it unreachable).
 * Args: comm; error: out, non-NULL.
 * Result: NEXAR_SUCCESS (the call itself worked), NEXAR_ERR_INVALID_HANDLE,
 * NEXAR_ERR_INVALID_ARGUMENT. Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_get_error(nexar_comm_t comm, nexar_result_t* error);

/* nexar_comm_get_path describes the path that carries this rank's data to
 * peer, as `nexar bench` prints it: e.g. "shm 8 MiB ring", "tcp x2 tls",
 * "tcp x2 plaintext", "rdma mlx5_0:1 roce v2", "quic", "relay via 3",
 * "loopback" (peer is this rank), "mem" (in-process ranks). A pair's path
 * is chosen at its first message, so it reads "quic" or the path
 * negotiated so far until then.
 * Args: comm; peer: a rank of comm; buf: out, size bytes, receives the
 * NUL-terminated description, truncated to size-1 bytes (NULL when size
 * is 0); size; len: out, non-NULL, the description's full length without
 * the NUL.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT
 * (peer out of range, len NULL, buf NULL with size > 0).
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_get_path(nexar_comm_t comm, int peer, char* buf, size_t size,
                                   size_t* len);

/* Failure notification. Besides failing pending and later calls, a
 * communicator records each member found failed (dead or unreachable, as
 * this rank's detector found or as another member reported), once per
 * member, in the order this rank learned of it; later losses are recorded
 * after the communicator has failed too. */

/* nexar_comm_get_failed stores the ranks (in comm) of the members found
 * failed so far, in the order learned: the first min(*count, capacity) of
 * them into ranks, and their number into *count.
 * Args: comm; ranks: out, capacity ints (NULL when capacity is 0);
 * capacity; count: out, non-NULL.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_get_failed(nexar_comm_t comm, int* ranks, size_t capacity, size_t* count);

/* nexar_failure_fn is a failure handler: rank is the failed member's rank
 * in comm, code its nexar_result_t (NEXAR_ERR_PEER_DOWN), message a
 * NUL-terminated description valid during the call, user the pointer given
 * at registration. It runs on a thread of the library, one call at a time
 * per communicator; it must not block for long (the next report waits) and
 * may call any nexar function, including nexar_comm_destroy on comm. */
typedef void (*nexar_failure_fn)(nexar_comm_t comm, int rank, nexar_result_t code,
                                 const char* message, void* user);

/* nexar_comm_set_failure_handler makes fn the failure handler of comm: it
 * is called for every failure not reported to an earlier handler, those
 * recorded before the registration first. fn NULL removes the handler
 * (failures recorded meanwhile are then not reported by a call, but stay in
 * nexar_comm_get_failed). After nexar_comm_destroy(comm) returns, the
 * handler is not running (unless destroy was called from the handler
 * itself) and is never called again, so user may be freed.
 * Args: comm; fn: the handler or NULL; user: passed to fn.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_set_failure_handler(nexar_comm_t comm, nexar_failure_fn fn, void* user);

/* Recovery without restart (ULFM's vocabulary; docs/fault-tolerance.md).
 * What a member's failure does to a communicator is its failure policy:
 *   NEXAR_ON_FAILURE_ABORT (the default): it fails for good; every pending
 *     and later call fails naming the lost rank; agree and shrink are
 *     refused with NEXAR_ERR_UNAVAILABLE;
 *   NEXAR_ON_FAILURE_MANUAL: calls fail the same way, and the application
 *     recovers with nexar_comm_revoke, nexar_comm_agree, nexar_comm_shrink;
 *   NEXAR_ON_FAILURE_SHRINK: the library revokes, agrees and shrinks by
 *     itself; the call that met the failure returns its error (naming the
 *     lost rank), and the handle then stands for the survivors'
 *     communicator: later calls on it (nexar_comm_rank and nexar_comm_size
 *     too) use it, waiting for the shrink to finish where it has not yet.
 *     If the shrink fails, they return its error (NEXAR_ERR_NO_QUORUM on
 *     the side of a partition that must not continue). The failure
 *     handler and nexar_comm_get_failed keep reporting the communicator
 *     the handle was made with (its ranks).
 * nexar_comm_init_from_env reads the policy from NEXAR_ON_FAILURE
 * (abort, manual or shrink). Split children take their parent's. */
typedef enum nexar_failure_policy {
    NEXAR_ON_FAILURE_ABORT = 0,
    NEXAR_ON_FAILURE_MANUAL = 1,
    NEXAR_ON_FAILURE_SHRINK = 2
} nexar_failure_policy_t;

/* nexar_comm_set_failure_policy sets comm's failure policy from now on.
 * Args: comm; policy: a nexar_failure_policy_t.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_set_failure_policy(nexar_comm_t comm, nexar_failure_policy_t policy);

/* nexar_comm_get_failure_policy stores comm's failure policy.
 * Args: comm; policy: out, non-NULL.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_get_failure_policy(nexar_comm_t comm, nexar_failure_policy_t* policy);

/* nexar_comm_revoke fails every pending and later collective and
 * point-to-point call on comm, here and, as fast as the news travels, on
 * every other member (MPIX_Comm_revoke): they return NEXAR_ERR_REVOKED,
 * unless comm had failed already (they keep that failure). Every member
 * that learns of it passes it on, so it reaches every live member even if
 * this one dies. Agree and shrink still work on a revoked communicator.
 * Local and idempotent; allowed under every policy.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_revoke(nexar_comm_t comm);

/* nexar_comm_is_revoked stores 1 in *flag if comm was revoked (here or by
 * a member), else 0.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_is_revoked(nexar_comm_t comm, int* flag);

/* nexar_comm_agree is fault-tolerant agreement among the live members of
 * comm (MPIX_Comm_agree): every member calls it, and every member that
 * returns NEXAR_SUCCESS gets the same *flag, the bitwise AND of the flags
 * of the members that took part, and the same list of members left out
 * (failed, or found failed by a participant), even when members fail
 * during the call. It works on a failed or revoked communicator. A member
 * the others left out gets NEXAR_ERR_PEER_DOWN naming itself; a side of a
 * partition holding no quorum of comm (a strict majority, or exactly half
 * including rank 0) gets NEXAR_ERR_NO_QUORUM. Bounded by the
 * communicator's timeout (NEXAR_ERR_TIMEOUT).
 * Args: comm; flag: in/out, non-NULL; failed: out, capacity ints (NULL
 * when capacity is 0): the first min(*count, capacity) ranks left out,
 * ascending; capacity; count: out, non-NULL (NULL allowed when capacity
 * is 0 and the list is not wanted).
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT,
 * NEXAR_ERR_UNAVAILABLE (policy abort), NEXAR_ERR_PEER_DOWN,
 * NEXAR_ERR_NO_QUORUM, NEXAR_ERR_TIMEOUT.
 * Thread-safety: members must call agree and shrink on comm in the same
 * order; other calls may run concurrently. */
nexar_result_t nexar_comm_agree(nexar_comm_t comm, uint64_t* flag, int* failed, size_t capacity,
                                size_t* count);

/* nexar_comm_shrink makes the survivors' communicator (MPIX_Comm_shrink):
 * it revokes comm, agrees with the live members on who failed, and stores
 * in *newcomm a communicator of the others, ranked in comm's order, on the
 * connections that exist, of the next membership generation (nothing sent
 * on comm reaches it). Every live member must call it; those whose calls
 * failed with NEXAR_ERR_REVOKED know to. comm stays to be destroyed.
 * Args: comm; newcomm: out, non-NULL (NEXAR_COMM_NULL on failure).
 * Result: NEXAR_SUCCESS, or as nexar_comm_agree.
 * Thread-safety: as nexar_comm_agree. */
nexar_result_t nexar_comm_shrink(nexar_comm_t comm, nexar_comm_t* newcomm);

/* nexar_comm_grow admits the processes waiting to join the job
 * (nexar_comm_join, or NEXAR_JOIN=1 with nexar_comm_init_from_env) and
 * stores in *newcomm a communicator of comm's live members, in comm's
 * order, followed by the joiners: at most NEXAR_MAX_WORLD_SIZE members in
 * all (default: the world's first size), the rest wait for a later grow.
 * Every rank of a world of more than one keeps a lobby where joiners wait
 * (rank 0's on the seed's address once the world has formed; the others'
 * from nexar_comm_get_join_addrs). The members agree on the failed members
 * and the joiners, the lowest live member starts the grown world's seed,
 * and everyone forms the grown world's connections and confirms it. If a
 * member or joiner fails meanwhile, every member gets an error and keeps
 * comm; failed members of comm are left out either way. With nobody
 * waiting, *newcomm is the live members' communicator on the existing
 * connections (comm is not revoked). It works on a failed or revoked
 * communicator and under every failure policy (on a failed one, not under
 * abort). comm stays to be destroyed.
 * Args: comm; newcomm: out, non-NULL (NEXAR_COMM_NULL on failure).
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT,
 * NEXAR_ERR_UNAVAILABLE (comm failed under policy abort), NEXAR_ERR_PEER_DOWN,
 * NEXAR_ERR_NO_QUORUM, NEXAR_ERR_TIMEOUT.
 * Thread-safety: members must call grow, agree and shrink on comm in the
 * same order; other calls may run concurrently. */
nexar_result_t nexar_comm_grow(nexar_comm_t comm, nexar_comm_t* newcomm);

/* nexar_comm_join makes this process a member of a running job: it waits
 * in a member's lobby until the members call nexar_comm_grow, and stores
 * its communicator in the grown world in *comm. config->seed_addr is the
 * seed's address or any member's lobby address; a comma-separated list is
 * tried in turn (a lobby that goes away sends the joiner to the next).
 * config->rank and config->world_size are ignored (the members decide);
 * config->token is the job's. The wait is bounded by config->timeout_ms
 * (default 5 minutes); a grow that fails after admitting this process sends
 * it back to wait.
 * Args: config: initialized with NEXAR_CONFIG_INIT; comm: out, non-NULL
 * (NEXAR_COMM_NULL on failure).
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_ARGUMENT, NEXAR_ERR_AUTH (wrong
 * token), NEXAR_ERR_TIMEOUT, NEXAR_ERR_FORKED.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_join(const nexar_config_t* config, nexar_comm_t* comm);

/* nexar_comm_get_join_addrs writes the lobby addresses of comm's live
 * members, comma-separated and NUL-terminated, to buf: what a process
 * started later passes as its seed address to join (nexar_comm_join).
 * Args: comm; buf: out, len bytes (NULL when len is 0); needed: out, may be
 * NULL: the bytes the list needs with its NUL.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE, NEXAR_ERR_INVALID_ARGUMENT,
 * NEXAR_ERR_TRUNCATED (buf too small: *needed says how large; buf holds "").
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_comm_get_join_addrs(nexar_comm_t comm, char* buf, size_t len, size_t* needed);

/* nexar_seed_t is a rendezvous seed started by nexar_seed_start. */
typedef struct nexar_seed_s* nexar_seed_t;

/* nexar_seed_start starts, in this process, the rendezvous seed of a job of
 * world_size ranks that hold the token, listening on bind_addr (UDP
 * "host:port"; port 0 picks a free port, with no window in which another
 * process can take it). It writes the address it listens on ("ip:port",
 * NUL-terminated) to addr, which has addr_len bytes (64 always suffice).
 * Pass that address as every rank's seed; rank 0 then joins this seed
 * instead of embedding one. A seed serves one formation; keep it until the
 * job has formed (nexar_comm_init returned on every rank), then
 * nexar_seed_close it (closing it earlier fails ranks that have not joined).
 * Args: bind_addr non-NULL; world_size >= 1; token non-NULL with
 * token_len > 0; seed: out, non-NULL; addr non-NULL, addr_len large enough.
 * Result: NEXAR_SUCCESS; NEXAR_ERR_INVALID_ARGUMENT (an argument above, or
 * an unusable bind_addr); NEXAR_ERR_INTERNAL (the address cannot be bound:
 * the message says why). On failure *seed and addr are left unchanged.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_seed_start(const char* bind_addr, int world_size, const void* token,
                                size_t token_len, nexar_seed_t* seed, char* addr, size_t addr_len);

/* nexar_seed_close stops a seed and frees its address; the handle is
 * invalid afterwards. Communicators formed through it are not affected.
 * Result: NEXAR_SUCCESS or NEXAR_ERR_INVALID_HANDLE.
 * Thread-safety: safe from any thread; closing one seed twice gives
 * NEXAR_ERR_INVALID_HANDLE. */
nexar_result_t nexar_seed_close(nexar_seed_t seed);

/* ------------------------------------------------------------------------
 * Point-to-point
 *
 * Messages are matched by (source, tag) in the order sent per (source, tag),
 * as in MPI. A send may complete before the matching receive is posted
 * (messages are buffered, with back-pressure).
 * Thread-safety: safe from several threads on one communicator.
 * --------------------------------------------------------------------- */

/* nexar_send sends count elements of buf to rank peer with the given tag.
 * Returns when buf may be reused.
 * Result: NEXAR_SUCCESS; NEXAR_ERR_INVALID_ARGUMENT (buf NULL with count >
 * 0, bad dt, peer out of range, overflow); NEXAR_ERR_INVALID_HANDLE;
 * NEXAR_ERR_PEER_DOWN, NEXAR_ERR_TIMEOUT, NEXAR_ERR_ABORTED, NEXAR_ERR_CLOSED. */
nexar_result_t nexar_send(const void* buf, size_t count, nexar_datatype_t dt, int peer,
                          uint64_t tag, nexar_comm_t comm);

/* nexar_recv receives a message from peer (or NEXAR_ANY_SOURCE) with the
 * given tag into buf, which holds up to count elements. A shorter message is
 * fine (use nexar_recv_status to learn its size); a longer one gives
 * NEXAR_ERR_TRUNCATED.
 * Result: as nexar_send, plus NEXAR_ERR_TRUNCATED. */
nexar_result_t nexar_recv(void* buf, size_t count, nexar_datatype_t dt, int peer, uint64_t tag,
                          nexar_comm_t comm);

/* nexar_recv_status is nexar_recv that also reports the source, tag and size
 * of the received message.
 * Args: as nexar_recv; status: out, may be NULL.
 * Result: as nexar_recv. */
nexar_result_t nexar_recv_status(void* buf, size_t count, nexar_datatype_t dt, int peer,
                                 uint64_t tag, nexar_comm_t comm, nexar_status_t* status);

/* ------------------------------------------------------------------------
 * RPC
 *
 * A member registers handlers under function ids; the others call them by
 * rank and get the reply (blocking, blocking with a deadline, or
 * non-blocking). Requests and replies travel on a lane of their own (a
 * shared-memory ring or TCP connection apart from the data path, else
 * QUIC): RPC and collectives never wait for each other. Any number of
 * calls may be in flight; replies are matched to their calls.
 * --------------------------------------------------------------------- */

/* nexar_rpc_handler_t serves one call of function fn from rank from:
 * req[0:req_len] is the request, valid during the call only. On success it
 * stores a reply made with malloc() in *reply (the library sends it from
 * there, without a copy, and frees it with free() once sent; NULL for an
 * empty reply) and its length in *reply_len, and returns NEXAR_SUCCESS. Any other result fails the call with that
 * code; *reply may then hold a NUL-terminated message from malloc() that
 * the caller gets (the library frees it). It runs on a library thread, up
 * to the communicator's bound of handlers at once (64), and may call any
 * nexar function except collectives on comm and nexar_comm_destroy(comm). */
typedef nexar_result_t (*nexar_rpc_handler_t)(nexar_comm_t comm, int from, uint32_t fn,
                                              const void* req, size_t req_len, void** reply,
                                              size_t* reply_len, void* user);

/* nexar_rpc_register makes handler the server of function fn on comm,
 * replacing an earlier one; handler NULL removes it. A call of a function
 * with no handler fails at the caller with NEXAR_ERR_INVALID_ARGUMENT.
 * After nexar_comm_destroy(comm) returns no handler runs, so user may be
 * freed (destroy waits for running handlers).
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_rpc_register(nexar_comm_t comm, uint32_t fn, nexar_rpc_handler_t handler,
                                  void* user);

/* nexar_rpc_reply_t is the reply of a nexar_rpc_lent_handler_t: data[0:len]
 * is sent from where it is, without a copy, and then release(owner) is
 * called exactly once (when release is not NULL), on a library thread,
 * also when the reply is not sent (the call failed, the communicator
 * closed). data must stay valid and unchanged until then. */
typedef struct nexar_rpc_reply {
    const void* data;
    size_t len;
    void (*release)(void* owner);
    void* owner;
} nexar_rpc_reply_t;

/* nexar_rpc_lent_handler_t serves one call like nexar_rpc_handler_t but
 * lends its reply instead of handing over malloc() memory: on success it
 * fills *reply (zeroed on entry: an empty reply) and returns
 * NEXAR_SUCCESS. Any other result fails the call with that code;
 * reply->data may then point to a NUL-terminated message for the caller
 * (released as above). It runs as nexar_rpc_handler_t does. */
typedef nexar_result_t (*nexar_rpc_lent_handler_t)(nexar_comm_t comm, int from, uint32_t fn,
                                                   const void* req, size_t req_len,
                                                   nexar_rpc_reply_t* reply, void* user);

/* nexar_rpc_register_lent is nexar_rpc_register for a handler that lends
 * its reply (no copy of it into or out of library memory); handler NULL
 * removes the handler of fn.
 * Result: NEXAR_SUCCESS, NEXAR_ERR_INVALID_HANDLE.
 * Thread-safety: safe from any thread. */
nexar_result_t nexar_rpc_register_lent(nexar_comm_t comm, uint32_t fn,
                                       nexar_rpc_lent_handler_t handler, void* user);

/* nexar_rpc_call calls function fn on rank peer (this rank too) with
 * req[0:req_len] and waits for the reply, which it stores in *reply
 * (allocated by the library: release it with nexar_free; NULL when empty)
 * and *reply_len.
 * Result: NEXAR_SUCCESS; the handler's error (its message in
 * nexar_last_error); NEXAR_ERR_INVALID_ARGUMENT (no handler for fn on
 * peer, peer out of range, req NULL with req_len > 0, reply or reply_len
 * NULL); NEXAR_ERR_PEER_DOWN; NEXAR_ERR_TIMEOUT (the communicator's
 * timeout); NEXAR_ERR_INVALID_HANDLE; the communicator's failure.
 * Thread-safety: safe from several threads on one communicator. */
nexar_result_t nexar_rpc_call(nexar_comm_t comm, int peer, uint32_t fn, const void* req,
                              size_t req_len, void** reply, size_t* reply_len);

/* nexar_rpc_call_timeout is nexar_rpc_call with a deadline of its own:
 * timeout_ms > 0 milliseconds from the call (the communicator's timeout
 * still bounds it: the shorter wins), 0 for the communicator's timeout
 * alone. At the deadline the call fails with NEXAR_ERR_TIMEOUT naming peer
 * and fn; a reply that comes later is dropped.
 * Result: as nexar_rpc_call; NEXAR_ERR_INVALID_ARGUMENT also for a
 * negative timeout_ms.
 * Thread-safety: as nexar_rpc_call. */
nexar_result_t nexar_rpc_call_timeout(nexar_comm_t comm, int peer, uint32_t fn, const void* req,
                                      size_t req_len, int64_t timeout_ms, void** reply,
                                      size_t* reply_len);

/* nexar_rpc_alloc_t returns where a reply of len (> 0) bytes goes: at
 * least len writable bytes, or NULL to refuse the reply. */
typedef void* (*nexar_rpc_alloc_t)(size_t len, void* user);

/* nexar_rpc_call_into is nexar_rpc_call_timeout that puts the reply where
 * the caller says instead of in library memory: once the reply has come,
 * it calls alloc(len, user) once, on the calling thread before it returns,
 * and copies the reply to the buffer alloc returns (alloc is not called
 * for an empty reply nor when the call fails). The reply takes one copy,
 * from a buffer the library reuses, and no allocation of the library's; a
 * caller with a buffer of its own returns it from alloc when len fits.
 * *reply_len receives the reply's length, also when alloc refuses it.
 * Result: as nexar_rpc_call_timeout; NEXAR_ERR_TRUNCATED when alloc
 * returned NULL (the reply is then dropped: the call has run);
 * NEXAR_ERR_INVALID_ARGUMENT also for alloc or reply_len NULL.
 * Thread-safety: as nexar_rpc_call. */
nexar_result_t nexar_rpc_call_into(nexar_comm_t comm, int peer, uint32_t fn, const void* req,
                                   size_t req_len, int64_t timeout_ms, nexar_rpc_alloc_t alloc,
                                   void* user, size_t* reply_len);

/* nexar_rpc_icall starts calling function fn on rank peer and returns at
 * once with *request, which nexar_wait, nexar_test, nexar_waitall and
 * nexar_testany complete like any request (nexar_request_status reports
 * an empty status); release it with nexar_request_free.
 * Buffers: req[0:req_len] must stay valid and unchanged until the request
 * completes. *reply and *reply_len are set to NULL and 0 now; when a wait
 * or test first reports the request complete and successful, they receive
 * the reply (allocated by the library: release it with nexar_free; NULL
 * when empty), so reply and reply_len must stay valid until then or until
 * nexar_request_free. A request freed before it was seen complete
 * allocates no reply. On failure they stay NULL and 0.
 * Deadline: timeout_ms as nexar_rpc_call_timeout; the call fails with
 * NEXAR_ERR_TIMEOUT at it whether or not anyone waits. nexar_wait also
 * stops at the communicator's timeout, which then ends the call.
 * Result (now): NEXAR_SUCCESS; NEXAR_ERR_INVALID_ARGUMENT (req NULL with
 * req_len > 0, req_len over the largest message, reply, reply_len or
 * request NULL, negative timeout_ms); NEXAR_ERR_INVALID_HANDLE.
 * Result (of the request, from nexar_wait/nexar_test): as nexar_rpc_call
 * (peer out of range, no handler for fn, the handler's error,
 * NEXAR_ERR_PEER_DOWN, NEXAR_ERR_TIMEOUT, the communicator's failure).
 * Thread-safety: safe from several threads on one communicator. */
nexar_result_t nexar_rpc_icall(nexar_comm_t comm, int peer, uint32_t fn, const void* req,
                               size_t req_len, int64_t timeout_ms, void** reply, size_t* reply_len,
                               nexar_request_t* request);

/* nexar_free releases memory the library allocated for the caller (an RPC
 * reply). NULL is ignored. Thread-safety: safe from any thread. */
void nexar_free(void* p);

/* ------------------------------------------------------------------------
 * Collectives (blocking)
 *
 * Every member of comm must call the same collective with matching
 * arguments, in the same order as its other collectives on comm.
 * Common results: NEXAR_SUCCESS; NEXAR_ERR_INVALID_ARGUMENT (NULL buffer
 * with count > 0, bad dt/op/root, overflowing count); NEXAR_ERR_INVALID_HANDLE;
 * NEXAR_ERR_MISMATCH; NEXAR_ERR_PEER_DOWN; NEXAR_ERR_TIMEOUT;
 * NEXAR_ERR_ABORTED; NEXAR_ERR_CLOSED.
 * Thread-safety: see "Threads" above.
 * --------------------------------------------------------------------- */

/* nexar_allreduce: recvbuf[i] = op over ranks of sendbuf[i], i < count, on
 * every rank. In place: sendbuf == recvbuf. */
nexar_result_t nexar_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                               nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm);

/* nexar_broadcast copies count elements of buf on rank root into buf on
 * every other rank. */
nexar_result_t nexar_broadcast(void* buf, size_t count, nexar_datatype_t dt, int root,
                               nexar_comm_t comm);

/* nexar_reduce: like nexar_allreduce, but only root receives the result.
 * recvbuf is used on root only (may be NULL elsewhere). In place on root:
 * sendbuf == recvbuf. */
nexar_result_t nexar_reduce(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                            nexar_op_t op, int root, nexar_comm_t comm);

/* nexar_allgather: recvbuf (size*sendcount elements) receives rank r's
 * sendcount elements at offset r*sendcount, on every rank. In place:
 * sendbuf == recvbuf, with this rank's block already at its offset. */
nexar_result_t nexar_allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                               nexar_datatype_t dt, nexar_comm_t comm);

/* nexar_allgatherv: recvbuf receives rank r's recvcounts[r] elements at
 * element offset displs[r]; sendcount must equal recvcounts[rank].
 * recvcounts and displs have size entries. In place: sendbuf == recvbuf,
 * with this rank's block already at displs[rank]. */
nexar_result_t nexar_allgatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                                const size_t* recvcounts, const size_t* displs, nexar_datatype_t dt,
                                nexar_comm_t comm);

/* nexar_reduce_scatter: sendbuf holds size*recvcount elements; the
 * element-wise reduction of block r over all ranks goes to recvbuf
 * (recvcount elements) on rank r. In place: sendbuf == recvbuf holding
 * size*recvcount elements; the result is left in its first recvcount. */
nexar_result_t nexar_reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                    nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm);

/* nexar_alltoall: block j (count_per_peer elements) of sendbuf on rank i
 * goes to block i of recvbuf on rank j. Both buffers hold
 * size*count_per_peer elements. In place: sendbuf == recvbuf. */
nexar_result_t nexar_alltoall(const void* sendbuf, void* recvbuf, size_t count_per_peer,
                              nexar_datatype_t dt, nexar_comm_t comm);

/* nexar_alltoallv: sendcounts[j] elements at sendbuf offset sdispls[j] go
 * to rank j, which receives them at recvbuf offset rdispls[i] (i = sender),
 * recvcounts[i] elements. All four arrays have size entries, in elements,
 * and recvcounts[i] on rank j must equal sendcounts[j] on rank i. */
nexar_result_t nexar_alltoallv(const void* sendbuf, const size_t* sendcounts, const size_t* sdispls,
                               void* recvbuf, const size_t* recvcounts, const size_t* rdispls,
                               nexar_datatype_t dt, nexar_comm_t comm);

/* nexar_gather: root's recvbuf (size*sendcount elements) receives rank r's
 * sendcount elements at offset r*sendcount. recvbuf is used on root only.
 * In place on root: sendbuf == recvbuf, root's block already in place. */
nexar_result_t nexar_gather(const void* sendbuf, void* recvbuf, size_t sendcount,
                            nexar_datatype_t dt, int root, nexar_comm_t comm);

/* nexar_gatherv: root's recvbuf receives rank r's sendcount elements
 * (= recvcounts[r]) at element offset displs[r]. recvbuf, recvcounts and
 * displs are used on root only (may be NULL elsewhere). In place on root:
 * sendbuf == recvbuf. */
nexar_result_t nexar_gatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                             const size_t* recvcounts, const size_t* displs, nexar_datatype_t dt,
                             int root, nexar_comm_t comm);

/* nexar_scatter: block r (recvcount elements) of root's sendbuf
 * (size*recvcount elements) goes to recvbuf on rank r. sendbuf is used on
 * root only. In place on root: recvbuf == sendbuf (root's block stays). */
nexar_result_t nexar_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                             nexar_datatype_t dt, int root, nexar_comm_t comm);

/* nexar_scatterv: sendcounts[r] elements at element offset displs[r] of
 * root's sendbuf go to recvbuf on rank r (recvcount must equal
 * sendcounts[r]). sendbuf, sendcounts and displs are used on root only.
 * In place on root: recvbuf == sendbuf. */
nexar_result_t nexar_scatterv(const void* sendbuf, const size_t* sendcounts, const size_t* displs,
                              void* recvbuf, size_t recvcount, nexar_datatype_t dt, int root,
                              nexar_comm_t comm);

/* nexar_scan: inclusive prefix reduction: rank r receives op over ranks
 * 0..r. In place: sendbuf == recvbuf. */
nexar_result_t nexar_scan(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                          nexar_op_t op, nexar_comm_t comm);

/* nexar_exscan: exclusive prefix reduction: rank r > 0 receives op over
 * ranks 0..r-1; rank 0's recvbuf is left unchanged (as in MPI). In place:
 * sendbuf == recvbuf. */
nexar_result_t nexar_exscan(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                            nexar_op_t op, nexar_comm_t comm);

/* nexar_barrier returns once every member of comm has entered it. */
nexar_result_t nexar_barrier(nexar_comm_t comm);

/* ------------------------------------------------------------------------
 * Bucketed and compressed allreduce
 *
 * nexar_allreduce_multi is nexar_allreduce over nbufs buffers of one dt:
 * recvbufs[i] (counts[i] elements) = op over ranks of sendbufs[i]. The
 * buffers are packed, in order, into buckets of at most bucket_bytes
 * (0: NEXAR_DEFAULT_BUCKET_BYTES, 25 MiB as DDP), one collective each;
 * packing the next bucket and unpacking the previous one overlap the
 * reduction of the current one. A buffer of bucket_bytes or more, or alone
 * in its bucket, is reduced in place without a copy. Extra memory: two
 * buckets. In place: sendbufs NULL (all buffers), or sendbufs[i] NULL or
 * equal to recvbufs[i]. Every rank must pass the same counts, in the same
 * order, and the same bucket_bytes (mismatches fail as
 * NEXAR_ERR_MISMATCH). The arrays sendbufs, recvbufs and counts are read
 * by the call and may be freed once it returns; the buffers they point to
 * must stay valid until completion.
 * nexar_iallreduce_multi is its non-blocking form: the call takes its
 * places in the communicator's call order at once (later collectives may
 * be issued before it completes) and returns the request in *req.
 * Result: as the collectives above; NEXAR_ERR_INVALID_ARGUMENT also for
 * recvbufs or counts NULL with nbufs > 0, recvbufs[i] or sendbufs[i] NULL
 * where counts[i] > 0 (recvbufs), req NULL.
 * Thread-safety: as the other collectives (see "Threads" above).
 * --------------------------------------------------------------------- */
#define NEXAR_DEFAULT_BUCKET_BYTES ((size_t)25 << 20)
nexar_result_t nexar_allreduce_multi(const void* const* sendbufs, void* const* recvbufs,
                                     const size_t* counts, size_t nbufs, nexar_datatype_t dt,
                                     nexar_op_t op, size_t bucket_bytes, nexar_comm_t comm);
nexar_result_t nexar_iallreduce_multi(const void* const* sendbufs, void* const* recvbufs,
                                      const size_t* counts, size_t nbufs, nexar_datatype_t dt,
                                      nexar_op_t op, size_t bucket_bytes, nexar_comm_t comm,
                                      nexar_request_t* req);

/* nexar_allreduce_compressed sums a sparsified buf (count float32
 * elements) over the ranks, in place: each rank sends
 * k = ceil(ratio*count) elements (at least 1), and buf becomes the sum of
 * every rank's contribution (zero where none sent anything), bit-identical
 * on every rank. NEXAR_COMPRESS_TOPK: each rank's k largest magnitudes, as
 * (index, value) pairs gathered from all ranks (each counted once).
 * NEXAR_COMPRESS_RANDOMK: the same k indices on every rank, drawn from
 * seed, which must be equal on every rank (e.g. a step counter); values
 * scaled by count/k (unbiased) when residual is NULL. residual (count
 * float32, or NULL) is the error feedback, kept by the caller per buffer:
 * the input is buf + residual, and residual receives what this rank did
 * not send (RandomK then sends unscaled values). Average: divide by the
 * size. buf and residual must be 4-byte aligned. Every rank must pass the
 * same count, method and ratio (else NEXAR_ERR_MISMATCH).
 * Result: as the collectives above; NEXAR_ERR_INVALID_ARGUMENT also for a
 * dt other than NEXAR_FLOAT32, an unknown method, ratio outside (0, 1].
 * Thread-safety: as the other collectives. */
typedef enum { NEXAR_COMPRESS_TOPK = 1, NEXAR_COMPRESS_RANDOMK = 2 } nexar_compress_t;
nexar_result_t nexar_allreduce_compressed(void* buf, void* residual, size_t count,
                                          nexar_datatype_t dt, nexar_compress_t method,
                                          double ratio, uint64_t seed, nexar_comm_t comm);

/* ------------------------------------------------------------------------
 * CUDA device memory and streams (docs/device-memory.md)
 *
 * The blocking collectives (all of those above except the bucketed and
 * compressed allreduce), nexar_send, nexar_recv and nexar_recv_status take
 * CUDA device pointers as well as host pointers: each buffer is checked
 * with cudaPointerGetAttributes, and device memory is staged through
 * page-locked host buffers (copied in after the work already on the legacy
 * default stream, the call run on the host, the results copied back before
 * the call returns). The library never dereferences a device pointer. The
 * non-blocking forms, nexar_allreduce_multi and nexar_allreduce_compressed
 * refuse device memory with NEXAR_ERR_INVALID_ARGUMENT naming the argument
 * (nexar_isend and nexar_irecv: see GPUDirect RDMA below).
 *
 * GPUDirect RDMA: the device buffer of nexar_send, nexar_recv,
 * nexar_recv_status, nexar_send_stream, nexar_recv_stream, nexar_isend and
 * nexar_irecv is not staged where the data path to the peer (from the peer
 * for a receive; from some member for NEXAR_ANY_SOURCE) is an RDMA channel
 * whose NIC can reach device memory (dma-buf, else peer memory): decided at
 * each call. The host waits for the work enqueued on the call's stream (the
 * legacy default stream for the blocking and non-blocking forms), then the
 * NIC reads or writes the device buffer; a message that arrived before its
 * receive, or over another path, is copied into it by the CUDA runtime. The
 * call (the request) completes once the transfer is over, and nothing is
 * left on the stream. A too long message fills the buffer and fails with
 * NEXAR_ERR_TRUNCATED, as for host memory (a staged receive that fails
 * leaves the device buffer as it was). nexar_isend and nexar_irecv refuse
 * device memory (NEXAR_ERR_INVALID_ARGUMENT, saying why) where GPUDirect
 * RDMA is not used. Not verified on hardware.
 *
 * Device memory is recognised when the process had a device runtime that
 * saw a device when a communicator was created: an installed adapter (see
 * Device adapters), else the CUDA runtime NEXAR_CUDART names, else one the
 * process has loaded under any name (torch's bundled libcudart included);
 * each new buffer is asked about once. A buffer no runtime claims is taken
 * as host memory only if the host can read it (checked without reading it,
 * once per address): otherwise the call fails with
 * NEXAR_ERR_INVALID_ARGUMENT naming the argument and the pointer and saying
 * what to set (a statically linked CUDA runtime, nvcc's default, cannot be
 * found: set NEXAR_CUDART), and nothing is sent; the process carries on.
 * Managed memory (cudaMallocManaged) is taken as host memory.
 *
 * The _stream variants take the arguments of the blocking form and then
 * stream, a cudaStream_t (NULL: the legacy default stream). The call is
 * ordered after the work enqueued on stream before it; it returns once the
 * host part of the operation is done, and the copies of device results
 * back go on the library's own stream, which stream is made to wait for
 * (cudaStreamWaitEvent): work enqueued on stream after the call sees the
 * results, the host must synchronize stream before reading them. Host
 * buffers are complete when the call returns. Errors as the blocking form;
 * NEXAR_ERR_INVALID_ARGUMENT also for a non-NULL stream in a process where
 * CUDA is not usable (the message says why); NEXAR_ERR_TIMEOUT when work
 * on stream did not reach the call within 5 minutes; NEXAR_ERR_UNAVAILABLE
 * for a CUDA runtime error (the message names the CUDA call). A device
 * buffer of a _stream call that fails in the host part keeps its contents.
 *
 * Where NCCL loads (NEXAR_NCCL, else libnccl.so.2) and NEXAR_NCCL_HIER is
 * auto (the default) or on, nexar_allreduce, nexar_broadcast,
 * nexar_allgather, nexar_reduce_scatter and their _stream variants whose
 * buffers are all device memory go through NCCL among the ranks of a host
 * and nexar between hosts (bitwise reductions are staged). The first such
 * call on a communicator sets this up, collectively: every rank makes it
 * with device buffers. It fails with NEXAR_ERR_UNAVAILABLE, naming the
 * ranks, under NEXAR_NCCL_HIER=on where a rank cannot use NCCL. A rank
 * found dead while NCCL works aborts NCCL (no call waits on it) and the
 * calls fail with NEXAR_ERR_PEER_DOWN naming it; ranks of one host making
 * different calls fail with NEXAR_ERR_MISMATCH before NCCL is given them.
 * A _stream call returns with its last NCCL phase left on stream.
 * Thread-safety: as the blocking forms.
 * --------------------------------------------------------------------- */

/* nexar_allreduce_stream: nexar_allreduce ordered on stream. */
nexar_result_t nexar_allreduce_stream(const void* sendbuf, void* recvbuf, size_t count,
                                      nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm,
                                      void* stream);

/* nexar_broadcast_stream: nexar_broadcast ordered on stream. */
nexar_result_t nexar_broadcast_stream(void* buf, size_t count, nexar_datatype_t dt, int root,
                                      nexar_comm_t comm, void* stream);

/* nexar_allgather_stream: nexar_allgather ordered on stream. */
nexar_result_t nexar_allgather_stream(const void* sendbuf, void* recvbuf, size_t sendcount,
                                      nexar_datatype_t dt, nexar_comm_t comm, void* stream);

/* nexar_reduce_scatter_stream: nexar_reduce_scatter ordered on stream. */
nexar_result_t nexar_reduce_scatter_stream(const void* sendbuf, void* recvbuf, size_t recvcount,
                                           nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm,
                                           void* stream);

/* nexar_reduce_stream: nexar_reduce ordered on stream. recvbuf is used
 * on root only (may be NULL elsewhere). Staged, as are the four calls
 * below: never through NCCL nor GPUDirect RDMA. */
nexar_result_t nexar_reduce_stream(const void* sendbuf, void* recvbuf, size_t count,
                                   nexar_datatype_t dt, nexar_op_t op, int root, nexar_comm_t comm,
                                   void* stream);

/* nexar_alltoall_stream: nexar_alltoall ordered on stream. Staged. */
nexar_result_t nexar_alltoall_stream(const void* sendbuf, void* recvbuf, size_t count_per_peer,
                                     nexar_datatype_t dt, nexar_comm_t comm, void* stream);

/* nexar_alltoallv_stream: nexar_alltoallv ordered on stream. The four
 * arrays are host memory, read before the call returns (they may be freed
 * then); the buffers may be device memory. Staged. */
nexar_result_t nexar_alltoallv_stream(const void* sendbuf, const size_t* sendcounts,
                                      const size_t* sdispls, void* recvbuf,
                                      const size_t* recvcounts, const size_t* rdispls,
                                      nexar_datatype_t dt, nexar_comm_t comm, void* stream);

/* nexar_gather_stream: nexar_gather ordered on stream. recvbuf is used on
 * root only. Staged. */
nexar_result_t nexar_gather_stream(const void* sendbuf, void* recvbuf, size_t sendcount,
                                   nexar_datatype_t dt, int root, nexar_comm_t comm, void* stream);

/* nexar_scatter_stream: nexar_scatter ordered on stream. sendbuf is used
 * on root only. Staged. */
nexar_result_t nexar_scatter_stream(const void* sendbuf, void* recvbuf, size_t recvcount,
                                    nexar_datatype_t dt, int root, nexar_comm_t comm, void* stream);

/* nexar_send_stream: nexar_send of buf as stream has it when the work
 * enqueued before the call is done. */
nexar_result_t nexar_send_stream(const void* buf, size_t count, nexar_datatype_t dt, int peer,
                                 uint64_t tag, nexar_comm_t comm, void* stream);

/* nexar_recv_stream: nexar_recv whose result reaches buf in stream order
 * (over GPUDirect RDMA: in buf when the call returns). */
nexar_result_t nexar_recv_stream(void* buf, size_t count, nexar_datatype_t dt, int peer,
                                 uint64_t tag, nexar_comm_t comm, void* stream);

/* ------------------------------------------------------------------------
 * Device adapters (docs/device-memory.md, "Device adapters")
 *
 * A GPU runtime other than CUDA's (ROCm/HIP, a vendor's own) gives libnexar
 * its device memory through a table of functions: what a pointer is,
 * pinned host memory, copies (synchronous and on a stream), streams,
 * events and stream waits, and optionally a dma-buf export for GPUDirect
 * RDMA. libnexar's CUDA support is one such table, filled from the CUDA
 * runtime it finds; a program installs its own with
 * nexar_device_adapter_install before it creates the communicators that
 * should use it. Everything said above of CUDA device memory and streams
 * then holds of the adapter's: buffers are classified by pointer_query,
 * staged through host_alloc'd memory with copy_async on the adapter's
 * streams, and a _stream call's stream is the adapter's stream handle.
 * The NCCL hierarchy (NEXAR_NCCL_HIER) needs an NCCL built for the same
 * runtime (RCCL for HIP): set NEXAR_NCCL, or NEXAR_NCCL_HIER=off.
 *
 * Each function returns 0 on success and otherwise the runtime's own
 * error code, which error_string describes (libnexar's message names the
 * entry, the code and that text); NEXAR_DEVICE_NOT_SUPPORTED is reserved
 * for "not possible on this system" where an entry says so. ctx is the
 * table's ctx, passed as it is. Streams and events are the runtime's
 * handles, carried opaquely; the NULL stream is the runtime's default
 * stream. Every function may be called from any thread, concurrently; the
 * current device (get_device, set_device) is per thread, as in CUDA and
 * HIP. The table is copied by the install; ctx, name and the functions
 * must stay valid for the life of the process.
 * --------------------------------------------------------------------- */

/* NEXAR_DEVICE_ADAPTER_VERSION is the version of nexar_device_adapter_t
 * this header describes: set it in the table's version field. */
#define NEXAR_DEVICE_ADAPTER_VERSION 1

/* NEXAR_DEVICE_NOT_SUPPORTED: an entry's result for "not possible here". */
#define NEXAR_DEVICE_NOT_SUPPORTED (-1)

/* nexar_memory_kind_t: what pointer_query says an address is (the values
 * of cudaMemoryType and hipMemoryType). Only NEXAR_MEMORY_DEVICE is
 * memory the host must not read; the others are used as host memory. */
typedef enum {
    NEXAR_MEMORY_UNREGISTERED = 0, /* host memory the runtime does not know (malloc, mmap) */
    NEXAR_MEMORY_PINNED = 1,       /* page-locked host memory */
    NEXAR_MEMORY_DEVICE = 2,       /* device memory */
    NEXAR_MEMORY_MANAGED = 3       /* managed memory, which the host may read */
} nexar_memory_kind_t;

/* nexar_copy_kind_t: the direction of a copy (the values of cudaMemcpyKind
 * and hipMemcpyKind). */
typedef enum {
    NEXAR_COPY_HOST_TO_HOST = 0,
    NEXAR_COPY_HOST_TO_DEVICE = 1,
    NEXAR_COPY_DEVICE_TO_HOST = 2,
    NEXAR_COPY_DEVICE_TO_DEVICE = 3,
    NEXAR_COPY_DEFAULT = 4 /* inferred from the addresses (unified addressing) */
} nexar_copy_kind_t;

/* nexar_device_adapter_t: a GPU runtime's functions. Set size to
 * sizeof(nexar_device_adapter_t) and version to
 * NEXAR_DEVICE_ADAPTER_VERSION: a later libnexar reads a table of this
 * version by its size (fields added later are appended and optional), and
 * refuses a table from a later header than its own. Every entry up to
 * error_string must be set; the others may be NULL. */
typedef struct nexar_device_adapter {
    size_t size;      /* sizeof(nexar_device_adapter_t) as the runtime compiled it */
    int version;      /* NEXAR_DEVICE_ADAPTER_VERSION */
    const char* name; /* the runtime, for messages and nexar info: "hip", ... */
    void* ctx;        /* passed to every function */
    /* *kind: a nexar_memory_kind_t; *device: the device of device memory.
     * A host address the runtime does not know is NEXAR_MEMORY_UNREGISTERED
     * and success, not an error. */
    int (*pointer_query)(void* ctx, const void* ptr, int* kind, int* device);
    int (*device_count)(void* ctx, int* count);
    int (*get_device)(void* ctx, int* device);
    int (*set_device)(void* ctx, int device);
    /* Page-locked host memory for staging, which copy_async runs
     * asynchronously from. */
    int (*host_alloc)(void* ctx, void** ptr, size_t size);
    int (*host_free)(void* ctx, void* ptr);
    int (*device_alloc)(void* ctx, void** ptr, size_t size);
    int (*device_free)(void* ctx, void* ptr);
    /* copy: synchronous; copy_async: enqueued on stream. kind: a
     * nexar_copy_kind_t. */
    int (*copy)(void* ctx, void* dst, const void* src, size_t size, int kind);
    int (*copy_async)(void* ctx, void* dst, const void* src, size_t size, int kind, void* stream);
    /* stream_create: a stream that does not synchronize with the default
     * stream (libnexar orders its streams by events only). */
    int (*stream_create)(void* ctx, void** stream);
    int (*stream_destroy)(void* ctx, void* stream);
    int (*stream_synchronize)(void* ctx, void* stream);
    /* Work enqueued on stream after the call waits for event's latest
     * record made before the call. */
    int (*stream_wait_event)(void* ctx, void* stream, void* event);
    /* event_create: an event for ordering only (no timing). */
    int (*event_create)(void* ctx, void** event);
    int (*event_destroy)(void* ctx, void* event);
    int (*event_record)(void* ctx, void* event, void* stream);
    /* *done: 1 once the work before the latest record has completed, else
     * 0 (not an error). */
    int (*event_query)(void* ctx, void* event, int* done);
    const char* (*error_string)(void* ctx, int code);
    /* Optional: the device range [ptr, ptr+size) as a dma-buf, *fd (closed
     * by libnexar) at *offset, for GPUDirect RDMA; NEXAR_DEVICE_NOT_SUPPORTED
     * where this system cannot export it. NULL: never. */
    int (*dmabuf_export)(void* ctx, const void* ptr, size_t size, int* fd, uint64_t* offset);
} nexar_device_adapter_t;

/* nexar_device_adapter_install: use adapter's runtime for device memory in
 * the communicators created from now on, in place of the CUDA runtime
 * libnexar would look for. Once per process, before a communicator found
 * a CUDA runtime.
 * Result: NEXAR_ERR_INVALID_ARGUMENT for a NULL adapter, a size smaller
 * than version 1's table, a version later than this library's, a required
 * entry that is NULL (the message names it); NEXAR_ERR_UNAVAILABLE when a
 * runtime is in use already (an adapter installed before, or CUDA found
 * by a communicator: the message names it), or when the adapter's
 * device_count fails or reports no device.
 * Thread-safety: safe to call from any thread; concurrent installs: one
 * wins, the others fail as above. */
nexar_result_t nexar_device_adapter_install(const nexar_device_adapter_t* adapter);

/* ------------------------------------------------------------------------
 * Non-blocking operations
 *
 * Each takes the arguments of its blocking form, then req (out, non-NULL),
 * and returns once the operation is started; errors in the arguments are
 * reported at once, errors of the operation by nexar_wait/nexar_test.
 * A started collective of 256 KiB or more runs in the library's threads
 * at once. A smaller one runs in the thread that waits for it first if
 * nobody has begun it by then (nexar_wait's thread, as the blocking form
 * would: no hand-off to another thread); it is begun in the library's
 * threads when it is tested, when another collective starts on the
 * communicator, or after about a millisecond, so it progresses while the
 * caller computes.
 * Several operations may be in flight on one communicator and complete in
 * any order; collectives are ordered by the order of the calls that start
 * them. Buffers must stay valid and untouched until the request completes;
 * counts and displacement arrays are copied by the call and may be freed
 * once it returns. Every request must be released with nexar_request_free.
 * Every collective has a non-blocking form. Device memory is refused but by
 * nexar_isend and nexar_irecv over GPUDirect RDMA (see CUDA device memory
 * and streams), which first wait for the work on the legacy default stream.
 * Thread-safety: as the blocking forms.
 * --------------------------------------------------------------------- */

nexar_result_t nexar_isend(const void* buf, size_t count, nexar_datatype_t dt, int peer,
                           uint64_t tag, nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_irecv(void* buf, size_t count, nexar_datatype_t dt, int peer, uint64_t tag,
                           nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_iallreduce(const void* sendbuf, void* recvbuf, size_t count,
                                nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm,
                                nexar_request_t* req);
nexar_result_t nexar_ibroadcast(void* buf, size_t count, nexar_datatype_t dt, int root,
                                nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_ireduce(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                             nexar_op_t op, int root, nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_iallgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                nexar_datatype_t dt, nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_ireduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                     nexar_datatype_t dt, nexar_op_t op, nexar_comm_t comm,
                                     nexar_request_t* req);
nexar_result_t nexar_ialltoall(const void* sendbuf, void* recvbuf, size_t count_per_peer,
                               nexar_datatype_t dt, nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_ibarrier(nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_iallgatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                                 const size_t* recvcounts, const size_t* displs,
                                 nexar_datatype_t dt, nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_ialltoallv(const void* sendbuf, const size_t* sendcounts,
                                const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                const size_t* rdispls, nexar_datatype_t dt, nexar_comm_t comm,
                                nexar_request_t* req);
nexar_result_t nexar_igather(const void* sendbuf, void* recvbuf, size_t sendcount,
                             nexar_datatype_t dt, int root, nexar_comm_t comm,
                             nexar_request_t* req);
nexar_result_t nexar_igatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                              const size_t* recvcounts, const size_t* displs, nexar_datatype_t dt,
                              int root, nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_iscatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                              nexar_datatype_t dt, int root, nexar_comm_t comm,
                              nexar_request_t* req);
nexar_result_t nexar_iscatterv(const void* sendbuf, const size_t* sendcounts, const size_t* displs,
                               void* recvbuf, size_t recvcount, nexar_datatype_t dt, int root,
                               nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_iscan(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                           nexar_op_t op, nexar_comm_t comm, nexar_request_t* req);
nexar_result_t nexar_iexscan(const void* sendbuf, void* recvbuf, size_t count, nexar_datatype_t dt,
                             nexar_op_t op, nexar_comm_t comm, nexar_request_t* req);

/* nexar_wait blocks until req completes and returns the operation's result
 * (the comm's timeout applies). Waiting again returns the same result.
 * The request stays valid until nexar_request_free.
 * Result: the operation's result, NEXAR_ERR_INVALID_HANDLE, or
 * NEXAR_ERR_FORKED (in a forked child, for the parent's request).
 * Thread-safety: safe from any thread; several threads may wait on
 * different requests at once. */
nexar_result_t nexar_wait(nexar_request_t req);

/* nexar_test stores in *done 1 if req has completed, else 0, without
 * blocking. When done, returns the operation's result.
 * Args: req; done: out, non-NULL.
 * Result: NEXAR_SUCCESS while in progress or on success; the operation's
 * error once done; NEXAR_ERR_INVALID_HANDLE; NEXAR_ERR_INVALID_ARGUMENT.
 * Thread-safety: as nexar_wait. */
nexar_result_t nexar_test(nexar_request_t req, int* done);

/* nexar_waitall waits for each of the count requests in reqs (as
 * nexar_wait, in order, each under its communicator's timeout), also after
 * one has failed. NEXAR_REQUEST_NULL entries are skipped. If results is
 * not NULL, results[i] receives request i's result (NEXAR_SUCCESS for a
 * skipped one). The requests stay valid until nexar_request_free.
 * Result: NEXAR_SUCCESS if every request succeeded, else the result of the
 * first (lowest index) that failed, whose message nexar_last_error names
 * ("reqs[i]: ..."); NEXAR_ERR_INVALID_HANDLE (an entry that is not a
 * request: nothing is waited for) or NEXAR_ERR_INVALID_ARGUMENT (reqs
 * NULL with count > 0); NEXAR_ERR_FORKED.
 * Thread-safety: as nexar_wait. */
nexar_result_t nexar_waitall(size_t count, nexar_request_t* reqs, nexar_result_t* results);

/* nexar_testany checks, without blocking and in index order, whether one
 * of the count requests has completed: if so *index receives the lowest
 * such index and *done 1, and the call returns that request's result.
 * Otherwise *done is 0 and *index is count. NEXAR_REQUEST_NULL entries are
 * skipped; when every entry is, *done is 1 and *index is count (nothing to
 * wait for, as MPI_Testany). Requests stay valid until nexar_request_free.
 * Args: index, done: out, non-NULL.
 * Result: NEXAR_SUCCESS, or the completed request's error;
 * NEXAR_ERR_INVALID_HANDLE; NEXAR_ERR_INVALID_ARGUMENT; NEXAR_ERR_FORKED.
 * Thread-safety: as nexar_test. */
nexar_result_t nexar_testany(size_t count, nexar_request_t* reqs, size_t* index, int* done);

/* nexar_request_status stores the status of a completed receive request
 * (nexar_irecv) in *status. For other requests it stores zeros.
 * Result: NEXAR_SUCCESS; NEXAR_ERR_INVALID_HANDLE; NEXAR_ERR_INVALID_ARGUMENT
 * (status NULL, or the request has not completed).
 * Thread-safety: as nexar_wait. */
nexar_result_t nexar_request_status(nexar_request_t req, nexar_status_t* status);

/* nexar_request_free releases req. If the operation is still running it
 * carries on in the background and its result is dropped; its buffers must
 * stay valid until it would have completed, so wait first unless the
 * communicator is being torn down. Freeing twice gives
 * NEXAR_ERR_INVALID_HANDLE; in a forked child it gives NEXAR_ERR_FORKED and
 * frees nothing.
 * Thread-safety: safe from any thread; no other thread may use req then. */
nexar_result_t nexar_request_free(nexar_request_t req);

/* ---- Diagnostics (docs/diagnostics.md) ---------------------------------- */

/* nexar_comm_dump_flight_record writes comm's flight record (its last
 * operations: kind, sequence number, dtype, bytes, root or peer, state,
 * timestamps) as JSON to the file path, replacing it. `nexar diagnose DIR`
 * reads the records of every rank from a directory (name them with
 * nexar-flight-*.json there) and says who waits for whom.
 * Args: comm; path: a NUL-terminated file name, non-NULL, non-empty.
 * Result: NEXAR_SUCCESS; NEXAR_ERR_INVALID_HANDLE;
 * NEXAR_ERR_INVALID_ARGUMENT (path NULL or empty); NEXAR_ERR_INTERNAL (the
 * file could not be written: nexar_last_error says why); NEXAR_ERR_FORKED.
 * Thread-safety: safe from any thread, also while other threads are blocked
 * in calls on comm (that is what it is for). */
nexar_result_t nexar_comm_dump_flight_record(nexar_comm_t comm, const char* path);

/* ---- Memory and traffic statistics (docs/memory.md) ---------------------- */

/* nexar_stats_t is a snapshot of a communicator's memory and traffic.
 * Initialize it with NEXAR_STATS_INIT: struct_size lets later versions
 * append fields (the library writes only the fields that fit in
 * struct_size). "Per process" figures belong to the process's mesh,
 * shared by a world communicator and every communicator split from it. */
typedef struct nexar_stats {
    size_t struct_size;     /* sizeof(nexar_stats_t); set by NEXAR_STATS_INIT */
    int64_t bytes_buffered; /* per process: payload of messages that arrived before their
                               receive was posted (bound: max_buffered_bytes) */
    int64_t scratch_bytes;  /* per communicator: collective scratch in use plus kept idle
                               (bound on idle: NEXAR_SCRATCH_IDLE_BYTES) */
    int64_t ring_bytes;     /* per process: capacity of the shared-memory rings it created
                               (bound: NEXAR_RING_BUDGET); 0 without shared memory */
    int64_t relayed_bytes;  /* per process: payload forwarded for other ranks under a sparse
                               topology (NEXAR_TOPOLOGY); 0 under the full mesh */
    int64_t messages_sent;  /* per communicator: data messages (collective steps, sends) */
    int64_t bytes_sent;     /* per communicator: their payload bytes */
    int64_t bytes_received; /* per communicator: data payload bytes received */
} nexar_stats_t;

#define NEXAR_STATS_INIT { sizeof(nexar_stats_t), 0, 0, 0, 0, 0, 0, 0 }

/* nexar_comm_get_stats fills *stats with comm's statistics; each figure is
 * read atomically, not all at one instant. Works on a failed communicator.
 * Args: comm; stats: non-NULL, initialized with NEXAR_STATS_INIT.
 * Result: NEXAR_SUCCESS; NEXAR_ERR_INVALID_HANDLE;
 * NEXAR_ERR_INVALID_ARGUMENT (stats NULL, or struct_size smaller than this
 * version's first nexar_stats_t); NEXAR_ERR_FORKED.
 * Thread-safety: safe from any thread, also while other threads are blocked
 * in calls on comm; takes no lock of comm. */
nexar_result_t nexar_comm_get_stats(nexar_comm_t comm, nexar_stats_t* stats);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NEXAR_H */
