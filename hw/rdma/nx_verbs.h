// nx_verbs.h: the C side of hw/rdma, included by the cgo files of the
// package. libibverbs is reached only through the entry points dlopen
// found (nx_ibv), so that nexar builds against the libibverbs-dev headers
// and runs where no libibverbs is installed.
#ifndef NX_VERBS_H
#define NX_VERBS_H
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <endian.h>
#include <infiniband/verbs.h>

// The entry points of the loaded library. Only the exported functions are
// looked up; ibv_post_send, ibv_post_recv, ibv_poll_cq and
// ibv_req_notify_cq are inline functions of verbs.h that call through
// context->ops, which the library (or its provider) filled.
typedef struct {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	const char *(*get_device_name)(struct ibv_device *);
	__be64 (*get_device_guid)(struct ibv_device *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	int (*query_gid_ex)(struct ibv_context *, uint32_t, uint32_t, struct ibv_gid_entry *, uint32_t, size_t);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	struct ibv_mr *(*reg_dmabuf_mr)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
	int (*destroy_comp_channel)(struct ibv_comp_channel *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
	void (*ack_cq_events)(struct ibv_cq *, unsigned int);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*destroy_qp)(struct ibv_qp *);
} nx_ibv;

// nx_bind resolves the entry points; it returns the name of the first
// required one that is missing, or NULL. query_gid_ex and reg_dmabuf_mr are
// optional (newer libraries).
static const char *nx_bind(void *h, nx_ibv *f) {
#define REQ(field, name) if (!(*(void **)&f->field = dlsym(h, name))) return name;
	REQ(get_device_list, "ibv_get_device_list")
	REQ(free_device_list, "ibv_free_device_list")
	REQ(get_device_name, "ibv_get_device_name")
	REQ(get_device_guid, "ibv_get_device_guid")
	REQ(open_device, "ibv_open_device")
	REQ(close_device, "ibv_close_device")
	REQ(query_device, "ibv_query_device")
	REQ(query_port, "ibv_query_port")
	REQ(query_gid, "ibv_query_gid")
	REQ(alloc_pd, "ibv_alloc_pd")
	REQ(dealloc_pd, "ibv_dealloc_pd")
	REQ(reg_mr, "ibv_reg_mr")
	REQ(dereg_mr, "ibv_dereg_mr")
	REQ(create_comp_channel, "ibv_create_comp_channel")
	REQ(destroy_comp_channel, "ibv_destroy_comp_channel")
	REQ(create_cq, "ibv_create_cq")
	REQ(destroy_cq, "ibv_destroy_cq")
	REQ(get_cq_event, "ibv_get_cq_event")
	REQ(ack_cq_events, "ibv_ack_cq_events")
	REQ(create_qp, "ibv_create_qp")
	REQ(modify_qp, "ibv_modify_qp")
	REQ(destroy_qp, "ibv_destroy_qp")
#undef REQ
	*(void **)&f->query_gid_ex = dlsym(h, "_ibv_query_gid_ex");
	*(void **)&f->reg_dmabuf_mr = dlsym(h, "ibv_reg_dmabuf_mr");
	return NULL;
}

static void *nx_open(const char *path) { return dlopen(path, RTLD_NOW | RTLD_LOCAL); }

// Each wrapper returns 0 or an errno: verbs report errors either as the
// return value or (for calls returning pointers) in errno.
static int nx_err(int rc) { return rc > 0 ? rc : (errno ? errno : EIO); }

static struct ibv_device **nx_devices(nx_ibv *f, int *n, int *err) {
	errno = 0;
	struct ibv_device **l = f->get_device_list(n);
	if (!l) *err = nx_err(0);
	return l;
}

static uint64_t nx_guid(nx_ibv *f, struct ibv_device *d) { return be64toh(f->get_device_guid(d)); }

static struct ibv_context *nx_open_device(nx_ibv *f, struct ibv_device *d, int *err) {
	errno = 0;
	struct ibv_context *c = f->open_device(d);
	if (!c) *err = nx_err(0);
	return c;
}

// nx_query_port does what verbs.h's inline ibv_query_port does: the
// extended context's op when the provider has one, else the exported call.
static int nx_query_port(nx_ibv *f, struct ibv_context *c, uint8_t port, struct ibv_port_attr *a) {
	memset(a, 0, sizeof *a);
	struct verbs_context *v = verbs_get_ctx_op(c, query_port);
	int rc = v ? v->query_port(c, port, a, sizeof *a) : f->query_port(c, port, a);
	return rc ? nx_err(rc) : 0;
}

static int nx_phys_ports(nx_ibv *f, struct ibv_context *c, int *n) {
	struct ibv_device_attr a;
	int rc = f->query_device(c, &a);
	*n = a.phys_port_cnt;
	return rc ? nx_err(rc) : 0;
}

// nx_gid reads GID index i of port and its type (-1 when the library
// cannot tell: no _ibv_query_gid_ex).
static int nx_gid(nx_ibv *f, struct ibv_context *c, uint8_t port, int i, uint8_t *raw, int *type) {
	*type = -1;
	if (f->query_gid_ex) {
		struct ibv_gid_entry e;
		int rc = f->query_gid_ex(c, port, (uint32_t)i, &e, 0, sizeof e);
		if (rc) return rc;
		memcpy(raw, e.gid.raw, 16);
		*type = (int)e.gid_type;
		return 0;
	}
	union ibv_gid g;
	errno = 0;
	if (f->query_gid(c, port, i, &g)) return nx_err(0);
	memcpy(raw, g.raw, 16);
	return 0;
}

static struct ibv_pd *nx_alloc_pd(nx_ibv *f, struct ibv_context *c, int *err) {
	errno = 0;
	struct ibv_pd *p = f->alloc_pd(c);
	if (!p) *err = nx_err(0);
	return p;
}

static struct ibv_mr *nx_reg_mr(nx_ibv *f, struct ibv_pd *pd, uintptr_t addr, size_t n, int access, int *err) {
	errno = 0;
	struct ibv_mr *m = f->reg_mr(pd, (void *)addr, n, access);
	if (!m) *err = nx_err(0);
	return m;
}

static struct ibv_mr *nx_reg_dmabuf(nx_ibv *f, struct ibv_pd *pd, uint64_t off, size_t n, uint64_t iova, int fd,
		int access, int *err) {
	if (!f->reg_dmabuf_mr) {
		*err = EOPNOTSUPP;
		return NULL;
	}
	errno = 0;
	struct ibv_mr *m = f->reg_dmabuf_mr(pd, off, n, iova, fd, access);
	if (!m) *err = nx_err(0);
	return m;
}

static struct ibv_comp_channel *nx_channel(nx_ibv *f, struct ibv_context *c, int *err) {
	errno = 0;
	struct ibv_comp_channel *ch = f->create_comp_channel(c);
	if (!ch) *err = nx_err(0);
	return ch;
}

static struct ibv_cq *nx_cq(nx_ibv *f, struct ibv_context *c, int depth, struct ibv_comp_channel *ch, int *err) {
	errno = 0;
	struct ibv_cq *q = f->create_cq(c, depth, NULL, ch, 0);
	if (!q) *err = nx_err(0);
	return q;
}

// nx_get_event takes one event off a (non-blocking) channel: 0 and the
// CQ, or the errno (EAGAIN: none).
static int nx_get_event(nx_ibv *f, struct ibv_comp_channel *ch, struct ibv_cq **cq) {
	void *ctx;
	errno = 0;
	if (f->get_cq_event(ch, cq, &ctx)) return nx_err(0);
	return 0;
}

static int nx_notify(struct ibv_cq *cq) { int rc = ibv_req_notify_cq(cq, 0); return rc ? nx_err(rc) : 0; }

typedef struct { uint64_t wr_id; uint32_t status, opcode, byte_len, imm, flags, qp_num; } nx_wc;

static int nx_poll(struct ibv_cq *cq, nx_wc *out, int n) {
	struct ibv_wc wc[32];
	if (n > 32) n = 32;
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].imm = be32toh(wc[i].imm_data);
		out[i].flags = wc[i].wc_flags;
		out[i].qp_num = wc[i].qp_num;
	}
	return got;
}

static struct ibv_qp *nx_create_rc_qp(nx_ibv *f, struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		uint32_t max_send, uint32_t max_recv, uint32_t max_sge, int *err) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = max_send;
	a.cap.max_recv_wr = max_recv;
	a.cap.max_send_sge = max_sge;
	a.cap.max_recv_sge = max_sge;
	errno = 0;
	struct ibv_qp *q = f->create_qp(pd, &a);
	if (!q) *err = nx_err(0);
	return q;
}

static int nx_qp_init(nx_ibv *f, struct ibv_qp *qp, uint8_t port, int access) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = access;
	int rc = f->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	return rc ? nx_err(rc) : 0;
}

static int nx_qp_rtr(nx_ibv *f, struct ibv_qp *qp, uint8_t port, int mtu, uint32_t dest_qpn, uint32_t rq_psn,
		uint16_t dlid, const uint8_t *gid, int use_gid, uint8_t sgid_index, uint8_t min_rnr) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = min_rnr;
	a.ah_attr.dlid = dlid;
	a.ah_attr.port_num = port;
	if (use_gid) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
		a.ah_attr.grh.sgid_index = sgid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	int rc = f->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	return rc ? nx_err(rc) : 0;
}

static int nx_qp_rts(nx_ibv *f, struct ibv_qp *qp, uint32_t sq_psn, uint8_t timeout, uint8_t retry, uint8_t rnr) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = retry;
	a.rnr_retry = rnr;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = 1;
	int rc = f->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	return rc ? nx_err(rc) : 0;
}

static int nx_qp_state(nx_ibv *f, struct ibv_qp *qp, int state) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = state;
	int rc = f->modify_qp(qp, &a, IBV_QP_STATE);
	return rc ? nx_err(rc) : 0;
}

static int nx_post_send(struct ibv_qp *qp, uint64_t wr_id, int opcode, int signaled, struct ibv_sge *sge, int nsge,
		uint64_t raddr, uint32_t rkey, uint32_t imm) {
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = sge;
	wr.num_sge = nsge;
	wr.opcode = opcode;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	wr.imm_data = htobe32(imm);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	int rc = ibv_post_send(qp, &wr, &bad);
	return rc ? nx_err(rc) : 0;
}

static int nx_post_recv(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sge, int nsge) {
	struct ibv_recv_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = sge;
	wr.num_sge = nsge;
	int rc = ibv_post_recv(qp, &wr, &bad);
	return rc ? nx_err(rc) : 0;
}

static void nx_ibv_free_list(nx_ibv *f, struct ibv_device **l) { f->free_device_list(l); }
static const char *nx_ibv_device_name(nx_ibv *f, struct ibv_device *d) { return f->get_device_name(d); }
static int nx_ibv_close_device(nx_ibv *f, struct ibv_context *c) { int rc = f->close_device(c); return rc ? nx_err(rc) : 0; }
static int nx_ibv_dealloc_pd(nx_ibv *f, struct ibv_pd *p) { int rc = f->dealloc_pd(p); return rc ? nx_err(rc) : 0; }
static int nx_ibv_dereg_mr(nx_ibv *f, struct ibv_mr *m) { int rc = f->dereg_mr(m); return rc ? nx_err(rc) : 0; }
static int nx_ibv_destroy_channel(nx_ibv *f, struct ibv_comp_channel *c) { int rc = f->destroy_comp_channel(c); return rc ? nx_err(rc) : 0; }
static int nx_ibv_destroy_cq(nx_ibv *f, struct ibv_cq *q) { int rc = f->destroy_cq(q); return rc ? nx_err(rc) : 0; }
static void nx_ibv_ack(nx_ibv *f, struct ibv_cq *q, unsigned n) { f->ack_cq_events(q, n); }
static int nx_ibv_destroy_qp(nx_ibv *f, struct ibv_qp *q) { int rc = f->destroy_qp(q); return rc ? nx_err(rc) : 0; }

#endif
