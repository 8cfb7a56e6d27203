//go:build cgo

package rdma

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
)

// fake loads the fake libibverbs (built once for every test binary).
func fake(t testing.TB) *Lib {
	t.Helper()
	path, err := ibverbs.Cached()
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// cmem is memory outside the Go heap, as registered buffers are.
func cmem(t testing.TB, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func TestFakeDevices(t *testing.T) {
	l := fake(t)
	devs, err := l.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].Name != "fake_roce0" || devs[1].Name != "fake_ib0" {
		t.Fatalf("devices %v", devs)
	}
	roce, ib := devs[0].Ports[0], devs[1].Ports[0]
	if roce.LinkLayer != "ethernet" || !roce.Active() || len(roce.GIDs) != 4 || roce.GIDs[3].Type != GIDRoCEv2 || !roce.GIDs[3].IPv4Mapped() {
		t.Errorf("roce port %+v", roce)
	}
	if ib.LinkLayer != "infiniband" || ib.LID != 0x11 || ib.ActiveMTU != 4096 || len(ib.GIDs) != 1 || ib.GIDs[0].Type != GIDIB {
		t.Errorf("ib port %+v", ib)
	}
	t.Setenv("NEXAR_FAKE_IBV_DEVICES", "")
	if devs, err := l.Devices(); err != nil || len(devs) != 0 {
		t.Fatalf("with no devices: %v, %v", devs, err)
	}
}

// end is one side of a test connection: its own context, PD, CQ and QP.
type end struct {
	c    *Context
	pd   *PD
	ch   *CompChannel
	cq   *CQ
	qp   *QP
	info QPInfo
	gid  int
}

func newEnd(t testing.TB, l *Lib, dev string, depth int, access int) *end {
	t.Helper()
	c, err := l.OpenDevice(dev)
	if err != nil {
		t.Fatal(err)
	}
	e := &end{c: c}
	if e.pd, err = c.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.ch, err = c.NewCompChannel(); err != nil {
		t.Fatal(err)
	}
	if e.cq, err = c.NewCQ(depth, e.ch); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.NewRCQP(e.cq, e.cq, QPCaps{MaxSend: 16, MaxRecv: 16, MaxSGE: 2}); err != nil {
		t.Fatal(err)
	}
	if err := e.qp.Init(1, access); err != nil {
		t.Fatal(err)
	}
	port, err := c.Port(1)
	if err != nil {
		t.Fatal(err)
	}
	e.info = QPInfo{QPN: e.qp.QPN(), PSN: 77, LID: port.LID, MTU: port.MTU, RoCE: port.LinkLayer == "ethernet"}
	if e.info.RoCE {
		g := port.GIDs[len(port.GIDs)-1]
		e.info.GID, e.gid = g.Raw, g.Index
	}
	// Closed after the test's registrations (cleanups run last first).
	t.Cleanup(func() { e.close(t) })
	return e
}

func (e *end) close(t testing.TB) {
	t.Helper()
	if e.c == nil {
		return
	}
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Close())
	}
	errs = append(errs, e.cq.Close(), e.ch.Close(), e.pd.Close(), e.c.Close())
	e.c = nil
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

const allAccess = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead

func connect(t testing.TB, a, b *end, o ConnectOptions) {
	t.Helper()
	oa, ob := o, o
	oa.GIDIndex, ob.GIDIndex = a.gid, b.gid
	if err := a.qp.Connect(a.info, b.info, oa); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(b.info, a.info, ob); err != nil {
		t.Fatal(err)
	}
}

// wait polls e's CQ, sleeping on its completion channel between polls,
// until n completions arrived or d passed.
func (e *end) wait(t testing.TB, n int, d time.Duration) []Completion {
	t.Helper()
	var got []Completion
	deadline := time.AfterFunc(d, e.ch.Interrupt)
	defer deadline.Stop()
	buf := make([]Completion, 8)
	for len(got) < n {
		k, err := e.cq.Poll(buf)
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		got = append(got, buf[:k]...)
		if k > 0 {
			continue
		}
		if err := e.cq.Notify(); err != nil {
			t.Fatal(err)
		}
		if k, _ = e.cq.Poll(buf); k > 0 {
			got = append(got, buf[:k]...)
			continue
		}
		ev, err := e.ch.Wait()
		if errors.Is(err, ErrInterrupted) {
			t.Fatalf("%d of %d completions after %v: %+v", len(got), n, d, got)
		}
		if err != nil || !e.cq.Is(ev) {
			t.Fatalf("event: %v", err)
		}
		e.cq.Ack()
	}
	return got
}

func mustReg(t testing.TB, pd *PD, b []byte, access int) *MR {
	t.Helper()
	mr, err := pd.Register(addr(b), uintptr(len(b)), access)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mr.Deregister() })
	return mr
}

// TestLoopback moves data between two QPs of one process on each fake
// device (RoCE addressing by GID, InfiniBand by LID): a SEND into a posted
// receive and a WRITE with immediate straight into registered memory,
// with completions delivered through completion channels.
func TestLoopback(t *testing.T) {
	l := fake(t)
	for _, dev := range []string{"fake_roce0", "fake_ib0"} {
		t.Run(dev, func(t *testing.T) {
			a, b := newEnd(t, l, dev, 64, allAccess), newEnd(t, l, dev, 64, allAccess)
			connect(t, a, b, ConnectOptions{})
			const n = 256 << 10
			src, dst, small := cmem(t, n), cmem(t, n), cmem(t, 4096)
			for i := range src {
				src[i] = byte(i*7 + 3)
			}
			sm, dm, rm := mustReg(t, a.pd, src, 0), mustReg(t, b.pd, dst, allAccess), mustReg(t, b.pd, small, AccessLocalWrite)
			if err := b.qp.PostRecv(1, SGE{uint64(addr(small)), 4096, rm.LKey}); err != nil {
				t.Fatal(err)
			}
			if err := b.qp.PostRecv(2, SGE{uint64(addr(small)), 4096, rm.LKey}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostSend(SendWR{WRID: 10, Op: OpSend, Signaled: true, SGE: []SGE{{uint64(addr(src)), 1000, sm.LKey}}}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostSend(SendWR{WRID: 11, Op: OpWriteImm, Signaled: true, SGE: []SGE{{uint64(addr(src)), n, sm.LKey}},
				RemoteAddr: uint64(addr(dst)), RKey: dm.RKey, Imm: 0xabcdef01}); err != nil {
				t.Fatal(err)
			}
			sent := a.wait(t, 2, 10*time.Second)
			recv := b.wait(t, 2, 10*time.Second)
			for _, c := range append(sent, recv...) {
				if err := c.Err(); err != nil {
					t.Fatal(err)
				}
			}
			if sent[0].WRID != 10 || sent[0].Opcode != WCSend || sent[1].WRID != 11 || sent[1].Opcode != WCWrite {
				t.Errorf("send completions %+v", sent)
			}
			if recv[0].WRID != 1 || recv[0].Opcode != WCRecv || recv[0].ByteLen != 1000 || recv[0].QPN != b.qp.QPN() {
				t.Errorf("receive completion %+v", recv[0])
			}
			if recv[1].WRID != 2 || recv[1].Opcode != WCRecvWriteImm || !recv[1].HasImm || recv[1].Imm != 0xabcdef01 || recv[1].ByteLen != n {
				t.Errorf("write-with-immediate completion %+v", recv[1])
			}
			if !bytes.Equal(small[:1000], src[:1000]) || !bytes.Equal(dst, src) {
				t.Fatal("data differs")
			}
		})
	}
}

// TestStateMachine: posting before the QP is ready fails as on hardware,
// and transitions need their attributes.
func TestStateMachine(t *testing.T) {
	l := fake(t)
	c, err := l.OpenDevice("fake_roce0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pd, _ := c.AllocPD()
	defer pd.Close()
	cq, _ := c.NewCQ(8, nil)
	defer cq.Close()
	qp, err := pd.NewRCQP(cq, cq, QPCaps{MaxSend: 2, MaxRecv: 2, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	buf := cmem(t, 4096)
	mr := mustReg(t, pd, buf, AccessLocalWrite)
	sge := SGE{uint64(addr(buf)), 64, mr.LKey}
	if err := qp.PostRecv(1, sge); Errno(err) != syscall.EINVAL {
		t.Errorf("post_recv in RESET: %v, want EINVAL", err)
	}
	if err := qp.PostSend(SendWR{Op: OpSend, SGE: []SGE{sge}}); Errno(err) != syscall.EINVAL {
		t.Errorf("post_send in RESET: %v, want EINVAL", err)
	}
	remote := QPInfo{QPN: 0x123456, MTU: 3, RoCE: true}
	if err := qp.Connect(QPInfo{MTU: 3, RoCE: true}, remote, ConnectOptions{}); Errno(err) != syscall.EINVAL {
		t.Errorf("RESET -> RTR: %v, want EINVAL", err)
	}
	if err := qp.Init(1, allAccess); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostRecv(1, sge); err != nil {
		t.Errorf("post_recv in INIT: %v", err)
	}
	if err := qp.PostRecv(2, sge); err != nil {
		t.Errorf("post_recv in INIT: %v", err)
	}
	if err := qp.PostRecv(3, sge); Errno(err) != syscall.ENOMEM {
		t.Errorf("post_recv on a full queue: %v, want ENOMEM", err)
	}
	if err := qp.PostSend(SendWR{Op: OpSend, SGE: []SGE{sge}}); Errno(err) != syscall.EINVAL {
		t.Errorf("post_send in INIT: %v, want EINVAL", err)
	}
	if err := qp.Connect(QPInfo{MTU: 3, RoCE: true}, QPInfo{QPN: 1, MTU: 3, RoCE: true}, ConnectOptions{GIDIndex: 9}); Errno(err) != syscall.EINVAL {
		t.Errorf("RTR with a GID index past the table: %v, want EINVAL", err)
	}
	if err := qp.Connect(QPInfo{MTU: 5, RoCE: true}, QPInfo{QPN: 1, MTU: 5, RoCE: true}, ConnectOptions{}); Errno(err) != syscall.EINVAL {
		t.Errorf("RTR with a path MTU above the port's: %v, want EINVAL", err)
	}
	if err := qp.ToError(); err != nil {
		t.Fatal(err)
	}
	var wc [4]Completion
	if n, _ := cq.Poll(wc[:]); n != 2 || wc[0].Status != StatusFlush || wc[1].Status != StatusFlush {
		t.Errorf("receives after ERR: %d completions %+v, want 2 flushed", n, wc[:n])
	}
}

func TestRegister(t *testing.T) {
	l := fake(t)
	c, _ := l.OpenDevice("")
	defer c.Close()
	pd, _ := c.AllocPD()
	defer pd.Close()
	buf := cmem(t, 8192)
	if _, err := pd.Register(addr(buf), 4096, AccessRemoteWrite); Errno(err) != syscall.EINVAL {
		t.Errorf("remote write without local write: %v, want EINVAL", err)
	}
	if err := syscall.Mprotect(buf[4096:], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.Register(addr(buf), 8192, AccessLocalWrite); Errno(err) != syscall.EFAULT {
		t.Errorf("memory the process cannot touch: %v, want EFAULT", err)
	}
	if err := syscall.Mprotect(buf[4096:], syscall.PROT_READ); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.Register(addr(buf), 8192, AccessLocalWrite); Errno(err) != syscall.EFAULT {
		t.Errorf("read-only memory with local write: %v, want EFAULT", err)
	}
	mr, err := pd.Register(addr(buf), 8192, 0)
	if err != nil {
		t.Fatalf("read-only memory for sending: %v", err)
	}
	if err := pd.Close(); Errno(err) != syscall.EBUSY {
		t.Errorf("dealloc_pd with a live MR: %v, want EBUSY", err)
	}
	mr.Deregister()
	if _, err := pd.RegisterDmaBuf(0, 0, 4096, addr(buf), AccessLocalWrite); Errno(err) != syscall.EINVAL {
		t.Errorf("dma-buf registration of stdin: %v, want EINVAL", err)
	}
}

// failures run one failing operation each and check the completion the
// requester gets, and that its QP is then in error (a later send flushes).
func TestFailures(t *testing.T) {
	l := fake(t)
	fast := ConnectOptions{Timeout: 1, RetryCnt: 1, RNRRetry: 2, MinRNRTimer: 1}
	tests := []struct {
		name   string
		access int // of b's QP
		setup  func(t *testing.T, a, b *end) SendWR
		want   int
	}{
		{"rnr: send with no receive posted", allAccess, func(t *testing.T, a, b *end) SendWR {
			src := cmem(t, 64)
			return SendWR{Op: OpSend, SGE: []SGE{{uint64(addr(src)), 64, mustReg(t, a.pd, src, 0).LKey}}}
		}, StatusRNRRetryExc},
		{"send longer than the receive", allAccess, func(t *testing.T, a, b *end) SendWR {
			src, dst := cmem(t, 4096), cmem(t, 4096)
			b.qp.PostRecv(1, SGE{uint64(addr(dst)), 100, mustReg(t, b.pd, dst, AccessLocalWrite).LKey})
			return SendWR{Op: OpSend, SGE: []SGE{{uint64(addr(src)), 200, mustReg(t, a.pd, src, 0).LKey}}}
		}, StatusRemInvReq},
		{"write with a wrong rkey", allAccess, func(t *testing.T, a, b *end) SendWR {
			src, dst := cmem(t, 4096), cmem(t, 4096)
			dm := mustReg(t, b.pd, dst, allAccess)
			return SendWR{Op: OpWrite, SGE: []SGE{{uint64(addr(src)), 64, mustReg(t, a.pd, src, 0).LKey}}, RemoteAddr: uint64(addr(dst)), RKey: dm.RKey + 1}
		}, StatusRemAccess},
		{"write past the region", allAccess, func(t *testing.T, a, b *end) SendWR {
			src, dst := cmem(t, 8192), cmem(t, 8192)
			dm := mustReg(t, b.pd, dst[:4096], allAccess)
			return SendWR{Op: OpWrite, SGE: []SGE{{uint64(addr(src)), 128, mustReg(t, a.pd, src, 0).LKey}}, RemoteAddr: uint64(addr(dst)) + 4000, RKey: dm.RKey}
		}, StatusRemAccess},
		{"write to a region without remote write", allAccess, func(t *testing.T, a, b *end) SendWR {
			src, dst := cmem(t, 4096), cmem(t, 4096)
			dm := mustReg(t, b.pd, dst, AccessLocalWrite)
			return SendWR{Op: OpWrite, SGE: []SGE{{uint64(addr(src)), 64, mustReg(t, a.pd, src, 0).LKey}}, RemoteAddr: uint64(addr(dst)), RKey: dm.RKey}
		}, StatusRemAccess},
		{"write to a QP without remote write", AccessLocalWrite, func(t *testing.T, a, b *end) SendWR {
			src, dst := cmem(t, 4096), cmem(t, 4096)
			dm := mustReg(t, b.pd, dst, allAccess)
			return SendWR{Op: OpWrite, SGE: []SGE{{uint64(addr(src)), 64, mustReg(t, a.pd, src, 0).LKey}}, RemoteAddr: uint64(addr(dst)), RKey: dm.RKey}
		}, StatusRemAccess},
		{"local key of another PD", allAccess, func(t *testing.T, a, b *end) SendWR {
			src := cmem(t, 4096)
			return SendWR{Op: OpSend, SGE: []SGE{{uint64(addr(src)), 64, mustReg(t, b.pd, src, 0).LKey}}}
		}, StatusLocProt},
		{"peer QP destroyed", allAccess, func(t *testing.T, a, b *end) SendWR {
			src := cmem(t, 64)
			b.qp.Close()
			b.qp = nil
			return SendWR{Op: OpSend, SGE: []SGE{{uint64(addr(src)), 64, mustReg(t, a.pd, src, 0).LKey}}}
		}, StatusRetryExc},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := newEnd(t, l, "fake_roce0", 16, allAccess), newEnd(t, l, "fake_roce0", 16, tt.access)
			connect(t, a, b, fast)
			wr := tt.setup(t, a, b)
			wr.WRID, wr.Signaled = 5, true
			if err := a.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			got := a.wait(t, 1, 20*time.Second)[0]
			if got.Status != tt.want || got.WRID != 5 {
				t.Fatalf("completion %+v (%v), want status %d (%s)", got, got.Err(), tt.want, StatusString(tt.want))
			}
			wr.WRID = 6
			if err := a.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			if got := a.wait(t, 1, 10*time.Second)[0]; got.Status != StatusFlush || got.WRID != 6 {
				t.Fatalf("send after the error: %+v, want flushed", got)
			}
		})
	}
}

// TestMisaddressed: a connection whose address vector does not reach the
// peer's port (a GID of the wrong RoCE type, an IB LID of another port) is
// dropped by the fabric: transport retries, then RETRY_EXC_ERR.
func TestMisaddressed(t *testing.T) {
	l := fake(t)
	fast := ConnectOptions{Timeout: 1, RetryCnt: 1, RNRRetry: 1}
	for _, dev := range []string{"fake_roce0", "fake_ib0"} {
		t.Run(dev, func(t *testing.T) {
			a, b := newEnd(t, l, dev, 16, allAccess), newEnd(t, l, dev, 16, allAccess)
			if a.info.RoCE {
				a.gid = 2 // the RoCE v1 entry of the address b addresses a by (v2)
			} else {
				b.info.LID = 0x12
			}
			connect(t, a, b, fast)
			src := cmem(t, 64)
			if err := a.qp.PostSend(SendWR{WRID: 1, Op: OpSend, Signaled: true, SGE: []SGE{{uint64(addr(src)), 64, mustReg(t, a.pd, src, 0).LKey}}}); err != nil {
				t.Fatal(err)
			}
			if got := a.wait(t, 1, 20*time.Second)[0]; got.Status != StatusRetryExc {
				t.Fatalf("completion %+v, want RETRY_EXC_ERR", got)
			}
		})
	}
}

func TestCQOverflow(t *testing.T) {
	l := fake(t)
	a, b := newEnd(t, l, "fake_ib0", 2, allAccess), newEnd(t, l, "fake_ib0", 16, allAccess)
	connect(t, a, b, ConnectOptions{})
	src, dst := cmem(t, 4096), cmem(t, 4096)
	sm, dm := mustReg(t, a.pd, src, 0), mustReg(t, b.pd, dst, allAccess)
	for i := range 4 {
		if err := a.qp.PostSend(SendWR{WRID: uint64(i), Op: OpWrite, Signaled: true, SGE: []SGE{{uint64(addr(src)), 64, sm.LKey}},
			RemoteAddr: uint64(addr(dst)), RKey: dm.RKey}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	var wc [1]Completion
	for {
		if _, err := a.cq.Poll(wc[:]); errors.Is(err, ErrCQOverflow) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("4 completions on a CQ of 2 polled without an overrun")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCrossProcess: a second process (this test binary, re-run) opens the
// fake, and the two connect their QPs through information exchanged over
// pipes; the child SENDs a message and WRITEs with immediate into this
// process's memory.
func TestCrossProcess(t *testing.T) {
	if os.Getenv("NEXAR_RDMA_CHILD") != "" {
		crossChild()
		return
	}
	l := fake(t)
	a := newEnd(t, l, "fake_ib0", 16, allAccess)
	dst, msg := cmem(t, 1<<20), cmem(t, 4096)
	dm, mm := mustReg(t, a.pd, dst, allAccess), mustReg(t, a.pd, msg, AccessLocalWrite)
	for i := range 2 {
		if err := a.qp.PostRecv(uint64(i), SGE{uint64(addr(msg)), 4096, mm.LKey}); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrossProcess$")
	cmd.Env = append(os.Environ(), "NEXAR_RDMA_CHILD="+l.Path())
	in, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	var out strings.Builder // the child's output, for failures; read after lines closes
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	fmt.Fprintf(in, "%d %d %x %d %d\n", a.info.QPN, a.info.LID, uint64(addr(dst)), dm.RKey, len(dst))
	// The child prints its QP's info.
	var childQPN, childLID int
	for line := range lines {
		out.WriteString(line + "\n")
		if _, err := fmt.Sscanf(line, "QP %d %d", &childQPN, &childLID); err == nil {
			break
		}
	}
	if childQPN == 0 {
		cmd.Wait()
		t.Fatalf("child said no QP: %s", out.String())
	}
	go func() {
		for range lines {
		}
	}()
	remote := QPInfo{QPN: uint32(childQPN), PSN: 77, LID: uint16(childLID), MTU: a.info.MTU}
	if err := a.qp.Connect(a.info, remote, ConnectOptions{}); err != nil {
		t.Fatal(err)
	}
	in.Close() // go
	got := a.wait(t, 2, 20*time.Second)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	for _, c := range got {
		if err := c.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if got[0].Opcode != WCRecv || string(msg[:got[0].ByteLen]) != "hello from the other process" {
		t.Errorf("SEND: %+v %q", got[0], msg[:got[0].ByteLen])
	}
	if got[1].Opcode != WCRecvWriteImm || got[1].Imm != 42 {
		t.Errorf("WRITE_WITH_IMM: %+v", got[1])
	}
	for i, v := range dst {
		if v != byte(i%251) {
			t.Fatalf("byte %d of the remote write is %d, want %d", i, v, i%251)
		}
	}
}

func crossChild() {
	fail := func(err error) {
		fmt.Println("child:", err)
		os.Exit(1)
	}
	l, err := Open(os.Getenv("NEXAR_RDMA_CHILD"))
	if err != nil {
		fail(err)
	}
	var qpn, lid, rkey, n int
	var raddr uint64
	if _, err := fmt.Scanf("%d %d %x %d %d\n", &qpn, &lid, &raddr, &rkey, &n); err != nil {
		fail(err)
	}
	e := newEnd(&childT{}, l, "fake_ib0", 16, allAccess)
	fmt.Printf("QP %d %d\n", e.info.QPN, e.info.LID)
	if err := e.qp.Connect(e.info, QPInfo{QPN: uint32(qpn), PSN: 77, LID: uint16(lid), MTU: e.info.MTU}, ConnectOptions{}); err != nil {
		fail(err)
	}
	b := make([]byte, 1)
	os.Stdin.Read(b) // until the parent is connected
	src, _ := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	for i := range src {
		src[i] = byte(i % 251)
	}
	hello := copy(src, "hello from the other process")
	sm, err := e.pd.Register(addr(src), uintptr(n), 0)
	if err != nil {
		fail(err)
	}
	if err := e.qp.PostSend(SendWR{WRID: 1, Op: OpSend, Signaled: true, SGE: []SGE{{uint64(addr(src)), uint32(hello), sm.LKey}}}); err != nil {
		fail(err)
	}
	if got := e.wait(&childT{}, 1, 20*time.Second); got[0].Status != 0 {
		fail(got[0].Err())
	}
	for i := range hello {
		src[i] = byte(i % 251) // the NIC read them when it executed the SEND
	}
	if err := e.qp.PostSend(SendWR{WRID: 2, Op: OpWriteImm, Signaled: true, SGE: []SGE{{uint64(addr(src)), uint32(n), sm.LKey}},
		RemoteAddr: raddr, RKey: uint32(rkey), Imm: 42}); err != nil {
		fail(err)
	}
	if got := e.wait(&childT{}, 1, 20*time.Second); got[0].Status != 0 {
		fail(got[0].Err())
	}
	os.Exit(0)
}

// childT is the testing.TB of the child process: failures exit.
type childT struct{ testing.TB }

func (childT) Helper() {}
func (childT) Fatal(args ...any) {
	fmt.Println(args...)
	os.Exit(1)
}
func (childT) Fatalf(f string, args ...any) {
	fmt.Printf(f+"\n", args...)
	os.Exit(1)
}
func (childT) Error(args ...any) { fmt.Println(args...) }
func (childT) Cleanup(func())    {}

// TestLeaks: after every object was destroyed the fake holds none.
func TestLeaks(t *testing.T) {
	l := fake(t)
	before, err := ibverbs.Live(l.Path())
	if err != nil {
		t.Fatal(err)
	}
	a, b := newEnd(t, l, "fake_roce0", 16, allAccess), newEnd(t, l, "fake_roce0", 16, allAccess)
	connect(t, a, b, ConnectOptions{})
	buf := cmem(t, 4096)
	mr, err := a.pd.Register(addr(buf), 4096, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	mid, _ := ibverbs.Live(l.Path())
	if mid.QPs != before.QPs+2 || mid.CQs != before.CQs+2 {
		t.Fatalf("live objects with two ends: %+v (before %+v)", mid, before)
	}
	mr.Deregister()
	a.close(t)
	b.close(t)
	if after, _ := ibverbs.Live(l.Path()); after != before {
		t.Fatalf("live objects after close: %+v, before %+v", after, before)
	}
}

// TestHardwareLoopback runs the loopback test on the first real device.
func TestHardwareLoopback(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("skipping: no RDMA hardware to test on: %v", err)
	}
	l, _ := Default()
	devs, _ := l.Devices()
	a, b := newEnd(t, l, devs[0].Name, 64, allAccess), newEnd(t, l, devs[0].Name, 64, allAccess)
	connect(t, a, b, ConnectOptions{})
	src, dst := cmem(t, 1<<20), cmem(t, 1<<20)
	for i := range src {
		src[i] = byte(i)
	}
	sm, dm := mustReg(t, a.pd, src, 0), mustReg(t, b.pd, dst, allAccess)
	b.qp.PostRecv(1, SGE{uint64(addr(dst)), 16, dm.LKey})
	if err := a.qp.PostSend(SendWR{WRID: 1, Op: OpWriteImm, Signaled: true, SGE: []SGE{{uint64(addr(src)), 1 << 20, sm.LKey}},
		RemoteAddr: uint64(addr(dst)), RKey: dm.RKey, Imm: 7}); err != nil {
		t.Fatal(err)
	}
	a.wait(t, 1, 10*time.Second)
	b.wait(t, 1, 10*time.Second)
	if !bytes.Equal(src, dst) {
		t.Fatal("data differs")
	}
}
