//go:build cgo

package rdma

/*
#include "nx_verbs.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// CompChannel is a completion channel whose events Wait receives in the Go
// poller (the channel's fd is made non-blocking), so a goroutine waiting
// for completions holds no thread. Wait is for one goroutine at a time;
// Interrupt may be called from any.
type CompChannel struct {
	c    *Context
	ch   *C.struct_ibv_comp_channel
	file *os.File // a duplicate of the channel's fd, for the poller
	once sync.Once
}

// ErrInterrupted is returned by Wait after Interrupt.
var ErrInterrupted = errors.New("hw/rdma: completion channel interrupted")

// NewCompChannel creates a completion channel.
func (c *Context) NewCompChannel() (*CompChannel, error) {
	var e C.int
	ch := C.nx_channel(c.lib.f, c.ctx, &e)
	if ch == nil {
		return nil, errnoErr("ibv_create_comp_channel", e)
	}
	fd := int(ch.fd)
	dup, err := syscall.Dup(fd)
	if err == nil {
		syscall.CloseOnExec(dup)
		err = syscall.SetNonblock(fd, true) // shared with dup: one open file
	}
	if err != nil {
		if dup >= 0 {
			syscall.Close(dup)
		}
		C.nx_ibv_destroy_channel(c.lib.f, ch)
		return nil, fmt.Errorf("hw/rdma: completion channel fd: %w", err)
	}
	return &CompChannel{c: c, ch: ch, file: os.NewFile(uintptr(dup), "ibv-comp-channel")}, nil
}

// Event is a completion event: which CQ has new completions.
type Event struct{ cq *C.struct_ibv_cq }

// Wait blocks until an event arrives on the channel and returns it, to be
// counted by the CQ it is for (CQ.Is) and acknowledged (CQ.Ack);
// ErrInterrupted once Interrupt was called.
func (ch *CompChannel) Wait() (Event, error) {
	rc, err := ch.file.SyscallConn()
	if err != nil {
		return Event{}, ErrInterrupted
	}
	var cq *C.struct_ibv_cq
	var werr error
	err = rc.Read(func(uintptr) bool {
		e := C.nx_get_event(ch.c.lib.f, ch.ch, &cq)
		switch syscall.Errno(e) {
		case 0:
			return true
		case syscall.EAGAIN:
			return false // park in the poller until the fd is readable
		default:
			werr = errnoErr("ibv_get_cq_event", e)
			return true
		}
	})
	if err != nil {
		return Event{}, ErrInterrupted
	}
	return Event{cq}, werr
}

// Interrupt makes the current and every later Wait return ErrInterrupted.
func (ch *CompChannel) Interrupt() { ch.once.Do(func() { ch.file.Close() }) }

// Close interrupts waiters and destroys the channel (after its CQs).
func (ch *CompChannel) Close() error {
	ch.Interrupt()
	return errnoErr("ibv_destroy_comp_channel", C.nx_ibv_destroy_channel(ch.c.lib.f, ch.ch))
}

// CQ is a completion queue. Poll and Notify are for one goroutine at a
// time.
type CQ struct {
	c       *Context
	cq      *C.struct_ibv_cq
	unacked uint32
	Depth   int
}

// NewCQ creates a completion queue of depth entries, with events on ch
// (may be nil).
func (c *Context) NewCQ(depth int, ch *CompChannel) (*CQ, error) {
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		cch = ch.ch
	}
	var e C.int
	cq := C.nx_cq(c.lib.f, c.ctx, C.int(depth), cch, &e)
	if cq == nil {
		return nil, errnoErr(fmt.Sprintf("ibv_create_cq(%d)", depth), e)
	}
	return &CQ{c: c, cq: cq, Depth: depth}, nil
}

// Is reports whether an event from CompChannel.Wait is for q; it counts the
// event for Ack.
func (q *CQ) Is(ev Event) bool {
	if ev.cq != q.cq {
		return false
	}
	q.unacked++
	return true
}

// Ack acknowledges the events counted by Is (ibv_ack_cq_events).
func (q *CQ) Ack() {
	if q.unacked > 0 {
		C.nx_ibv_ack(q.c.lib.f, q.cq, C.uint(q.unacked))
		q.unacked = 0
	}
}

// Notify arms the CQ: the next completion added writes an event to its
// channel. Completions already there do not: poll after arming.
func (q *CQ) Notify() error { return errnoErr("ibv_req_notify_cq", C.nx_notify(q.cq)) }

// Close acknowledges outstanding events and destroys the CQ (after the QPs
// that use it).
func (q *CQ) Close() error {
	q.Ack()
	return errnoErr("ibv_destroy_cq", C.nx_ibv_destroy_cq(q.c.lib.f, q.cq))
}

// Completion is one work completion.
type Completion struct {
	WRID    uint64
	Status  int // 0 is success (IBV_WC_SUCCESS)
	Opcode  int
	ByteLen uint32
	Imm     uint32 // host byte order; valid when HasImm
	HasImm  bool
	QPN     uint32
}

// Completion opcodes.
const (
	WCSend         = int(C.IBV_WC_SEND)
	WCWrite        = int(C.IBV_WC_RDMA_WRITE)
	WCRecv         = int(C.IBV_WC_RECV)
	WCRecvWriteImm = int(C.IBV_WC_RECV_RDMA_WITH_IMM)
)

// Completion statuses a data path tells apart.
const (
	StatusSuccess     = int(C.IBV_WC_SUCCESS)
	StatusLocLen      = int(C.IBV_WC_LOC_LEN_ERR)
	StatusLocProt     = int(C.IBV_WC_LOC_PROT_ERR)
	StatusFlush       = int(C.IBV_WC_WR_FLUSH_ERR)
	StatusRemInvReq   = int(C.IBV_WC_REM_INV_REQ_ERR)
	StatusRemAccess   = int(C.IBV_WC_REM_ACCESS_ERR)
	StatusRemOp       = int(C.IBV_WC_REM_OP_ERR)
	StatusRetryExc    = int(C.IBV_WC_RETRY_EXC_ERR)
	StatusRNRRetryExc = int(C.IBV_WC_RNR_RETRY_EXC_ERR)
)

// Err returns nil for a successful completion, else a *WCError.
func (w Completion) Err() error {
	if w.Status == 0 {
		return nil
	}
	return &WCError{Status: w.Status, Opcode: w.Opcode, WRID: w.WRID}
}

// ErrCQOverflow is returned by Poll once the CQ overran: completions were
// lost and the QPs on it are in error.
var ErrCQOverflow = errors.New("hw/rdma: completion queue overrun (ibv_poll_cq failed)")

// Poll fills out with up to len(out) (at most 32) completions without
// blocking and returns how many it wrote.
func (q *CQ) Poll(out []Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	var wc [32]C.nx_wc
	n := C.nx_poll(q.cq, &wc[0], C.int(min(len(out), 32)))
	if n < 0 {
		return 0, ErrCQOverflow
	}
	for i := 0; i < int(n); i++ {
		out[i] = Completion{WRID: uint64(wc[i].wr_id), Status: int(wc[i].status), Opcode: int(wc[i].opcode),
			ByteLen: uint32(wc[i].byte_len), Imm: uint32(wc[i].imm), HasImm: wc[i].flags&C.IBV_WC_WITH_IMM != 0,
			QPN: uint32(wc[i].qp_num)}
	}
	return int(n), nil
}

// QPInfo is what two ends of an RC connection exchange out of band (over
// nexar's control plane) before moving their QPs to RTR.
type QPInfo struct {
	QPN  uint32
	PSN  uint32
	LID  uint16   // InfiniBand: the port's LID
	GID  [16]byte // RoCE: the GID the peer addresses this end by
	MTU  int      // IBV_MTU_* enum value of the port
	RoCE bool     // Ethernet link layer: address by GID
}

// ConnectOptions are the RTR/RTS attributes of Connect.
type ConnectOptions struct {
	GIDIndex    int   // RoCE: the local GID index (source GID)
	Timeout     uint8 // local ACK timeout, 4.096 us * 2^Timeout (default 14: 67 ms)
	RetryCnt    uint8 // transport retries (default 7)
	RNRRetry    uint8 // RNR retries (7: forever; default 7)
	MinRNRTimer uint8 // RNR NAK timer encoding (default 12: 0.64 ms)
}

// QP is a reliable-connected queue pair. Posting is safe from one goroutine
// per queue (send, receive) at a time.
type QP struct {
	c    *Context
	qp   *C.struct_ibv_qp
	port uint8
}

// QPCaps sizes a queue pair.
type QPCaps struct{ MaxSend, MaxRecv, MaxSGE int }

// NewRCQP creates an RC queue pair in the RESET state.
func (p *PD) NewRCQP(send, recv *CQ, caps QPCaps) (*QP, error) {
	var e C.int
	qp := C.nx_create_rc_qp(p.c.lib.f, p.pd, send.cq, recv.cq, C.uint32_t(caps.MaxSend), C.uint32_t(caps.MaxRecv),
		C.uint32_t(max(caps.MaxSGE, 1)), &e)
	if qp == nil {
		return nil, errnoErr("ibv_create_qp", e)
	}
	return &QP{c: p.c, qp: qp}, nil
}

// QPN is the queue pair's number.
func (q *QP) QPN() uint32 { return uint32(q.qp.qp_num) }

// Init moves the QP to INIT on port with the given remote access.
func (q *QP) Init(port int, access int) error {
	if rc := C.nx_qp_init(q.c.lib.f, q.qp, C.uint8_t(port), C.int(access)); rc != 0 {
		return errnoErr("ibv_modify_qp(INIT)", rc)
	}
	q.port = uint8(port)
	return nil
}

// Connect moves the QP through RTR (towards remote) to RTS, sending from
// local.PSN.
func (q *QP) Connect(local, remote QPInfo, o ConnectOptions) error {
	if o.Timeout == 0 {
		o.Timeout = 14
	}
	if o.RetryCnt == 0 {
		o.RetryCnt = 7
	}
	if o.RNRRetry == 0 {
		o.RNRRetry = 7
	}
	if o.MinRNRTimer == 0 {
		o.MinRNRTimer = 12
	}
	if local.RoCE != remote.RoCE {
		return errors.New("hw/rdma: connect: one end is RoCE, the other InfiniBand")
	}
	mtu := min(local.MTU, remote.MTU)
	use := 0
	if remote.RoCE {
		use = 1
	}
	if rc := C.nx_qp_rtr(q.c.lib.f, q.qp, C.uint8_t(q.port), C.int(mtu), C.uint32_t(remote.QPN),
		C.uint32_t(remote.PSN), C.uint16_t(remote.LID), (*C.uint8_t)(&remote.GID[0]), C.int(use),
		C.uint8_t(o.GIDIndex), C.uint8_t(o.MinRNRTimer)); rc != 0 {
		return errnoErr("ibv_modify_qp(RTR)", rc)
	}
	if rc := C.nx_qp_rts(q.c.lib.f, q.qp, C.uint32_t(local.PSN), C.uint8_t(o.Timeout), C.uint8_t(o.RetryCnt),
		C.uint8_t(o.RNRRetry)); rc != 0 {
		return errnoErr("ibv_modify_qp(RTS)", rc)
	}
	return nil
}

// ToError moves the QP to the error state: every outstanding work request
// completes flushed.
func (q *QP) ToError() error {
	return errnoErr("ibv_modify_qp(ERR)", C.nx_qp_state(q.c.lib.f, q.qp, C.IBV_QPS_ERR))
}

// Send operations.
const (
	OpSend     = int(C.IBV_WR_SEND)
	OpSendImm  = int(C.IBV_WR_SEND_WITH_IMM)
	OpWrite    = int(C.IBV_WR_RDMA_WRITE)
	OpWriteImm = int(C.IBV_WR_RDMA_WRITE_WITH_IMM)
)

// SGE is one scatter/gather element: [Addr, Addr+Len) of the region with
// LKey.
type SGE struct {
	Addr uint64
	Len  uint32
	LKey uint32
}

// SendWR is one send work request.
type SendWR struct {
	WRID       uint64
	Op         int
	Signaled   bool
	SGE        []SGE // at most 4
	RemoteAddr uint64
	RKey       uint32
	Imm        uint32 // host byte order
}

func sges(in []SGE) ([4]C.struct_ibv_sge, int, error) {
	var sg [4]C.struct_ibv_sge
	if len(in) > len(sg) {
		return sg, 0, fmt.Errorf("hw/rdma: %d SGEs, at most %d", len(in), len(sg))
	}
	for i, s := range in {
		sg[i] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Len), lkey: C.uint32_t(s.LKey)}
	}
	return sg, len(in), nil
}

// PostSend posts one send work request.
func (q *QP) PostSend(wr SendWR) error {
	sg, n, err := sges(wr.SGE)
	if err != nil {
		return err
	}
	sig := 0
	if wr.Signaled {
		sig = 1
	}
	return errnoErr("ibv_post_send", C.nx_post_send(q.qp, C.uint64_t(wr.WRID), C.int(wr.Op), C.int(sig), &sg[0], C.int(n),
		C.uint64_t(wr.RemoteAddr), C.uint32_t(wr.RKey), C.uint32_t(wr.Imm)))
}

// PostRecv posts one receive work request.
func (q *QP) PostRecv(wrID uint64, sge ...SGE) error {
	sg, n, err := sges(sge)
	if err != nil {
		return err
	}
	return errnoErr("ibv_post_recv", C.nx_post_recv(q.qp, C.uint64_t(wrID), &sg[0], C.int(n)))
}

// Close destroys the queue pair (its outstanding work requests complete
// no more).
func (q *QP) Close() error {
	return errnoErr("ibv_destroy_qp", C.nx_ibv_destroy_qp(q.c.lib.f, q.qp))
}
