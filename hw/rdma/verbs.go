//go:build rdma && cgo

package rdma

/*
#cgo LDFLAGS: -libverbs
#include <stdlib.h>
#include <string.h>
#include <endian.h>
#include <infiniband/verbs.h>

// ibv_query_port, ibv_post_send, ibv_post_recv and ibv_poll_cq are macros or
// static inline functions, which cgo cannot call directly.
static int nx_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	return ibv_query_port(ctx, port, attr);
}
static uint64_t nx_guid(struct ibv_device *dev) { return be64toh(ibv_get_device_guid(dev)); }

static struct ibv_qp *nx_create_rc_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
		uint32_t max_send, uint32_t max_recv, uint32_t max_sge) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = max_send;
	a.cap.max_recv_wr = max_recv;
	a.cap.max_send_sge = max_sge;
	a.cap.max_recv_sge = max_sge;
	return ibv_create_qp(pd, &a);
}

static int nx_qp_init(struct ibv_qp *qp, uint8_t port, int access) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = port;
	a.qp_access_flags = access;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int nx_qp_rtr(struct ibv_qp *qp, uint8_t port, int mtu, uint32_t dest_qpn, uint32_t rq_psn,
		uint16_t dlid, const uint8_t *gid, int use_gid, uint8_t gid_index) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = rq_psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = dlid;
	a.ah_attr.port_num = port;
	if (use_gid) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
		a.ah_attr.grh.sgid_index = gid_index;
		a.ah_attr.grh.hop_limit = 1;
	}
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
		IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

static int nx_qp_rts(struct ibv_qp *qp, uint32_t sq_psn) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = sq_psn;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
		IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int nx_post_send(struct ibv_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey,
		uint64_t wr_id, int signaled) {
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
	return ibv_post_send(qp, &wr, &bad);
}

static int nx_post_recv(struct ibv_qp *qp, uint64_t addr, uint32_t len, uint32_t lkey, uint64_t wr_id) {
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(qp, &wr, &bad);
}

typedef struct { uint64_t wr_id; uint32_t status, opcode, byte_len; } nx_wc;

static int nx_poll(struct ibv_cq *cq, nx_wc *out, int n) {
	struct ibv_wc wc[32];
	if (n > 32) n = 32;
	int got = ibv_poll_cq(cq, n, wc);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
	}
	return got;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"
)

// Enabled reports whether this binary was built with the verbs bindings.
const Enabled = true

// Available returns nil when the kernel exposes an RDMA device and
// libibverbs can list it.
func Available() error {
	if _, err := sysfsDevices(); err != nil {
		return err
	}
	devs, err := Devices()
	if err != nil {
		return err
	}
	if len(devs) == 0 {
		return fmt.Errorf("%w (ibv_get_device_list returned none)", ErrNoDevice)
	}
	return nil
}

func errnoErr(what string, rc C.int, err error) error {
	if rc > 0 { // verbs calls that return an errno directly
		err = syscall.Errno(rc)
	}
	if err == nil {
		err = errors.New("unknown error")
	}
	return fmt.Errorf("hw/rdma: %s: %w", what, err)
}

// deviceList wraps ibv_get_device_list; ENOSYS means the kernel has no
// RDMA support at all, which is "no device", not a failure.
func deviceList(n *C.int) (**C.struct_ibv_device, error) {
	list, err := C.ibv_get_device_list(n)
	if list == nil {
		if errors.Is(err, syscall.ENOSYS) {
			return nil, fmt.Errorf("%w (ibv_get_device_list: %v)", ErrNoDevice, err)
		}
		return nil, errnoErr("ibv_get_device_list", 0, err)
	}
	return list, nil
}

// Devices enumerates the RDMA devices and their ports.
func Devices() ([]Device, error) {
	var n C.int
	list, err := deviceList(&n)
	if err != nil {
		return nil, err
	}
	defer C.ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	out := make([]Device, 0, len(devs))
	for _, dev := range devs {
		d := Device{
			Name:     C.GoString(C.ibv_get_device_name(dev)),
			GUID:     uint64(C.nx_guid(dev)),
			NodeType: C.GoString(C.ibv_node_type_str(dev.node_type)),
		}
		ctx, err := C.ibv_open_device(dev)
		if ctx == nil {
			return nil, errnoErr("ibv_open_device "+d.Name, 0, err)
		}
		ports, err := queryPorts(ctx)
		C.ibv_close_device(ctx)
		if err != nil {
			return nil, fmt.Errorf("%w (device %s)", err, d.Name)
		}
		d.Ports = ports
		out = append(out, d)
	}
	return out, nil
}

func queryPorts(ctx *C.struct_ibv_context) ([]Port, error) {
	var da C.struct_ibv_device_attr
	if rc, err := C.ibv_query_device(ctx, &da); rc != 0 {
		return nil, errnoErr("ibv_query_device", rc, err)
	}
	var ports []Port
	for p := 1; p <= int(da.phys_port_cnt); p++ {
		var pa C.struct_ibv_port_attr
		if rc, err := C.nx_query_port(ctx, C.uint8_t(p), &pa); rc != 0 {
			return nil, errnoErr(fmt.Sprintf("ibv_query_port %d", p), rc, err)
		}
		ll := "infiniband"
		if pa.link_layer == C.IBV_LINK_LAYER_ETHERNET {
			ll = "ethernet"
		}
		ports = append(ports, Port{
			Num: p, State: portStateName(int(pa.state)), LinkLayer: ll,
			LID: uint16(pa.lid), ActiveMTU: mtuBytes(int(pa.active_mtu)),
		})
	}
	return ports, nil
}

// Context is an open device. Its methods are safe for concurrent use (verbs
// contexts are thread-safe); Close must not race with other calls.
type Context struct {
	ctx  *C.struct_ibv_context
	Name string
}

// Open opens the device named name ("" for the first one).
func Open(name string) (*Context, error) {
	var n C.int
	list, err := deviceList(&n)
	if err != nil {
		return nil, err
	}
	defer C.ibv_free_device_list(list)
	for _, dev := range unsafe.Slice(list, int(n)) {
		dn := C.GoString(C.ibv_get_device_name(dev))
		if name != "" && dn != name {
			continue
		}
		ctx, err := C.ibv_open_device(dev)
		if ctx == nil {
			return nil, errnoErr("ibv_open_device "+dn, 0, err)
		}
		return &Context{ctx: ctx, Name: dn}, nil
	}
	if name == "" {
		return nil, ErrNoDevice
	}
	return nil, fmt.Errorf("%w (no device named %q)", ErrNoDevice, name)
}

// Close closes the device.
func (c *Context) Close() error {
	if rc, err := C.ibv_close_device(c.ctx); rc != 0 {
		return errnoErr("ibv_close_device", rc, err)
	}
	return nil
}

// PD is a protection domain.
type PD struct{ pd *C.struct_ibv_pd }

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	pd, err := C.ibv_alloc_pd(c.ctx)
	if pd == nil {
		return nil, errnoErr("ibv_alloc_pd", 0, err)
	}
	return &PD{pd}, nil
}

// Close deallocates the protection domain.
func (p *PD) Close() error {
	if rc, err := C.ibv_dealloc_pd(p.pd); rc != 0 {
		return errnoErr("ibv_dealloc_pd", rc, err)
	}
	return nil
}

// Access flags for Register and QP.Init.
const (
	AccessLocalWrite  = int(C.IBV_ACCESS_LOCAL_WRITE)
	AccessRemoteWrite = int(C.IBV_ACCESS_REMOTE_WRITE)
	AccessRemoteRead  = int(C.IBV_ACCESS_REMOTE_READ)
)

// MR is a registered memory region.
type MR struct {
	mr   *C.struct_ibv_mr
	Addr uintptr
	Len  uintptr
	LKey uint32
	RKey uint32
}

// Register registers [addr, addr+n). The memory must stay mapped and must
// not move until Deregister: C memory, or Go memory pinned by the caller.
func (p *PD) Register(addr, n uintptr, access int) (*MR, error) {
	// addr is not a Go pointer the runtime tracks once pinned or C-owned;
	// going through C keeps vet's unsafe-pointer check meaningful elsewhere.
	mr, err := C.ibv_reg_mr(p.pd, *(*unsafe.Pointer)(unsafe.Pointer(&addr)), C.size_t(n), C.int(access))
	if mr == nil {
		return nil, errnoErr("ibv_reg_mr", 0, err)
	}
	return &MR{mr: mr, Addr: addr, Len: n, LKey: uint32(mr.lkey), RKey: uint32(mr.rkey)}, nil
}

// Deregister releases the registration.
func (m *MR) Deregister() error {
	if rc, err := C.ibv_dereg_mr(m.mr); rc != 0 {
		return errnoErr("ibv_dereg_mr", rc, err)
	}
	return nil
}

// NewRegCache returns a registration cache of at most size regions in p,
// registered with local write and remote read/write access.
func (p *PD) NewRegCache(size int) (*RegCache[*MR], error) {
	return NewRegCache(size,
		func(addr, n uintptr) (*MR, error) {
			return p.Register(addr, n, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
		},
		(*MR).Deregister)
}

// CQ is a completion queue. Poll is safe to call from one goroutine at a time.
type CQ struct{ cq *C.struct_ibv_cq }

// NewCQ creates a completion queue of at least depth entries.
func (c *Context) NewCQ(depth int) (*CQ, error) {
	cq, err := C.ibv_create_cq(c.ctx, C.int(depth), nil, nil, 0)
	if cq == nil {
		return nil, errnoErr("ibv_create_cq", 0, err)
	}
	return &CQ{cq}, nil
}

// Close destroys the completion queue.
func (q *CQ) Close() error {
	if rc, err := C.ibv_destroy_cq(q.cq); rc != 0 {
		return errnoErr("ibv_destroy_cq", rc, err)
	}
	return nil
}

// Completion is one work completion.
type Completion struct {
	WRID    uint64
	Status  int // 0 is success (IBV_WC_SUCCESS)
	Opcode  int
	ByteLen uint32
}

// Err returns nil for a successful completion.
func (w Completion) Err() error {
	if w.Status == 0 {
		return nil
	}
	return fmt.Errorf("hw/rdma: work request %d failed: %s", w.WRID,
		C.GoString(C.ibv_wc_status_str(C.enum_ibv_wc_status(w.Status))))
}

// Poll fills out with up to len(out) (at most 32) completions without
// blocking and returns how many it wrote.
func (q *CQ) Poll(out []Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	var wc [32]C.nx_wc
	n := C.nx_poll(q.cq, &wc[0], C.int(min(len(out), 32)))
	if n < 0 {
		return 0, errors.New("hw/rdma: ibv_poll_cq failed")
	}
	for i := 0; i < int(n); i++ {
		out[i] = Completion{WRID: uint64(wc[i].wr_id), Status: int(wc[i].status),
			Opcode: int(wc[i].opcode), ByteLen: uint32(wc[i].byte_len)}
	}
	return int(n), nil
}

// QPInfo is what two ends of an RC connection exchange out of band (over
// nexar's control plane) before moving their QPs to RTR.
type QPInfo struct {
	QPN  uint32
	PSN  uint32
	LID  uint16
	GID  [16]byte // used on RoCE (Ethernet link layer)
	Port uint8
	MTU  int // IBV_MTU_* enum value of the port
	RoCE bool
}

// QP is a reliable-connected queue pair. Posting is safe from one goroutine
// per queue (send, receive) at a time.
type QP struct {
	qp   *C.struct_ibv_qp
	ctx  *Context
	port uint8
}

// NewRCQP creates an RC queue pair in the RESET state.
func (p *PD) NewRCQP(c *Context, send, recv *CQ, maxSend, maxRecv int) (*QP, error) {
	qp, err := C.nx_create_rc_qp(p.pd, send.cq, recv.cq, C.uint32_t(maxSend), C.uint32_t(maxRecv), 1)
	if qp == nil {
		return nil, errnoErr("ibv_create_qp", 0, err)
	}
	return &QP{qp: qp, ctx: c}, nil
}

// Init moves the QP to INIT on port.
func (q *QP) Init(port uint8, access int) error {
	if rc, err := C.nx_qp_init(q.qp, C.uint8_t(port), C.int(access)); rc != 0 {
		return errnoErr("ibv_modify_qp(INIT)", rc, err)
	}
	q.port = port
	return nil
}

// Info returns this end's connection parameters; psn is the initial send PSN.
func (q *QP) Info(psn uint32) (QPInfo, error) {
	var pa C.struct_ibv_port_attr
	if rc, err := C.nx_query_port(q.ctx.ctx, C.uint8_t(q.port), &pa); rc != 0 {
		return QPInfo{}, errnoErr("ibv_query_port", rc, err)
	}
	info := QPInfo{QPN: uint32(q.qp.qp_num), PSN: psn & 0xffffff, LID: uint16(pa.lid),
		Port: q.port, MTU: int(pa.active_mtu), RoCE: pa.link_layer == C.IBV_LINK_LAYER_ETHERNET}
	if info.RoCE {
		var gid C.union_ibv_gid
		if rc, err := C.ibv_query_gid(q.ctx.ctx, C.uint8_t(q.port), 0, &gid); rc != 0 {
			return QPInfo{}, errnoErr("ibv_query_gid", rc, err)
		}
		info.GID = *(*[16]byte)(unsafe.Pointer(&gid))
	}
	return info, nil
}

// Connect moves the QP through RTR (towards remote) to RTS, sending from
// local.PSN.
func (q *QP) Connect(local, remote QPInfo) error {
	mtu := min(local.MTU, remote.MTU)
	use := 0
	if remote.RoCE {
		use = 1
	}
	if rc, err := C.nx_qp_rtr(q.qp, C.uint8_t(q.port), C.int(mtu), C.uint32_t(remote.QPN),
		C.uint32_t(remote.PSN), C.uint16_t(remote.LID), (*C.uint8_t)(&remote.GID[0]), C.int(use), 0); rc != 0 {
		return errnoErr("ibv_modify_qp(RTR)", rc, err)
	}
	if rc, err := C.nx_qp_rts(q.qp, C.uint32_t(local.PSN)); rc != 0 {
		return errnoErr("ibv_modify_qp(RTS)", rc, err)
	}
	return nil
}

// PostSend posts a SEND of [addr, addr+n) from the registered region mr.
func (q *QP) PostSend(mr *MR, addr uintptr, n uint32, wrID uint64, signaled bool) error {
	sig := 0
	if signaled {
		sig = 1
	}
	if rc := C.nx_post_send(q.qp, C.uint64_t(addr), C.uint32_t(n), C.uint32_t(mr.LKey), C.uint64_t(wrID), C.int(sig)); rc != 0 {
		return errnoErr("ibv_post_send", rc, nil)
	}
	return nil
}

// PostRecv posts a receive into [addr, addr+n) of the registered region mr.
func (q *QP) PostRecv(mr *MR, addr uintptr, n uint32, wrID uint64) error {
	if rc := C.nx_post_recv(q.qp, C.uint64_t(addr), C.uint32_t(n), C.uint32_t(mr.LKey), C.uint64_t(wrID)); rc != 0 {
		return errnoErr("ibv_post_recv", rc, nil)
	}
	return nil
}

// Close destroys the queue pair.
func (q *QP) Close() error {
	if rc, err := C.ibv_destroy_qp(q.qp); rc != 0 {
		return errnoErr("ibv_destroy_qp", rc, err)
	}
	return nil
}
