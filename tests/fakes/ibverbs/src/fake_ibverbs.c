// fake_ibverbs.c: a stand-in for libibverbs.so.1, loaded through
// NEXAR_IBVERBS, that behaves the way an RDMA NIC does and fails the way it
// does. Compiled against the real <infiniband/verbs.h>, so every structure
// has the real layout and the inline verbs (ibv_post_send, ibv_post_recv,
// ibv_poll_cq, ibv_req_notify_cq) reach it through context->ops as they
// reach a real provider.
//
// What it models:
// - Two devices, each with one active port: fake_roce0 (Ethernet link
//   layer: a GID table of RoCE v1 and v2 entries, link-local and
//   IPv4-mapped, path MTU 1024) and fake_ib0 (InfiniBand: LID 0x11, path
//   MTU 4096). NEXAR_FAKE_IBV_DEVICES picks them ("roce", "ib",
//   "roce,ib": the default; "" lists none); NEXAR_FAKE_IBV_PORT_DOWN=1
//   makes every port DOWN.
// - PD, MR with lkey/rkey and access flags (REMOTE_WRITE without
//   LOCAL_WRITE is EINVAL, as in rdma-core). ibv_reg_mr pins only memory
//   the process can read (and write, with LOCAL_WRITE) according to
//   /proc/self/maps: anything else is EFAULT, as get_user_pages makes it,
//   unless it is fake-CUDA device memory and NEXAR_FAKE_IBV_PEERMEM=1
//   (nvidia-peermem loaded). Registration pins the pages as the kernel
//   does: where the memory is a shared mapping (memfd, shm, a file), the
//   NIC keeps reaching the pages registered through a mapping of its own
//   (mremap of size 0), so memory unmapped and mapped anew at the same
//   address is not what a stale MR reaches, as on hardware; private
//   (anonymous) memory the fake can only reach through its address. ibv_reg_dmabuf_mr takes the dma-buf fd of the
//   fake CUDA (tests/fakes/cudart); NEXAR_FAKE_IBV_DMABUF=0 makes it fail
//   with EOPNOTSUPP (a kernel without dma-buf support for the NIC).
// - CQs with completion channels: ibv_req_notify_cq arms, the next
//   completion writes an event to the channel's fd (a pipe), which
//   ibv_get_cq_event reads (non-blocking when the caller set O_NONBLOCK).
//   A completion that finds the CQ full overflows it: ibv_poll_cq returns
//   -1 from then on and an event is written to wake the consumer.
//   ibv_destroy_cq with events not acknowledged fails with EBUSY (the real
//   library would hang).
// - RC QPs with the RESET->INIT->RTR->RTS state machine and the attribute
//   masks each transition requires; posting a send before RTS or a receive
//   in RESET fails with EINVAL; a full queue is ENOMEM. In ERR every
//   outstanding and new work request completes with IBV_WC_WR_FLUSH_ERR.
// - A "NIC": each QP has a requester thread (executes the send queue in
//   order) and a responder thread, and talks to its peer QP over a Unix
//   socket named by the peer's QPN in NEXAR_FAKE_IBV_DIR (default
//   /tmp/nexar-fake-ibv-<uid>), so QPs connect between processes as well
//   as within one. The connection is checked as the fabric would route it:
//   on RoCE the destination GID must be one of the port's GIDs of the
//   sender's GID type and the address vector must carry a GRH; on IB the
//   destination LID must be the port's. A peer that does not answer (dead,
//   stopped, wrong address, not yet in RTR) costs transport retries
//   (timeout per IB's 4.096 us * 2^timeout, at least 200 ms here, retry_cnt
//   times) and then IBV_WC_RETRY_EXC_ERR.
// - SEND and SEND_WITH_IMM into posted receives (none posted: RNR NAK,
//   retried after the responder's min_rnr_timer rnr_retry times, 7 meaning
//   forever, then IBV_WC_RNR_RETRY_EXC_ERR; a message longer than the
//   receive: IBV_WC_LOC_LEN_ERR there, IBV_WC_REM_INV_REQ_ERR here), RDMA
//   WRITE and WRITE_WITH_IMM checked against the remote MR's rkey, range,
//   protection domain and access, and the QP's access flags
//   (IBV_WC_REM_ACCESS_ERR here, both QPs to ERR). Duplicates after a
//   retransmission are acknowledged and not executed again (sequence
//   numbers stand in for PSNs). Local SGEs are checked against the MR
//   table (IBV_WC_LOC_PROT_ERR).
// - Memory is touched only through a registration: a local SGE or a remote
//   address is translated through its MR, and an MR being used is never
//   released under the NIC (ibv_dereg_mr waits). Device memory is reached
//   only through the fake's own mapping of the dma-buf or peer-memory fd,
//   never through the device address.
//
// Not modelled: RDMA READ and atomics, SRQ, UD/UC, memory windows, inline
// data (max_inline_data is 0), async events, solicited-only notification
// (treated as any), unsignaled WRs' send-queue slots (freed at once, where
// hardware frees them with the next signaled completion).
//
// nexar_fake_ibv_live reports the live objects of each kind, for tests
// that check nothing leaked; nexar_fake_ibv_regs the registrations ever
// made (ibv_reg_mr and ibv_reg_dmabuf_mr that succeeded), for tests of
// registration caching; nexar_fake_ibv_bytes the bytes the NIC moved
// through host, peer-memory and dma-buf registrations.
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#undef ibv_reg_mr
#undef ibv_query_port

#define EXPORT __attribute__((visibility("default")))

// ---- configuration ------------------------------------------------------------

static long env_long(const char* name, long def) {
    const char* s = getenv(name);
    return s && *s ? atol(s) : def;
}

static int env_flag(const char* name, int def) { return env_long(name, def) != 0; }

// ---- live object counts ---------------------------------------------------------

enum { liveCtx, livePD, liveMR, liveCQ, liveQP, liveChan, liveKinds };
static int live[liveKinds];
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;

static void count(int kind, int d) {
    pthread_mutex_lock(&live_mu);
    live[kind] += d;
    pthread_mutex_unlock(&live_mu);
}

static long long regs_made;  // under live_mu

EXPORT long long nexar_fake_ibv_regs(void) {
    pthread_mutex_lock(&live_mu);
    long long n = regs_made;
    pthread_mutex_unlock(&live_mu);
    return n;
}

EXPORT int nexar_fake_ibv_live(int kind) {
    if (kind < 0 || kind >= liveKinds) return -1;
    pthread_mutex_lock(&live_mu);
    int n = live[kind];
    pthread_mutex_unlock(&live_mu);
    return n;
}

// ---- devices ----------------------------------------------------------------------

#define NGID 4

struct fdev {
    struct ibv_device dev;  // first: an ibv_device* points at the fdev
    int link_layer;
    uint64_t guid;  // network byte order, as ibv_get_device_guid returns it
    uint16_t lid;
    enum ibv_mtu mtu;
    int ngid;
    union ibv_gid gid[NGID];
    int gid_type[NGID];
};

static struct fdev devs[2];
static pthread_once_t devs_once = PTHREAD_ONCE_INIT;

static void set_gid(union ibv_gid* g, const uint8_t* prefix, int plen, const uint8_t* tail, int tlen) {
    memset(g, 0, sizeof *g);
    memcpy(g->raw, prefix, plen);
    memcpy(g->raw + 16 - tlen, tail, tlen);
}

static void make_devs(void) {
    struct fdev* r = &devs[0];
    r->dev.node_type = IBV_NODE_CA;
    r->dev.transport_type = IBV_TRANSPORT_IB;
    strcpy(r->dev.name, "fake_roce0");
    strcpy(r->dev.dev_name, "uverbs0");
    strcpy(r->dev.dev_path, "/sys/class/infiniband_verbs/uverbs0");
    strcpy(r->dev.ibdev_path, "/sys/class/infiniband/fake_roce0");
    r->link_layer = IBV_LINK_LAYER_ETHERNET;
    r->guid = __builtin_bswap64(0x0002c90300a1b2c3ull);
    r->mtu = IBV_MTU_1024;
    r->ngid = NGID;
    static const uint8_t ll[8] = {0xfe, 0x80};
    static const uint8_t iid[8] = {0x02, 0x02, 0xc9, 0xff, 0xfe, 0xa1, 0xb2, 0xc3};
    static const uint8_t v4[6] = {0xff, 0xff, 192, 0, 2, 1};
    static const uint8_t none[1] = {0};
    set_gid(&r->gid[0], ll, 8, iid, 8);
    r->gid_type[0] = IBV_GID_TYPE_ROCE_V1;
    set_gid(&r->gid[1], ll, 8, iid, 8);
    r->gid_type[1] = IBV_GID_TYPE_ROCE_V2;
    set_gid(&r->gid[2], none, 1, v4, 6);
    r->gid_type[2] = IBV_GID_TYPE_ROCE_V1;
    set_gid(&r->gid[3], none, 1, v4, 6);
    r->gid_type[3] = IBV_GID_TYPE_ROCE_V2;

    struct fdev* b = &devs[1];
    b->dev.node_type = IBV_NODE_CA;
    b->dev.transport_type = IBV_TRANSPORT_IB;
    strcpy(b->dev.name, "fake_ib0");
    strcpy(b->dev.dev_name, "uverbs1");
    strcpy(b->dev.dev_path, "/sys/class/infiniband_verbs/uverbs1");
    strcpy(b->dev.ibdev_path, "/sys/class/infiniband/fake_ib0");
    b->link_layer = IBV_LINK_LAYER_INFINIBAND;
    b->guid = __builtin_bswap64(0x0002c90300d4e5f6ull);
    b->lid = 0x11;
    b->mtu = IBV_MTU_4096;
    b->ngid = 1;
    static const uint8_t sub[8] = {0xfe, 0x80};
    static const uint8_t bid[8] = {0x00, 0x02, 0xc9, 0x03, 0x00, 0xd4, 0xe5, 0xf6};
    set_gid(&b->gid[0], sub, 8, bid, 8);
    b->gid_type[0] = IBV_GID_TYPE_IB;
}

static struct fdev* fdev_of(struct ibv_context* c) { return (struct fdev*)c->device; }

EXPORT struct ibv_device** ibv_get_device_list(int* num) {
    pthread_once(&devs_once, make_devs);
    const char* sel = getenv("NEXAR_FAKE_IBV_DEVICES");
    if (sel == NULL) sel = "roce,ib";
    struct ibv_device** list = calloc(3, sizeof *list);
    if (list == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    int n = 0;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", sel);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < 2; tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "roce") == 0) list[n++] = &devs[0].dev;
        if (strcmp(tok, "ib") == 0) list[n++] = &devs[1].dev;
    }
    if (num) *num = n;
    return list;
}

EXPORT void ibv_free_device_list(struct ibv_device** list) { free(list); }

EXPORT const char* ibv_get_device_name(struct ibv_device* d) { return d ? d->name : NULL; }

EXPORT __be64 ibv_get_device_guid(struct ibv_device* d) { return ((struct fdev*)d)->guid; }

// ---- contexts and protection domains ------------------------------------------

static int f_poll_cq(struct ibv_cq* cq, int n, struct ibv_wc* wc);
static int f_req_notify_cq(struct ibv_cq* cq, int solicited_only);
static int f_post_send(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad);
static int f_post_recv(struct ibv_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad);

EXPORT struct ibv_context* ibv_open_device(struct ibv_device* d) {
    if (d == NULL) {
        errno = EINVAL;
        return NULL;
    }
    struct ibv_context* c = calloc(1, sizeof *c);
    if (c == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    c->device = d;
    c->cmd_fd = -1;
    c->async_fd = -1;
    c->num_comp_vectors = 1;
    c->abi_compat = NULL;  // a legacy context: inline helpers use the exported calls
    c->ops.poll_cq = f_poll_cq;
    c->ops.req_notify_cq = f_req_notify_cq;
    c->ops.post_send = f_post_send;
    c->ops.post_recv = f_post_recv;
    pthread_mutex_init(&c->mutex, NULL);
    count(liveCtx, 1);
    return c;
}

EXPORT int ibv_close_device(struct ibv_context* c) {
    if (c == NULL) return EINVAL;
    free(c);
    count(liveCtx, -1);
    return 0;
}

EXPORT int ibv_query_device(struct ibv_context* c, struct ibv_device_attr* a) {
    if (c == NULL || a == NULL) return EINVAL;
    struct fdev* d = fdev_of(c);
    memset(a, 0, sizeof *a);
    snprintf(a->fw_ver, sizeof a->fw_ver, "nexar-fake-1");
    a->node_guid = d->guid;
    a->sys_image_guid = d->guid;
    a->max_mr_size = UINT64_MAX;
    a->page_size_cap = 4096;
    a->vendor_id = 0x02c9;
    a->max_qp = 1 << 16;
    a->max_qp_wr = 16384;
    a->max_sge = 4;
    a->max_cq = 1 << 16;
    a->max_cqe = 1 << 20;
    a->max_mr = 1 << 20;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    a->phys_port_cnt = 1;
    return 0;
}

EXPORT int ibv_query_port(struct ibv_context* c, uint8_t port, struct _compat_ibv_port_attr* out) {
    if (c == NULL || out == NULL) return EINVAL;
    if (port != 1) return EINVAL;
    struct fdev* d = fdev_of(c);
    // The legacy call fills the compat layout: the fields up to link_layer.
    struct ibv_port_attr* a = (struct ibv_port_attr*)out;
    int down = env_flag("NEXAR_FAKE_IBV_PORT_DOWN", 0);
    a->state = down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
    a->max_mtu = d->mtu;
    a->active_mtu = d->mtu;
    a->gid_tbl_len = d->ngid;
    a->port_cap_flags = 0;
    a->max_msg_sz = 1u << 31;
    a->pkey_tbl_len = 1;
    a->lid = d->link_layer == IBV_LINK_LAYER_INFINIBAND ? d->lid : 0;
    a->sm_lid = d->link_layer == IBV_LINK_LAYER_INFINIBAND ? 1 : 0;
    a->lmc = 0;
    a->max_vl_num = 1;
    a->active_width = 2;
    a->active_speed = 32;
    a->phys_state = down ? 3 : 5;
    a->link_layer = d->link_layer;
    return 0;
}

EXPORT int ibv_query_gid(struct ibv_context* c, uint8_t port, int index, union ibv_gid* gid) {
    if (c == NULL || gid == NULL || port != 1) return -1;
    struct fdev* d = fdev_of(c);
    if (index < 0 || index >= d->ngid) {
        errno = EINVAL;
        return -1;
    }
    *gid = d->gid[index];
    return 0;
}

EXPORT int _ibv_query_gid_ex(struct ibv_context* c, uint32_t port, uint32_t index, struct ibv_gid_entry* e,
                             uint32_t flags, size_t entry_size) {
    if (c == NULL || e == NULL || port != 1 || flags != 0 || entry_size < sizeof *e) return EINVAL;
    struct fdev* d = fdev_of(c);
    if (index >= (uint32_t)d->ngid) return ENODATA;
    memset(e, 0, sizeof *e);
    e->gid = d->gid[index];
    e->gid_index = index;
    e->port_num = port;
    e->gid_type = d->gid_type[index];
    e->ndev_ifindex = d->link_layer == IBV_LINK_LAYER_ETHERNET ? 1 : 0;
    return 0;
}

struct fpd {
    struct ibv_pd pd;
    int users;  // MRs and QPs made in it
};

static pthread_mutex_t pd_mu = PTHREAD_MUTEX_INITIALIZER;

EXPORT struct ibv_pd* ibv_alloc_pd(struct ibv_context* c) {
    if (c == NULL) {
        errno = EINVAL;
        return NULL;
    }
    struct fpd* p = calloc(1, sizeof *p);
    if (p == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    p->pd.context = c;
    count(livePD, 1);
    return &p->pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd* pd) {
    if (pd == NULL) return EINVAL;
    struct fpd* p = (struct fpd*)pd;
    pthread_mutex_lock(&pd_mu);
    int busy = p->users != 0;
    pthread_mutex_unlock(&pd_mu);
    if (busy) return EBUSY;
    free(p);
    count(livePD, -1);
    return 0;
}

static void pd_use(struct ibv_pd* pd, int d) {
    pthread_mutex_lock(&pd_mu);
    ((struct fpd*)pd)->users += d;
    pthread_mutex_unlock(&pd_mu);
}

// ---- memory regions ---------------------------------------------------------------

// What an MR registers: host memory, fake-CUDA device memory claimed by
// the peer-memory client, or a dma-buf (nexar_fake_ibv_bytes).
enum { mrHost, mrPeerMem, mrDmaBuf, mrKinds };

struct fmr {
    struct ibv_mr mr;
    int kind;
    int access;
    char* base;  // where the fake reaches byte 0 of [mr.addr, mr.addr+length)
    void* map;   // the fake's own mapping (dma-buf, peer memory), or NULL
    size_t maplen;
    int refs;  // in use by the NIC
    struct fmr* next;
};

static pthread_mutex_t mr_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t mr_cv = PTHREAD_COND_INITIALIZER;
static struct fmr* mrs;
static uint32_t next_key;
static long long mr_bytes[mrKinds];  // bytes the NIC reached through MRs of each kind

// nexar_fake_ibv_bytes reports the bytes this process's NIC read or wrote
// through MRs of one kind (0 host memory, 1 peer memory, 2 dma-buf) by
// executing work requests (a receive counts its posted length): tests
// tell by it how device buffers reached the NIC. -1 for another kind.
EXPORT long long nexar_fake_ibv_bytes(int kind) {
    if (kind < 0 || kind >= mrKinds) return -1;
    pthread_mutex_lock(&mr_mu);
    long long n = mr_bytes[kind];
    pthread_mutex_unlock(&mr_mu);
    return n;
}

static uint32_t new_key(void) {
    // Caller holds mr_mu. A random start, so that keys of another run or
    // process do not match by accident.
    if (next_key == 0) {
        if (getrandom(&next_key, sizeof next_key, 0) != sizeof next_key) next_key = (uint32_t)getpid() << 12;
        next_key |= 0x100;
    }
    next_key += 0x100;
    return next_key;
}

// accessible reports whether [addr, addr+n) lies in mappings with the
// protections wanted ('r', and 'w' if write), per /proc/self/maps.
static int accessible(uintptr_t addr, size_t n, int write) {
    FILE* f = fopen("/proc/self/maps", "re");
    if (f == NULL) return 0;
    uintptr_t want = addr, end = addr + n;
    char line[512];
    int ok = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perm[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perm) != 3) continue;
        if (hi <= want || lo > want) continue;
        if (perm[0] != 'r' || (write && perm[1] != 'w')) break;
        want = hi;
        if (want >= end) {
            ok = 1;
            break;
        }
    }
    fclose(f);
    return ok;
}

// The fake CUDA's hook that stands in for nvidia-peermem: the memfd behind
// a device range and the range's offset in it.
typedef int (*export_fn)(const void*, size_t, int*, uint64_t*);

static export_fn cuda_export(void) {
    const char* lib = getenv("NEXAR_CUDART");
    void* h = NULL;
    if (lib && *lib) h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD);
    export_fn f = (export_fn)dlsym(h ? h : RTLD_DEFAULT, "nexar_fake_cuda_export");
    return f;
}

// map_fd maps [off, off+n) of fd for the fake's own use.
static int map_fd(int fd, uint64_t off, size_t n, struct fmr* m) {
    uint64_t pg = off & ~(uint64_t)4095;
    size_t len = (size_t)(off - pg) + n;
    void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)pg);
    if (p == MAP_FAILED) return -1;
    m->map = p;
    m->maplen = len;
    m->base = (char*)p + (off - pg);
    return 0;
}

// pin_shared makes the NIC reach the pages of [addr, addr+n) as they are
// now, as pinning does, where they are a shared mapping: mremap with an
// old size of 0 maps the same pages a second time (it fails for private
// mappings, which the fake then reaches through their address).
static void pin_shared(struct fmr* m, void* addr, size_t n) {
    uintptr_t lo = (uintptr_t)addr & ~(uintptr_t)4095;
    size_t len = ((uintptr_t)addr + n - lo + 4095) & ~(size_t)4095;
    void* p = mremap((void*)lo, 0, len, MREMAP_MAYMOVE);
    if (p == MAP_FAILED) return;
    m->map = p;
    m->maplen = len;
    m->base = (char*)p + ((uintptr_t)addr - lo);
}

static struct ibv_mr* add_mr(struct fmr* m, struct ibv_pd* pd, void* addr, size_t n, int access) {
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = n;
    m->access = access;
    pthread_mutex_lock(&mr_mu);
    m->mr.lkey = new_key();
    m->mr.rkey = m->mr.lkey ^ 0x5a000000u;
    m->mr.handle = m->mr.lkey;
    m->next = mrs;
    mrs = m;
    pthread_mutex_unlock(&mr_mu);
    pd_use(pd, 1);
    count(liveMR, 1);
    pthread_mutex_lock(&live_mu);
    regs_made++;
    pthread_mutex_unlock(&live_mu);
    return &m->mr;
}

static int bad_access(int access) {
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) return 1;
    return 0;
}

EXPORT struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t n, int access) {
    if (pd == NULL || n == 0 || bad_access(access)) {
        errno = EINVAL;
        return NULL;
    }
    struct fmr* m = calloc(1, sizeof *m);
    if (m == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    if (accessible((uintptr_t)addr, n, access & IBV_ACCESS_LOCAL_WRITE)) {
        m->base = addr;
        pin_shared(m, addr, n);
        return add_mr(m, pd, addr, n, access);
    }
    // Not host memory the process can touch: get_user_pages fails, unless
    // a peer-memory client (nvidia-peermem) claims the range.
    if (env_flag("NEXAR_FAKE_IBV_PEERMEM", 0)) {
        export_fn ex = cuda_export();
        int fd = -1;
        uint64_t off = 0;
        if (ex && ex(addr, n, &fd, &off) == 0) {
            int rc = map_fd(fd, off, n, m);
            close(fd);
            m->kind = mrPeerMem;
            if (rc == 0) return add_mr(m, pd, addr, n, access);
        }
    }
    free(m);
    errno = EFAULT;
    return NULL;
}

EXPORT struct ibv_mr* ibv_reg_dmabuf_mr(struct ibv_pd* pd, uint64_t offset, size_t n, uint64_t iova, int fd,
                                        int access) {
    if (!env_flag("NEXAR_FAKE_IBV_DMABUF", 1)) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (pd == NULL || n == 0 || bad_access(access)) {
        errno = EINVAL;
        return NULL;
    }
    // Only the fake CUDA's device memory is a dma-buf here.
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, target, sizeof target - 1);
    struct stat st;
    if (k < 0 || fstat(fd, &st) != 0) {
        errno = EBADF;
        return NULL;
    }
    target[k] = 0;
    // The fake CUDA's dma-buf of a range is its allocation's memfd,
    // positioned at the range's start.
    off_t pos = lseek(fd, 0, SEEK_CUR);
    if (strncmp(target, "/memfd:fake-cuda-device", 23) != 0 || pos < 0 ||
        (uint64_t)pos + offset + n > (uint64_t)st.st_size) {
        errno = EINVAL;
        return NULL;
    }
    struct fmr* m = calloc(1, sizeof *m);
    if (m == NULL || map_fd(fd, (uint64_t)pos + offset, n, m) != 0) {
        free(m);
        errno = ENOMEM;
        return NULL;
    }
    m->kind = mrDmaBuf;
    return add_mr(m, pd, (void*)(uintptr_t)iova, n, access);
}

EXPORT int ibv_dereg_mr(struct ibv_mr* mr) {
    if (mr == NULL) return EINVAL;
    struct fmr* m = (struct fmr*)mr;
    pthread_mutex_lock(&mr_mu);
    struct fmr** pp = &mrs;
    while (*pp && *pp != m) pp = &(*pp)->next;
    if (*pp == NULL) {
        pthread_mutex_unlock(&mr_mu);
        return EINVAL;
    }
    *pp = m->next;
    while (m->refs > 0) pthread_cond_wait(&mr_cv, &mr_mu);  // the NIC is using it
    pthread_mutex_unlock(&mr_mu);
    if (m->map) munmap(m->map, m->maplen);
    pd_use(mr->pd, -1);
    free(m);
    count(liveMR, -1);
    return 0;
}

// mr_get finds the MR for key (lkey, or rkey when remote) in pd that covers
// [addr, addr+n) with access, takes a reference and returns where the fake
// reaches addr; NULL when there is none.
static struct fmr* mr_get(uint32_t key, int remote, struct ibv_pd* pd, uint64_t addr, uint64_t n, int access,
                          char** at) {
    pthread_mutex_lock(&mr_mu);
    struct fmr* m = mrs;
    for (; m; m = m->next) {
        if ((remote ? m->mr.rkey : m->mr.lkey) == key) break;
    }
    uintptr_t lo = m ? (uintptr_t)m->mr.addr : 0;
    if (m == NULL || m->mr.pd != pd || (m->access & access) != access || addr < lo || n > m->mr.length ||
        addr - lo > m->mr.length - n) {
        pthread_mutex_unlock(&mr_mu);
        return NULL;
    }
    m->refs++;
    mr_bytes[m->kind] += (long long)n;
    pthread_mutex_unlock(&mr_mu);
    *at = m->base + (addr - lo);
    return m;
}

static void mr_put(struct fmr* m) {
    if (m == NULL) return;
    pthread_mutex_lock(&mr_mu);
    if (--m->refs == 0) pthread_cond_broadcast(&mr_cv);
    pthread_mutex_unlock(&mr_mu);
}

// ---- completion channels and queues ----------------------------------------------

struct fchan {
    struct ibv_comp_channel ch;  // ch.fd: the pipe's read end
    int wfd;
};

static pthread_mutex_t chan_mu = PTHREAD_MUTEX_INITIALIZER;

EXPORT struct ibv_comp_channel* ibv_create_comp_channel(struct ibv_context* c) {
    if (c == NULL) {
        errno = EINVAL;
        return NULL;
    }
    struct fchan* f = calloc(1, sizeof *f);
    int p[2];
    if (f == NULL || pipe2(p, O_CLOEXEC) != 0) {
        free(f);
        errno = ENOMEM;
        return NULL;
    }
    f->ch.context = c;
    f->ch.fd = p[0];
    f->wfd = p[1];
    count(liveChan, 1);
    return &f->ch;
}

EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel* ch) {
    if (ch == NULL) return EINVAL;
    struct fchan* f = (struct fchan*)ch;
    pthread_mutex_lock(&chan_mu);
    int busy = ch->refcnt != 0;
    pthread_mutex_unlock(&chan_mu);
    if (busy) return EBUSY;
    close(f->ch.fd);
    close(f->wfd);
    free(f);
    count(liveChan, -1);
    return 0;
}

struct fcq {
    struct ibv_cq cq;
    pthread_mutex_t mu;
    struct ibv_wc* wc;
    int cap, head, n;
    int armed, overflow;
    unsigned delivered, acked;  // events read from the channel / acknowledged
    uint64_t id;                // tells a live CQ from a freed one at the same address
    struct fcq* next;
};

// Live CQs, so that an event still in a channel's pipe for a destroyed CQ
// is dropped, as the kernel drops it.
static pthread_mutex_t cqs_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fcq* cqs;
static uint64_t next_cq_id;

struct cq_event {
    struct fcq* cq;
    uint64_t id;
};

// notify writes an event for q to its channel. Caller holds q->mu.
static void notify(struct fcq* q) {
    if (q->cq.channel == NULL) return;
    struct cq_event ev = {q, q->id};
    ssize_t k = write(((struct fchan*)q->cq.channel)->wfd, &ev, sizeof ev);
    (void)k;  // a full pipe holds wake-ups enough
}

// cq_push adds a completion. Caller may hold the QP's lock, never the CQ's.
static void cq_push(struct ibv_cq* cq, const struct ibv_wc* wc) {
    struct fcq* q = (struct fcq*)cq;
    pthread_mutex_lock(&q->mu);
    if (q->overflow) {
        pthread_mutex_unlock(&q->mu);
        return;
    }
    if (q->n == q->cap) {
        q->overflow = 1;  // CQ overrun: the consumer finds poll failing
        notify(q);
        pthread_mutex_unlock(&q->mu);
        return;
    }
    q->wc[(q->head + q->n) % q->cap] = *wc;
    q->n++;
    if (q->armed) {
        q->armed = 0;
        notify(q);
    }
    pthread_mutex_unlock(&q->mu);
}

EXPORT struct ibv_cq* ibv_create_cq(struct ibv_context* c, int cqe, void* cq_context, struct ibv_comp_channel* ch,
                                    int comp_vector) {
    if (c == NULL || cqe < 1 || cqe > (1 << 20) || comp_vector != 0) {
        errno = EINVAL;
        return NULL;
    }
    struct fcq* q = calloc(1, sizeof *q);
    if (q == NULL || (q->wc = calloc((size_t)cqe, sizeof *q->wc)) == NULL) {
        free(q);
        errno = ENOMEM;
        return NULL;
    }
    q->cq.context = c;
    q->cq.channel = ch;
    q->cq.cq_context = cq_context;
    q->cq.cqe = cqe;
    pthread_mutex_init(&q->cq.mutex, NULL);
    pthread_cond_init(&q->cq.cond, NULL);
    pthread_mutex_init(&q->mu, NULL);
    q->cap = cqe;
    if (ch) {
        pthread_mutex_lock(&chan_mu);
        ch->refcnt++;
        pthread_mutex_unlock(&chan_mu);
    }
    pthread_mutex_lock(&cqs_mu);
    q->id = ++next_cq_id;
    q->next = cqs;
    cqs = q;
    pthread_mutex_unlock(&cqs_mu);
    count(liveCQ, 1);
    return &q->cq;
}

struct fqp;
static int cq_in_use(struct ibv_cq* cq);

EXPORT int ibv_destroy_cq(struct ibv_cq* cq) {
    if (cq == NULL) return EINVAL;
    struct fcq* q = (struct fcq*)cq;
    if (cq_in_use(cq)) return EBUSY;
    pthread_mutex_lock(&q->mu);
    unsigned unacked = q->delivered - q->acked;
    pthread_mutex_unlock(&q->mu);
    if (unacked) {
        fprintf(stderr, "fake libibverbs: ibv_destroy_cq with %u completion events not acknowledged "
                        "(libibverbs would wait for ibv_ack_cq_events forever)\n", unacked);
        return EBUSY;
    }
    pthread_mutex_lock(&cqs_mu);
    struct fcq** pp = &cqs;
    while (*pp && *pp != q) pp = &(*pp)->next;
    if (*pp) *pp = q->next;
    pthread_mutex_unlock(&cqs_mu);
    if (cq->channel) {
        pthread_mutex_lock(&chan_mu);
        cq->channel->refcnt--;
        pthread_mutex_unlock(&chan_mu);
    }
    free(q->wc);
    free(q);
    count(liveCQ, -1);
    return 0;
}

static int f_poll_cq(struct ibv_cq* cq, int n, struct ibv_wc* wc) {
    struct fcq* q = (struct fcq*)cq;
    pthread_mutex_lock(&q->mu);
    if (q->overflow) {
        pthread_mutex_unlock(&q->mu);
        return -1;
    }
    int k = 0;
    for (; k < n && q->n > 0; k++) {
        wc[k] = q->wc[q->head];
        q->head = (q->head + 1) % q->cap;
        q->n--;
    }
    pthread_mutex_unlock(&q->mu);
    return k;
}

static int f_req_notify_cq(struct ibv_cq* cq, int solicited_only) {
    (void)solicited_only;
    struct fcq* q = (struct fcq*)cq;
    pthread_mutex_lock(&q->mu);
    q->armed = 1;  // the next completion, not one already there, fires
    pthread_mutex_unlock(&q->mu);
    return 0;
}

EXPORT int ibv_get_cq_event(struct ibv_comp_channel* ch, struct ibv_cq** cq, void** cq_context) {
    for (;;) {
        struct cq_event ev;
        ssize_t k = read(ch->fd, &ev, sizeof ev);
        if (k != (ssize_t)sizeof ev) {
            if (k >= 0) errno = EIO;
            return -1;
        }
        pthread_mutex_lock(&cqs_mu);
        struct fcq* q = cqs;
        while (q && !(q == ev.cq && q->id == ev.id)) q = q->next;
        if (q) {
            pthread_mutex_lock(&q->mu);
            q->delivered++;
            pthread_mutex_unlock(&q->mu);
        }
        pthread_mutex_unlock(&cqs_mu);
        if (q == NULL) continue;  // for a CQ destroyed since
        *cq = &q->cq;
        *cq_context = q->cq.cq_context;
        return 0;
    }
}

EXPORT void ibv_ack_cq_events(struct ibv_cq* cq, unsigned int n) {
    struct fcq* q = (struct fcq*)cq;
    pthread_mutex_lock(&q->mu);
    q->acked += n;
    pthread_mutex_unlock(&q->mu);
}

// ---- queue pairs ------------------------------------------------------------------

#define MAXSGE 4
#define MAXWR 16384

struct swr {
    uint64_t wr_id;
    int opcode;
    unsigned flags;
    int nsge;
    struct ibv_sge sge[MAXSGE];
    uint64_t raddr;
    uint32_t rkey;
    uint32_t imm;
};

struct rwr {
    uint64_t wr_id;
    int nsge;
    struct ibv_sge sge[MAXSGE];
};

struct fqp {
    struct ibv_qp qp;
    pthread_mutex_t mu;  // before any CQ's lock
    pthread_cond_t cv;
    struct ibv_qp_cap cap;
    int access;
    int sig_all;  // sq_sig_all: every send WR completes with a CQE
    // RTR
    uint32_t dest_qpn;
    enum ibv_mtu mtu;
    uint16_t dlid;
    int is_global;
    uint8_t sgid_index;
    union ibv_gid dgid;
    uint8_t min_rnr_timer;
    uint32_t rq_psn;
    // RTS
    uint8_t timeout, retry_cnt, rnr_retry;
    uint32_t sq_psn;
    struct swr* sq;
    int sq_head, sq_n;
    struct rwr* rq;
    int rq_head, rq_n;
    int lfd, ofd, ifd;  // listening socket, requester's and responder's connections
    int quit;
    unsigned gen;  // bumped by RESET: work in flight from before is dropped
    uint64_t next_seq, expect_seq;
    pthread_t req_thr, resp_thr;
    char path[sizeof(((struct sockaddr_un*)0)->sun_path)];
    struct fqp* next;
};

static pthread_mutex_t qps_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fqp* qps;

static int cq_in_use(struct ibv_cq* cq) {
    pthread_mutex_lock(&qps_mu);
    struct fqp* q = qps;
    while (q && q->qp.send_cq != cq && q->qp.recv_cq != cq) q = q->next;
    pthread_mutex_unlock(&qps_mu);
    return q != NULL;
}

static struct fdev* qdev(struct fqp* q) { return fdev_of(q->qp.context); }

// The wire between QPs (one Unix stream socket per direction).

#define HELLO_MAGIC 0x3130564249465846ull  // "FXFIBV01"

struct hello {
    uint64_t magic;
    uint32_t src_qpn, dst_qpn;
    uint16_t src_lid, dst_lid;
    uint32_t link_layer;
    uint32_t sgid_type;
    uint32_t is_global;
    uint8_t src_gid[16], dst_gid[16];
};

enum { opSend = 1, opSendImm, opWrite, opWriteImm };

struct req {
    uint32_t op;
    uint32_t imm;
    uint64_t seq;
    uint64_t len;
    uint64_t raddr;
    uint32_t rkey;
    uint32_t pad;
};

enum { ackOK = 0, nakRNR, nakAccess, nakInv, nakOp };

struct resp {
    uint32_t status;
    uint32_t rnr_timer;
    uint64_t seq;
};

static void sock_dir(char* out, size_t n) {
    const char* d = getenv("NEXAR_FAKE_IBV_DIR");
    if (d && *d) {
        snprintf(out, n, "%s", d);
    } else {
        snprintf(out, n, "/tmp/nexar-fake-ibv-%u", (unsigned)getuid());
    }
    mkdir(out, 0700);
}

static int qp_addr(uint32_t qpn, struct sockaddr_un* sa) {
    char dir[sizeof sa->sun_path];
    sock_dir(dir, sizeof dir);
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int k = snprintf(sa->sun_path, sizeof sa->sun_path, "%s/qp-%06x", dir, qpn);
    return k < 0 || (size_t)k >= sizeof sa->sun_path ? -1 : 0;
}

// sweep removes the sockets of QPs whose process died without destroying
// them (nobody accepts on them any more); once per process.
static void sweep(void) {
    char dir[sizeof(((struct sockaddr_un*)0)->sun_path)];
    sock_dir(dir, sizeof dir);
    DIR* d = opendir(dir);
    if (d == NULL) return;
    for (struct dirent* de; (de = readdir(d)) != NULL;) {
        unsigned qpn;
        struct sockaddr_un sa;
        if (sscanf(de->d_name, "qp-%6x", &qpn) != 1 || qp_addr(qpn, &sa) != 0) continue;
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) break;
        if (connect(fd, (struct sockaddr*)&sa, sizeof sa) != 0 && errno == ECONNREFUSED) unlink(sa.sun_path);
        close(fd);
    }
    closedir(d);
}

static pthread_once_t sweep_once = PTHREAD_ONCE_INIT;

// qp_listen binds the QP's socket under a fresh random QPN (a name left by
// a dead process is reused). The socket is bound under a name of its own
// and listens before it takes its QP name (a hard link): a QP name that
// refuses a connection therefore belongs to a dead process, and sweep or a
// colliding QPN never removes the name of a QP still being made.
static int qp_listen(struct fqp* q) {
    pthread_once(&sweep_once, sweep);
    static unsigned seq;
    char dir[sizeof(((struct sockaddr_un*)0)->sun_path)];
    sock_dir(dir, sizeof dir);
    for (int tries = 0; tries < 64; tries++) {
        uint32_t qpn;
        if (getrandom(&qpn, sizeof qpn, 0) != sizeof qpn) qpn = (uint32_t)rand();
        qpn = 0x100 + qpn % (0xffffff - 0x100);
        struct sockaddr_un sa, tmp;
        if (qp_addr(qpn, &sa) != 0) return -1;
        memset(&tmp, 0, sizeof tmp);
        tmp.sun_family = AF_UNIX;
        int k = snprintf(tmp.sun_path, sizeof tmp.sun_path, "%s/new-%d-%u", dir, (int)getpid(),
                         __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));
        if (k < 0 || (size_t)k >= sizeof tmp.sun_path) return -1;
        unlink(tmp.sun_path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return -1;
        if (bind(fd, (struct sockaddr*)&tmp, sizeof tmp) != 0 || listen(fd, 8) != 0) {
            close(fd);
            unlink(tmp.sun_path);
            return -1;
        }
        int rc = link(tmp.sun_path, sa.sun_path);
        if (rc != 0 && errno == EEXIST) {
            int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (c >= 0 && connect(c, (struct sockaddr*)&sa, sizeof sa) != 0 && errno == ECONNREFUSED) {
                unlink(sa.sun_path);  // stale: its process is gone
                rc = link(tmp.sun_path, sa.sun_path);
            }
            if (c >= 0) close(c);
        }
        unlink(tmp.sun_path);
        if (rc != 0) {
            close(fd);
            continue;
        }
        q->lfd = fd;
        q->qp.qp_num = qpn;
        snprintf(q->path, sizeof q->path, "%s", sa.sun_path);
        return 0;
    }
    return -1;
}

static int io_wait(int fd, short ev, long ms) {
    struct pollfd p = {fd, ev, 0};
    for (;;) {
        int r = poll(&p, 1, (int)ms);
        if (r < 0 && errno == EINTR) continue;
        return r;
    }
}

static int send_all(int fd, const void* b, size_t n, long ms) {
    const char* p = b;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) {
            if (io_wait(fd, POLLOUT, ms) <= 0) return -1;
            continue;
        }
        return -1;
    }
    return 0;
}

// recv_all reads n bytes; ms < 0 waits as long as it takes.
static int recv_all(int fd, void* b, size_t n, long ms) {
    char* p = b;
    while (n > 0) {
        if (ms >= 0 && io_wait(fd, POLLIN, ms) <= 0) return -1;
        ssize_t k = recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        return -1;
    }
    return 0;
}

static int drain(int fd, uint64_t n) {
    char buf[16384];
    while (n > 0) {
        size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
        if (recv_all(fd, buf, k, -1) != 0) return -1;
        n -= k;
    }
    return 0;
}

// IB's local ACK timeout, 4.096 us * 2^timeout (0: none), but at least
// 200 ms so that a loaded test host is not taken for a dead peer.
static long timeout_ms(uint8_t t) {
    if (t == 0) return 60000;
    double ms = 4.096e-3 * (double)(1ull << (t > 31 ? 31 : t));
    return ms < 200 ? 200 : (long)ms;
}

// IB's RNR NAK timer encoding, in microseconds (table 45 of the spec).
static long rnr_us(uint8_t v) {
    static const long t[32] = {655360, 10,    20,    30,    40,    60,    80,     120,    160,    240,   320,
                               480,    640,   960,   1280,  1920,  2560,  3840,   5120,   7680,   10240, 15360,
                               20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
    return t[v & 31];
}

// nap sleeps up to us microseconds, less if the QP is being destroyed, and
// reports whether it is.
static int nap(struct fqp* q, long us) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += us / 1000000;
    ts.tv_nsec += (us % 1000000) * 1000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&q->mu);
    while (!q->quit && pthread_cond_timedwait(&q->cv, &q->mu, &ts) == 0) {
    }
    int quit = q->quit;
    pthread_mutex_unlock(&q->mu);
    return quit;
}

static void push_wc(struct ibv_cq* cq, struct fqp* q, uint64_t wr_id, int status, int opcode, uint32_t len,
                    int with_imm, uint32_t imm) {
    struct ibv_wc wc;
    memset(&wc, 0, sizeof wc);
    wc.wr_id = wr_id;
    wc.status = status;
    wc.opcode = opcode;
    wc.byte_len = len;
    wc.qp_num = q->qp.qp_num;
    wc.src_qp = q->dest_qpn;
    if (with_imm) {
        wc.wc_flags = IBV_WC_WITH_IMM;
        wc.imm_data = imm;
    }
    cq_push(cq, &wc);
}

static int send_opcode(int op) {
    return op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RDMA_WRITE : IBV_WC_SEND;
}

// to_err moves q to the error state and flushes its receive queue (the
// requester thread flushes the send queue). Caller holds q->mu.
static void to_err(struct fqp* q) {
    if (q->qp.state == IBV_QPS_ERR) return;
    q->qp.state = IBV_QPS_ERR;
    for (; q->rq_n > 0; q->rq_n--) {
        push_wc(q->qp.recv_cq, q, q->rq[q->rq_head].wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0);
        q->rq_head = (q->rq_head + 1) % (int)q->cap.max_recv_wr;
    }
    pthread_cond_broadcast(&q->cv);
}

// connect_peer opens the requester's connection to the destination QP,
// routed as the address vector says.
static int connect_peer(struct fqp* q, long ms) {
    struct fdev* d = qdev(q);
    struct hello h;
    memset(&h, 0, sizeof h);
    h.magic = HELLO_MAGIC;
    pthread_mutex_lock(&q->mu);
    h.src_qpn = q->qp.qp_num;
    h.dst_qpn = q->dest_qpn;
    h.src_lid = d->link_layer == IBV_LINK_LAYER_INFINIBAND ? d->lid : 0;
    h.dst_lid = q->dlid;
    h.link_layer = (uint32_t)d->link_layer;
    h.is_global = (uint32_t)q->is_global;
    if (q->is_global) {
        memcpy(h.src_gid, d->gid[q->sgid_index].raw, 16);
        h.sgid_type = (uint32_t)d->gid_type[q->sgid_index];
        memcpy(h.dst_gid, q->dgid.raw, 16);
    }
    pthread_mutex_unlock(&q->mu);
    struct sockaddr_un sa;
    if (qp_addr(h.dst_qpn, &sa) != 0) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    uint64_t ack = 0;
    if (connect(fd, (struct sockaddr*)&sa, sizeof sa) != 0 || send_all(fd, &h, sizeof h, ms) != 0 ||
        recv_all(fd, &ack, sizeof ack, ms) != 0 || ack != HELLO_MAGIC) {
        close(fd);
        return -1;
    }
    pthread_mutex_lock(&q->mu);
    if (q->quit) {
        pthread_mutex_unlock(&q->mu);
        close(fd);
        return -1;
    }
    q->ofd = fd;
    pthread_mutex_unlock(&q->mu);
    return fd;
}

static void drop_conn(struct fqp* q) {
    pthread_mutex_lock(&q->mu);
    if (q->ofd >= 0) {
        close(q->ofd);
        q->ofd = -1;
    }
    pthread_mutex_unlock(&q->mu);
}

// aborted reports whether work taken at generation gen must stop.
static int aborted(struct fqp* q, unsigned gen) {
    pthread_mutex_lock(&q->mu);
    int a = q->quit || q->gen != gen || q->qp.state == IBV_QPS_ERR;
    pthread_mutex_unlock(&q->mu);
    return a;
}

// execute carries out one send work request and returns its status.
static int execute(struct fqp* q, const struct swr* w, unsigned gen, uint32_t* bytes) {
    struct fmr* held[MAXSGE] = {0};
    char* at[MAXSGE] = {0};
    uint64_t total = 0;
    int st = IBV_WC_SUCCESS;
    for (int i = 0; i < w->nsge; i++) {
        if (w->sge[i].length == 0) continue;
        held[i] = mr_get(w->sge[i].lkey, 0, q->qp.pd, w->sge[i].addr, w->sge[i].length, 0, &at[i]);
        if (held[i] == NULL) st = IBV_WC_LOC_PROT_ERR;
        total += w->sge[i].length;
    }
    if (st == IBV_WC_SUCCESS && total > (1ull << 31)) st = IBV_WC_LOC_LEN_ERR;
    struct req r = {0};
    switch (w->opcode) {
        case IBV_WR_SEND:
            r.op = opSend;
            break;
        case IBV_WR_SEND_WITH_IMM:
            r.op = opSendImm;
            break;
        case IBV_WR_RDMA_WRITE:
            r.op = opWrite;
            break;
        default:
            r.op = opWriteImm;
    }
    r.imm = w->imm;
    r.len = total;
    r.raddr = w->raddr;
    r.rkey = w->rkey;
    pthread_mutex_lock(&q->mu);
    r.seq = q->next_seq;
    long tmo = timeout_ms(q->timeout);
    int retry_cnt = q->retry_cnt, rnr_retry = q->rnr_retry;
    pthread_mutex_unlock(&q->mu);
    int retries = 0, rnrs = 0;
    while (st == IBV_WC_SUCCESS) {
        if (aborted(q, gen)) {
            st = IBV_WC_WR_FLUSH_ERR;
            break;
        }
        pthread_mutex_lock(&q->mu);
        int fd = q->ofd;
        pthread_mutex_unlock(&q->mu);
        if (fd < 0) fd = connect_peer(q, tmo);
        struct resp rs;
        int ok = fd >= 0 && send_all(fd, &r, sizeof r, tmo) == 0;
        for (int i = 0; ok && i < w->nsge; i++) {
            if (held[i]) ok = send_all(fd, at[i], w->sge[i].length, tmo) == 0;
        }
        ok = ok && recv_all(fd, &rs, sizeof rs, tmo) == 0 && rs.seq == r.seq;
        if (!ok) {  // no answer: transport retry
            drop_conn(q);
            if (++retries > retry_cnt) {
                st = IBV_WC_RETRY_EXC_ERR;
                break;
            }
            if (nap(q, tmo * 1000)) st = IBV_WC_WR_FLUSH_ERR;
            continue;
        }
        switch (rs.status) {
            case ackOK:
                pthread_mutex_lock(&q->mu);
                q->next_seq++;
                pthread_mutex_unlock(&q->mu);
                *bytes = (uint32_t)total;
                goto done;
            case nakRNR:
                if (rnr_retry != 7 && ++rnrs > rnr_retry) {
                    st = IBV_WC_RNR_RETRY_EXC_ERR;
                } else if (nap(q, rnr_us((uint8_t)rs.rnr_timer))) {
                    st = IBV_WC_WR_FLUSH_ERR;
                }
                break;
            case nakAccess:
                st = IBV_WC_REM_ACCESS_ERR;
                break;
            case nakInv:
                st = IBV_WC_REM_INV_REQ_ERR;
                break;
            default:
                st = IBV_WC_REM_OP_ERR;
        }
    }
done:
    for (int i = 0; i < w->nsge; i++) mr_put(held[i]);
    return st;
}

static void* requester(void* arg) {
    struct fqp* q = arg;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->quit && (q->sq_n == 0 || (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR))) {
            pthread_cond_wait(&q->cv, &q->mu);
        }
        if (q->quit) break;
        int cap = (int)q->cap.max_send_wr;
        if (q->qp.state == IBV_QPS_ERR) {
            for (; q->sq_n > 0; q->sq_n--) {
                struct swr* w = &q->sq[q->sq_head];
                push_wc(q->qp.send_cq, q, w->wr_id, IBV_WC_WR_FLUSH_ERR, send_opcode(w->opcode), 0, 0, 0);
                q->sq_head = (q->sq_head + 1) % cap;
            }
            continue;
        }
        struct swr w = q->sq[q->sq_head];
        unsigned gen = q->gen;
        pthread_mutex_unlock(&q->mu);
        uint32_t bytes = 0;
        int st = execute(q, &w, gen, &bytes);
        pthread_mutex_lock(&q->mu);
        if (q->quit) break;
        if (q->gen != gen || q->sq_n == 0) continue;  // reset meanwhile: dropped
        if (q->qp.state == IBV_QPS_ERR) continue;     // flushed with the rest
        q->sq_head = (q->sq_head + 1) % cap;
        q->sq_n--;
        if (st != IBV_WC_SUCCESS) {
            push_wc(q->qp.send_cq, q, w.wr_id, st, send_opcode(w.opcode), 0, 0, 0);
            to_err(q);
        } else if (w.flags & IBV_SEND_SIGNALED || q->sig_all) {
            push_wc(q->qp.send_cq, q, w.wr_id, IBV_WC_SUCCESS, send_opcode(w.opcode), bytes, 0, 0);
        }
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

// hello_ok checks an incoming connection as the fabric and the responder
// would: it must reach this port's address and come from the connected QP.
static int hello_ok(struct fqp* q, const struct hello* h) {
    struct fdev* d = qdev(q);
    pthread_mutex_lock(&q->mu);
    int ok = h->magic == HELLO_MAGIC && h->dst_qpn == q->qp.qp_num && h->src_qpn == q->dest_qpn &&
             (q->qp.state == IBV_QPS_RTR || q->qp.state == IBV_QPS_RTS) && h->link_layer == (uint32_t)d->link_layer;
    if (ok && d->link_layer == IBV_LINK_LAYER_INFINIBAND) {
        ok = h->dst_lid == d->lid && q->dlid == h->src_lid;
    } else if (ok) {
        int found = 0;
        for (int i = 0; i < d->ngid; i++) {
            if (memcmp(d->gid[i].raw, h->dst_gid, 16) == 0 && (uint32_t)d->gid_type[i] == h->sgid_type) found = 1;
        }
        // Both ends must speak the same RoCE version: the responder's
        // acknowledgements go out with its own GID's type.
        ok = h->is_global && found && memcmp(q->dgid.raw, h->src_gid, 16) == 0 && q->is_global &&
             (uint32_t)d->gid_type[q->sgid_index] == h->sgid_type;
    }
    pthread_mutex_unlock(&q->mu);
    return ok;
}

static int respond(int fd, uint32_t status, uint32_t rnr, uint64_t seq) {
    struct resp rs = {status, rnr, seq};
    return send_all(fd, &rs, sizeof rs, 5000);
}

// consume_rq takes the receive WR at the head if it is still wr_id of
// generation gen; caller holds q->mu.
static int consume_rq(struct fqp* q, unsigned gen, uint64_t wr_id) {
    if (q->gen != gen || q->rq_n == 0 || q->rq[q->rq_head].wr_id != wr_id) return 0;
    q->rq_head = (q->rq_head + 1) % (int)q->cap.max_recv_wr;
    q->rq_n--;
    return 1;
}

// serve answers the requests of one connection until it ends.
static void serve(struct fqp* q, int fd) {
    struct hello h;
    if (recv_all(fd, &h, sizeof h, 2000) != 0 || !hello_ok(q, &h)) return;  // dropped, as by the fabric
    uint64_t ack = HELLO_MAGIC;
    if (send_all(fd, &ack, sizeof ack, 2000) != 0) return;
    for (;;) {
        struct req r;
        if (recv_all(fd, &r, sizeof r, -1) != 0 || r.len > (1ull << 31)) return;
        pthread_mutex_lock(&q->mu);
        int st = q->qp.state;
        unsigned gen = q->gen;
        uint64_t expect = q->expect_seq;
        int access = q->access;
        uint8_t rnr = q->min_rnr_timer;
        pthread_mutex_unlock(&q->mu);
        if (st != IBV_QPS_RTR && st != IBV_QPS_RTS) return;  // silently dropped
        if (r.seq < expect) {                                 // a retransmission of what was done
            if (drain(fd, r.len) != 0 || respond(fd, ackOK, 0, r.seq) != 0) return;
            continue;
        }
        if (r.seq > expect) {
            drain(fd, r.len);
            pthread_mutex_lock(&q->mu);
            to_err(q);
            pthread_mutex_unlock(&q->mu);
            respond(fd, nakInv, 0, r.seq);
            return;
        }
        int imm = r.op == opSendImm || r.op == opWriteImm;
        struct rwr w = {0};
        if (r.op == opSend || imm) {  // consumes a receive
            pthread_mutex_lock(&q->mu);
            int have = q->rq_n > 0 && q->gen == gen;
            if (have) w = q->rq[q->rq_head];
            pthread_mutex_unlock(&q->mu);
            if (!have) {
                if (drain(fd, r.len) != 0 || respond(fd, nakRNR, rnr, r.seq) != 0) return;
                continue;
            }
        }
        if (r.op == opWrite || r.op == opWriteImm) {
            struct fmr* m = NULL;
            char* at = NULL;
            if (r.len > 0) m = mr_get(r.rkey, 1, q->qp.pd, r.raddr, r.len, IBV_ACCESS_REMOTE_WRITE, &at);
            if (!(access & IBV_ACCESS_REMOTE_WRITE) || (r.len > 0 && m == NULL)) {
                mr_put(m);
                drain(fd, r.len);
                pthread_mutex_lock(&q->mu);
                to_err(q);
                pthread_mutex_unlock(&q->mu);
                respond(fd, nakAccess, 0, r.seq);
                return;
            }
            int got = r.len == 0 || recv_all(fd, at, r.len, -1) == 0;
            mr_put(m);
            if (!got) return;  // cut mid-message: the bytes landed, nothing completed
            pthread_mutex_lock(&q->mu);
            if (r.op == opWriteImm && consume_rq(q, gen, w.wr_id)) {
                push_wc(q->qp.recv_cq, q, w.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, (uint32_t)r.len, 1, r.imm);
            }
            q->expect_seq++;
            pthread_mutex_unlock(&q->mu);
            if (respond(fd, ackOK, 0, r.seq) != 0) return;
            continue;
        }
        // SEND: scatter into the receive's SGEs.
        struct fmr* held[MAXSGE] = {0};
        char* at[MAXSGE] = {0};
        uint64_t room = 0;
        int status = IBV_WC_SUCCESS;
        for (int i = 0; i < w.nsge; i++) {
            if (w.sge[i].length == 0) continue;
            held[i] = mr_get(w.sge[i].lkey, 0, q->qp.pd, w.sge[i].addr, w.sge[i].length, IBV_ACCESS_LOCAL_WRITE, &at[i]);
            if (held[i] == NULL) status = IBV_WC_LOC_PROT_ERR;
            room += w.sge[i].length;
        }
        if (status == IBV_WC_SUCCESS && r.len > room) status = IBV_WC_LOC_LEN_ERR;
        if (status != IBV_WC_SUCCESS) {
            for (int i = 0; i < w.nsge; i++) mr_put(held[i]);
            drain(fd, r.len);
            pthread_mutex_lock(&q->mu);
            if (consume_rq(q, gen, w.wr_id)) push_wc(q->qp.recv_cq, q, w.wr_id, status, IBV_WC_RECV, 0, 0, 0);
            to_err(q);
            pthread_mutex_unlock(&q->mu);
            respond(fd, status == IBV_WC_LOC_LEN_ERR ? nakInv : nakOp, 0, r.seq);
            return;
        }
        uint64_t left = r.len;
        int got = 1;
        for (int i = 0; got && left > 0 && i < w.nsge; i++) {
            uint64_t k = left < w.sge[i].length ? left : w.sge[i].length;
            if (k > 0) got = recv_all(fd, at[i], k, -1) == 0;
            left -= k;
        }
        for (int i = 0; i < w.nsge; i++) mr_put(held[i]);
        if (!got) return;
        pthread_mutex_lock(&q->mu);
        if (consume_rq(q, gen, w.wr_id)) {
            push_wc(q->qp.recv_cq, q, w.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, (uint32_t)r.len, imm, r.imm);
        }
        q->expect_seq++;
        pthread_mutex_unlock(&q->mu);
        if (respond(fd, ackOK, 0, r.seq) != 0) return;
    }
}

static void* responder(void* arg) {
    struct fqp* q = arg;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        int quit = q->quit, lfd = q->lfd;
        pthread_mutex_unlock(&q->mu);
        if (quit) return NULL;
        if (io_wait(lfd, POLLIN, 50) <= 0) continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        pthread_mutex_lock(&q->mu);
        if (q->quit) {
            pthread_mutex_unlock(&q->mu);
            close(fd);
            return NULL;
        }
        if (q->ifd >= 0) shutdown(q->ifd, SHUT_RDWR);  // a newer connection replaces it
        q->ifd = fd;
        pthread_mutex_unlock(&q->mu);
        serve(q, fd);
        pthread_mutex_lock(&q->mu);
        if (q->ifd == fd) q->ifd = -1;
        pthread_mutex_unlock(&q->mu);
        close(fd);
    }
}

EXPORT struct ibv_qp* ibv_create_qp(struct ibv_pd* pd, struct ibv_qp_init_attr* a) {
    if (pd == NULL || a == NULL || a->send_cq == NULL || a->recv_cq == NULL || a->srq != NULL) {
        errno = EINVAL;
        return NULL;
    }
    if (a->qp_type != IBV_QPT_RC) {
        errno = EOPNOTSUPP;  // the fake models RC only
        return NULL;
    }
    struct ibv_qp_cap* c = &a->cap;
    if (c->max_send_wr < 1 || c->max_send_wr > MAXWR || c->max_recv_wr < 1 || c->max_recv_wr > MAXWR ||
        c->max_send_sge > MAXSGE || c->max_recv_sge > MAXSGE || c->max_inline_data > 0) {
        errno = EINVAL;
        return NULL;
    }
    struct fqp* q = calloc(1, sizeof *q);
    if (q == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    q->cap = *c;
    q->sq = calloc(c->max_send_wr, sizeof *q->sq);
    q->rq = calloc(c->max_recv_wr, sizeof *q->rq);
    q->lfd = q->ofd = q->ifd = -1;
    if (q->sq == NULL || q->rq == NULL || qp_listen(q) != 0) {
        int e = q->sq && q->rq ? EAGAIN : ENOMEM;
        free(q->sq);
        free(q->rq);
        free(q);
        errno = e;
        return NULL;
    }
    q->qp.context = pd->context;
    q->qp.qp_context = a->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = a->send_cq;
    q->qp.recv_cq = a->recv_cq;
    q->qp.handle = q->qp.qp_num;
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&q->qp.mutex, NULL);
    pthread_cond_init(&q->qp.cond, NULL);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    q->sig_all = a->sq_sig_all != 0;
    pthread_create(&q->req_thr, NULL, requester, q);
    pthread_create(&q->resp_thr, NULL, responder, q);
    pd_use(pd, 1);
    pthread_mutex_lock(&qps_mu);
    q->next = qps;
    qps = q;
    pthread_mutex_unlock(&qps_mu);
    count(liveQP, 1);
    return &q->qp;
}

EXPORT int ibv_destroy_qp(struct ibv_qp* qp) {
    if (qp == NULL) return EINVAL;
    struct fqp* q = (struct fqp*)qp;
    pthread_mutex_lock(&q->mu);
    q->quit = 1;
    if (q->ofd >= 0) shutdown(q->ofd, SHUT_RDWR);
    if (q->ifd >= 0) shutdown(q->ifd, SHUT_RDWR);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->req_thr, NULL);
    pthread_join(q->resp_thr, NULL);
    if (q->ofd >= 0) close(q->ofd);
    close(q->lfd);
    unlink(q->path);
    pthread_mutex_lock(&qps_mu);
    struct fqp** pp = &qps;
    while (*pp && *pp != q) pp = &(*pp)->next;
    if (*pp) *pp = q->next;
    pthread_mutex_unlock(&qps_mu);
    pd_use(qp->pd, -1);
    free(q->sq);
    free(q->rq);
    free(q);
    count(liveQP, -1);
    return 0;
}

// The attribute masks each transition of an RC QP requires and allows.
enum {
    rtrReq = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
    rtsReq = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
             IBV_QP_MAX_QP_RD_ATOMIC,
    initReq = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
};

EXPORT int ibv_modify_qp(struct ibv_qp* qp, struct ibv_qp_attr* a, int mask) {
    if (qp == NULL || a == NULL) return EINVAL;
    struct fqp* q = (struct fqp*)qp;
    struct fdev* d = qdev(q);
    pthread_mutex_lock(&q->mu);
    int cur = q->qp.state;
    int nxt = (mask & IBV_QP_STATE) ? (int)a->qp_state : cur;
    int rc = 0, req = 0, opt = 0;
    if ((mask & IBV_QP_CUR_STATE) && (int)a->cur_qp_state != cur) {
        rc = EINVAL;
    } else if (nxt == IBV_QPS_RESET) {
        q->sq_n = q->rq_n = 0;
        q->sq_head = q->rq_head = 0;
        q->gen++;
        if (q->ofd >= 0) shutdown(q->ofd, SHUT_RDWR);
        if (q->ifd >= 0) shutdown(q->ifd, SHUT_RDWR);
        q->qp.state = IBV_QPS_RESET;
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        return 0;
    } else if (nxt == IBV_QPS_ERR) {
        to_err(q);
        pthread_mutex_unlock(&q->mu);
        return 0;
    } else if (cur == IBV_QPS_RESET && nxt == IBV_QPS_INIT) {
        req = initReq;
    } else if (cur == IBV_QPS_INIT && nxt == IBV_QPS_INIT) {
        opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (cur == IBV_QPS_INIT && nxt == IBV_QPS_RTR) {
        req = rtrReq;
        opt = IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    } else if (cur == IBV_QPS_RTR && nxt == IBV_QPS_RTS) {
        req = rtsReq;
        opt = IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER;
    } else if (cur == IBV_QPS_RTS && nxt == IBV_QPS_RTS) {
        opt = IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER;
    } else {
        rc = EINVAL;  // not a transition an RC QP makes
    }
    req |= IBV_QP_STATE & mask;
    if (rc == 0 && ((mask & req) != req || (mask & ~(req | opt)) != 0)) rc = EINVAL;
    if (rc == 0 && (mask & IBV_QP_PORT) && a->port_num != 1) rc = EINVAL;
    if (rc == 0 && (mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > d->mtu)) rc = EINVAL;
    if (rc == 0 && (mask & IBV_QP_AV)) {
        if (d->link_layer == IBV_LINK_LAYER_ETHERNET) {
            // RoCE addresses by GID: an address vector without a GRH is refused.
            if (!a->ah_attr.is_global || a->ah_attr.grh.sgid_index >= d->ngid) rc = EINVAL;
        } else if (a->ah_attr.dlid == 0) {
            rc = EINVAL;
        }
    }
    if (rc == 0) {
        if (mask & IBV_QP_ACCESS_FLAGS) q->access = (int)a->qp_access_flags;
        if (mask & IBV_QP_AV) {
            q->dlid = a->ah_attr.dlid;
            q->is_global = a->ah_attr.is_global;
            q->sgid_index = a->ah_attr.grh.sgid_index;
            q->dgid = a->ah_attr.grh.dgid;
        }
        if (mask & IBV_QP_PATH_MTU) q->mtu = a->path_mtu;
        if (mask & IBV_QP_DEST_QPN) q->dest_qpn = a->dest_qp_num;
        if (mask & IBV_QP_RQ_PSN) {
            q->rq_psn = a->rq_psn & 0xffffff;
            q->expect_seq = q->rq_psn;
        }
        if (mask & IBV_QP_MIN_RNR_TIMER) q->min_rnr_timer = a->min_rnr_timer;
        if (mask & IBV_QP_TIMEOUT) q->timeout = a->timeout;
        if (mask & IBV_QP_RETRY_CNT) q->retry_cnt = a->retry_cnt & 7;
        if (mask & IBV_QP_RNR_RETRY) q->rnr_retry = a->rnr_retry & 7;
        if (mask & IBV_QP_SQ_PSN) {
            q->sq_psn = a->sq_psn & 0xffffff;
            q->next_seq = q->sq_psn;
        }
        q->qp.state = nxt;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return rc;
}

static int f_post_send(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad) {
    struct fqp* q = (struct fqp*)qp;
    int rc = 0;
    pthread_mutex_lock(&q->mu);
    for (; wr; wr = wr->next) {
        int st = q->qp.state;
        int op = wr->opcode;
        if (st != IBV_QPS_RTS && st != IBV_QPS_ERR) rc = EINVAL;  // not ready to send
        else if (wr->num_sge < 0 || wr->num_sge > (int)q->cap.max_send_sge) rc = EINVAL;
        else if (wr->send_flags & IBV_SEND_INLINE) rc = EINVAL;  // max_inline_data is 0
        else if (op != IBV_WR_SEND && op != IBV_WR_SEND_WITH_IMM && op != IBV_WR_RDMA_WRITE &&
                 op != IBV_WR_RDMA_WRITE_WITH_IMM) rc = EINVAL;
        else if (q->sq_n == (int)q->cap.max_send_wr) rc = ENOMEM;
        if (rc) break;
        struct swr* w = &q->sq[(q->sq_head + q->sq_n) % (int)q->cap.max_send_wr];
        w->wr_id = wr->wr_id;
        w->opcode = op;
        w->flags = wr->send_flags;
        w->nsge = wr->num_sge;
        memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *w->sge);
        w->raddr = wr->wr.rdma.remote_addr;
        w->rkey = wr->wr.rdma.rkey;
        w->imm = wr->imm_data;
        q->sq_n++;
    }
    if (rc && bad) *bad = wr;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return rc;
}

static int f_post_recv(struct ibv_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad) {
    struct fqp* q = (struct fqp*)qp;
    int rc = 0;
    pthread_mutex_lock(&q->mu);
    for (; wr; wr = wr->next) {
        if (q->qp.state == IBV_QPS_RESET) rc = EINVAL;
        else if (wr->num_sge < 0 || wr->num_sge > (int)q->cap.max_recv_sge) rc = EINVAL;
        else if (q->qp.state != IBV_QPS_ERR && q->rq_n == (int)q->cap.max_recv_wr) rc = ENOMEM;
        if (rc) break;
        if (q->qp.state == IBV_QPS_ERR) {
            push_wc(q->qp.recv_cq, q, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0);
            continue;
        }
        struct rwr* w = &q->rq[(q->rq_head + q->rq_n) % (int)q->cap.max_recv_wr];
        w->wr_id = wr->wr_id;
        w->nsge = wr->num_sge;
        memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof *w->sge);
        q->rq_n++;
    }
    if (rc && bad) *bad = wr;
    pthread_mutex_unlock(&q->mu);
    return rc;
}

// ---- strings ------------------------------------------------------------------------

EXPORT const char* ibv_wc_status_str(enum ibv_wc_status s) {
    static const char* names[] = {
        "success", "local length error", "local QP operation error", "local EE context operation error",
        "local protection error", "Work Request Flushed Error", "memory management operation error",
        "bad response error", "local access error", "remote invalid request error", "remote access error",
        "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
        "local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
        "invalid EE context state", "fatal error", "response timeout error", "general error"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

EXPORT const char* ibv_node_type_str(enum ibv_node_type t) {
    switch (t) {
        case IBV_NODE_CA:
            return "InfiniBand channel adapter";
        case IBV_NODE_RNIC:
            return "iWARP NIC";
        default:
            return "unknown";
    }
}
