//go:build cgo && linux

package rdma

import (
	"bytes"
	"context"
	"io"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
)

// transfer sends src over tx into dst on rx, as bulk does a frame's
// payload: one WRITE into the reader's buffer.
func transfer(t *testing.T, tx, rx *End, src, dst []byte) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		_, err := tx.Write(context.Background(), src)
		errc <- err
	}()
	if _, err := io.ReadFull(rx, dst); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestRegistrationsLast: 1000 transfers between the same two buffers
// register each once, on each side (the done-when of issue 33's item 6:
// at most 2 registrations per peer).
func TestRegistrationsLast(t *testing.T) {
	lib := fakeLib(t)
	a, b := openDev(t, Options{}), openDev(t, Options{})
	tx, rx := pair(t, a, b)
	const n = 256 << 10
	src, dst := pattern(1, n), make([]byte, n)
	before, err := ibverbs.Registrations(lib)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		src[i%n] ^= byte(i) // the data changes, the buffer does not
		transfer(t, tx, rx, src, dst)
		if !bytes.Equal(src, dst) {
			t.Fatalf("transfer %d: the data differs", i)
		}
	}
	after, _ := ibverbs.Registrations(lib)
	sa, sb := a.RegStats(), b.RegStats()
	t.Logf("ibv_reg_mr: %d; sender %+v, receiver %+v", after-before, sa, sb)
	if after-before > 2 || sa.Registered != 1 || sb.Registered != 1 || sa.Reused != 999 || sb.Reused != 999 {
		t.Errorf("1000 transfers of one buffer made %d registrations (sender %+v, receiver %+v), want 1 on each side", after-before, sa, sb)
	}
}

// mapping is memory the test maps and maps anew at the same address, as an
// allocator does that frees a buffer and gives its address to the next.
type mapping struct {
	t      *testing.T
	b      []byte
	shared bool // a memfd, whose pages the fake NIC pins as hardware does
}

func newMapping(t *testing.T, n int, shared bool) *mapping {
	m := &mapping{t: t, shared: shared}
	p, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	m.b = p
	m.remap()
	t.Cleanup(func() { unix.Munmap(m.b) })
	return m
}

// remap unmaps the memory and maps new memory at the same address.
func (m *mapping) remap() {
	a, n := uintptr(unsafe.Pointer(&m.b[0])), uintptr(len(m.b))
	fd, flags := -1, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS
	if m.shared {
		var err error
		if fd, err = unix.MemfdCreate("nexar-test-buffer", 0); err != nil {
			m.t.Fatal(err)
		}
		defer unix.Close(fd)
		if err := unix.Ftruncate(fd, int64(n)); err != nil {
			m.t.Fatal(err)
		}
		flags = unix.MAP_SHARED
	}
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, a, n, 0); e != 0 {
		m.t.Fatal(e)
	}
	p, _, e := unix.Syscall6(unix.SYS_MMAP, a, n, unix.PROT_READ|unix.PROT_WRITE, uintptr(flags|unix.MAP_FIXED), uintptr(fd), 0)
	if e != 0 || p != a {
		m.t.Fatalf("mmap at %#x: %#x, %v", a, p, e)
	}
}

// TestRegistrationAfterRemap: a buffer freed and its address given to new
// memory gets a fresh registration, on the sending and on the receiving
// side. With shared memory the fake NIC, like a real one, reaches the
// pages it pinned, so a stale registration would send the old bytes and
// land the new ones where the buffer no longer is.
func TestRegistrationAfterRemap(t *testing.T) {
	for _, shared := range []bool{true, false} {
		name := "anonymous"
		if shared {
			name = "memfd"
		}
		t.Run(name, func(t *testing.T) {
			a, b := openDev(t, Options{}), openDev(t, Options{})
			tx, rx := pair(t, a, b)
			const n = 128 << 10
			src, dst := newMapping(t, n, shared), newMapping(t, n, shared)
			for round := range 3 {
				if round > 0 {
					src.remap()
					dst.remap()
				}
				want := pattern(uint64(10+round), n)
				copy(src.b, want)
				transfer(t, tx, rx, src.b, dst.b)
				if !bytes.Equal(dst.b, want) {
					t.Fatalf("round %d: the receiver's buffer does not hold what was sent (a stale registration)", round)
				}
			}
			sa, sb := a.RegStats(), b.RegStats()
			if sa.Registered != 3 || sb.Registered != 3 || sa.Stale != 2 || sb.Stale != 2 {
				t.Errorf("sender %+v, receiver %+v: want a fresh registration after each remap (3 made, 2 found stale) on each side", sa, sb)
			}
		})
	}
}

// TestReadOnce: a payload read into a buffer used once (a frame nobody
// placed) leaves no registration behind: one that fits in the receive
// buffers is asked for by SEND and registers nothing on the receiving
// side; a longer one is registered for its read only. A read of the same
// sizes into a buffer that is reused keeps its registration.
func TestReadOnce(t *testing.T) {
	lib := fakeLib(t)
	a, b := openDev(t, Options{Slots: 4, SlotSize: 64 << 10}), openDev(t, Options{Slots: 4, SlotSize: 64 << 10})
	tx, rx := pair(t, a, b)
	for _, n := range []int{128 << 10, 1 << 20} { // within the 4 x 64 KiB receive buffers, and beyond
		src := pattern(uint64(n), n)
		before, err := ibverbs.Registrations(lib)
		if err != nil {
			t.Fatal(err)
		}
		rb, asked := b.RegStats(), rx.asked
		for i := range 3 {
			dst := make([]byte, n) // fresh each time, as bulk's unplaced frames
			errc := make(chan error, 1)
			go func() {
				_, err := tx.Write(context.Background(), src)
				errc <- err
			}()
			if _, err := io.ReadFull(readOnce{rx}, dst); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(src, dst) {
				t.Fatalf("%d bytes, read %d: the data differs", n, i)
			}
		}
		after, _ := ibverbs.Registrations(lib)
		ra := b.RegStats()
		small := n <= 4*(64<<10-hdrSize)
		t.Logf("%d bytes: ibv_reg_mr %d in all, receiver %d, asked by SEND %d, %d kept", n, after-before, ra.Registered-rb.Registered, rx.asked-asked, b.reg.Len())
		switch {
		case small && (ra.Registered != rb.Registered || rx.asked-asked != 3):
			t.Errorf("%d bytes read once 3 times: the receiver registered %d times and asked %d times by SEND, want 0 and 3", n, ra.Registered-rb.Registered, rx.asked-asked)
		case !small && (ra.Registered-rb.Registered != 3 || rx.asked != asked):
			t.Errorf("%d bytes read once 3 times: the receiver registered %d times and asked %d times by SEND, want 3 and 0", n, ra.Registered-rb.Registered, rx.asked-asked)
		}
		if k := b.reg.Len(); k != 0 {
			t.Errorf("%d bytes read once: the receiver keeps %d registrations, want none", n, k)
		}
	}
	// The same sizes into a buffer that is reused: registered once, kept.
	dst := make([]byte, 128<<10)
	transfer(t, tx, rx, pattern(9, len(dst)), dst)
	transfer(t, tx, rx, pattern(9, len(dst)), dst)
	if k := b.reg.Len(); k != 1 {
		t.Errorf("a buffer read twice: %d registrations kept, want 1", k)
	}
}

type readOnce struct{ e *End }

func (r readOnce) Read(p []byte) (int, error) { return r.e.ReadOnce(p) }
