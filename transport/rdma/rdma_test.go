//go:build cgo

package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
	"github.com/nexar-go/nexar/transport/transporttest"
)

// fakeLib is the fake libibverbs, built once for every test binary.
func fakeLib(t testing.TB) string {
	t.Helper()
	path, err := ibverbs.Cached()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func openDev(t testing.TB, o Options) *Device {
	t.Helper()
	o.Library = fakeLib(t)
	d, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
	return d
}

// pair connects a sending end on a to a receiving end on b.
func pair(t testing.TB, a, b *Device) (tx, rx *End) {
	t.Helper()
	rx, offer, err := b.listen(0)
	if err != nil {
		t.Fatal(err)
	}
	tx, answer, err := a.dial(1, offer)
	if err != nil {
		t.Fatal(err)
	}
	if err := rx.Accept(answer); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Close(); rx.Close() })
	return tx, rx
}

func pattern(seed uint64, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), 7}).Read(b)
	return b
}

func TestOpen(t *testing.T) {
	lib := fakeLib(t)
	tests := []struct {
		o    Options
		want string
	}{
		{Options{}, "fake_roce0:1 roce v2"},
		{Options{Device: "fake_ib0"}, "fake_ib0:1 ib lid 0x11"},
		{Options{Device: "fake_roce0", GIDIndex: 1, SetGIDIndex: true}, "fake_roce0:1 roce v2 gid 1"},
		{Options{Device: "fake_roce0", GIDIndex: 2, SetGIDIndex: true}, "fake_roce0:1 roce v1 gid 2"},
	}
	for _, tt := range tests {
		tt.o.Library = lib
		d, err := Open(tt.o)
		if err != nil {
			t.Fatal(err)
		}
		if d.Describe() != tt.want {
			t.Errorf("%+v: %q, want %q", tt.o, d.Describe(), tt.want)
		}
		d.Close()
	}
	for _, o := range []Options{{Device: "mlx5_9"}, {Device: "fake_roce0", Port: 2}, {GIDIndex: 9, SetGIDIndex: true}} {
		o.Library = lib
		if d, err := Open(o); err == nil {
			d.Close()
			t.Errorf("Open(%+v) succeeded", o)
		}
	}
	t.Setenv("NEXAR_FAKE_IBV_PORT_DOWN", "1")
	if _, err := Open(Options{Library: lib}); err == nil || !strings.Contains(err.Error(), "no active port") {
		t.Errorf("with every port down: %v", err)
	}
}

// frames writes each buffer as bulk does: a 64-byte prefix, then the
// payload (inline when short).
func writeFrames(ctx context.Context, tx *End, sizes []int) error {
	for i, n := range sizes {
		pre := pattern(uint64(1000+i), 64)
		p := pattern(uint64(i), n)
		var err error
		if n <= 32<<10 {
			_, err = tx.Write(ctx, append(pre, p...))
		} else {
			_, err = tx.Write(ctx, pre, p)
		}
		if err != nil {
			return fmt.Errorf("frame %d (%d bytes): %w", i, n, err)
		}
	}
	return nil
}

func readFrames(rx *End, sizes []int) error {
	for i, n := range sizes {
		pre := make([]byte, 64)
		if _, err := io.ReadFull(rx, pre); err != nil {
			return fmt.Errorf("frame %d prefix: %w", i, err)
		}
		p := make([]byte, n)
		if _, err := io.ReadFull(rx, p); err != nil {
			return fmt.Errorf("frame %d payload: %w", i, err)
		}
		if !bytes.Equal(pre, pattern(uint64(1000+i), 64)) || !bytes.Equal(p, pattern(uint64(i), n)) {
			return fmt.Errorf("frame %d (%d bytes) differs", i, n)
		}
	}
	return nil
}

// TestStream: frames of every size class (inline, SEND in pieces, RDMA
// WRITE) arrive whole and in order over each device, with the reader
// reading payloads into buffers of their exact size.
func TestStream(t *testing.T) {
	sizes := []int{0, 1, 100, 32 << 10, 40 << 10, 64<<10 - 1, 64 << 10, 100_003, 1 << 20, 3<<20 + 5, 17}
	for _, dev := range []string{"fake_roce0", "fake_ib0"} {
		t.Run(dev, func(t *testing.T) {
			a, b := openDev(t, Options{Device: dev}), openDev(t, Options{Device: dev})
			tx, rx := pair(t, a, b)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			all := append(append(sizes, sizes...), sizes...)
			errc := make(chan error, 1)
			go func() { errc <- writeFrames(ctx, tx, all) }()
			if err := readFrames(rx, all); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			rx.mu.Lock()
			defer rx.mu.Unlock()
			if large := 3 * 4; rx.written != large || rx.staged != 0 {
				t.Errorf("%d payloads written into the reader's buffer and %d into a temporary one, want %d and 0", rx.written, rx.staged, large)
			}
		})
	}
}

// TestShortReads: a reader whose buffers are smaller than what was
// written by WRITE (a temporary buffer then serves it) or by SEND.
func TestShortReads(t *testing.T) {
	a, b := openDev(t, Options{Device: "fake_ib0"}), openDev(t, Options{Device: "fake_ib0"})
	tx, rx := pair(t, a, b)
	want := pattern(9, 3<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := tx.Write(ctx, want[:1000], want[1000:200_000], want[200_000:200_100], want[200_100:])
		errc <- err
	}()
	got := make([]byte, 0, len(want))
	buf := make([]byte, 7777)
	for len(got) < len(want) {
		n, err := rx.Read(buf[:1+rand.IntN(len(buf))])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("stream differs")
	}
	rx.mu.Lock()
	defer rx.mu.Unlock()
	if rx.staged == 0 {
		t.Error("no buffer went through a temporary one: the short reads did not test it")
	}
}

// TestCredits: many short messages to a reader that starts late: the
// sender waits for credits instead of overrunning the receive buffers
// (which would end in RNR errors), then everything arrives.
func TestCredits(t *testing.T) {
	a, b := openDev(t, Options{Device: "fake_roce0", Slots: 4}), openDev(t, Options{Device: "fake_roce0", Slots: 4})
	tx, rx := pair(t, a, b)
	const msgs = 200
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var sent sync.WaitGroup
	sent.Add(1)
	var wrote int
	go func() {
		defer sent.Done()
		for i := range msgs {
			if _, err := tx.Write(ctx, []byte(fmt.Sprintf("message %04d;", i))); err != nil {
				t.Error(err)
				return
			}
			wrote = i + 1
		}
	}()
	time.Sleep(300 * time.Millisecond)
	tx.mu.Lock()
	credits := tx.credits
	tx.mu.Unlock()
	if credits != 0 {
		t.Errorf("sender holds %d credits while the reader reads nothing", credits)
	}
	var got strings.Builder
	buf := make([]byte, 64)
	for got.Len() < msgs*len("message 0000;") {
		n, err := rx.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got.Write(buf[:n])
	}
	sent.Wait()
	for i := range msgs {
		if !strings.Contains(got.String(), fmt.Sprintf("message %04d;", i)) {
			t.Fatalf("message %d missing (wrote %d)", i, wrote)
		}
	}
}

// TestLeaks: closing both ends and both devices leaves no QP, CQ, MR or
// goroutine behind, also after a failure.
func TestLeaks(t *testing.T) {
	lib := fakeLib(t)
	before := runtime.NumGoroutine()
	for _, fail := range []bool{false, true} {
		a, _ := Open(Options{Library: lib})
		b, _ := Open(Options{Library: lib})
		base, err := ibverbs.Live(lib)
		if err != nil {
			t.Fatal(err)
		}
		tx, rx, err := connectPair(a, b)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if fail {
			waitGranted(t, tx)
			rx.qp.ToError()
		}
		errc := make(chan error, 1)
		go func() { errc <- writeFrames(ctx, tx, []int{10, 1 << 20}) }()
		if !fail {
			if err := readFrames(rx, []int{10, 1 << 20}); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-errc; (err != nil) != fail {
			t.Fatalf("fail=%v: write: %v", fail, err)
		}
		mid, _ := ibverbs.Live(lib)
		if mid.QPs != base.QPs+2 {
			t.Errorf("%d QPs with one channel, %d before", mid.QPs, base.QPs)
		}
		tx.Close()
		rx.Close()
		if err := errors.Join(a.Close(), b.Close()); err != nil {
			t.Fatal(err)
		}
		after, _ := ibverbs.Live(lib)
		if after.QPs != base.QPs-0 || after.MRs != base.MRs-0 || after.CQs != base.CQs || after.PDs != base.PDs-2 || after.Contexts != base.Contexts-2 {
			t.Errorf("fail=%v: live objects %+v after close, %+v with the two devices open", fail, after, base)
		}
	}
	transporttest.CheckGoroutines(t, before)
}

func connectPair(a, b *Device) (tx, rx *End, err error) {
	rx, offer, err := b.listen(0)
	if err != nil {
		return nil, nil, err
	}
	tx, answer, err := a.dial(1, offer)
	if err != nil {
		rx.Close()
		return nil, nil, err
	}
	if err := rx.Accept(answer); err != nil {
		tx.Close()
		rx.Close()
		return nil, nil, err
	}
	return tx, rx, nil
}

// waitGranted waits until the sending end has its first credits.
func waitGranted(t testing.TB, tx *End) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		tx.mu.Lock()
		ok := tx.granted
		tx.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no credits from the receiving end")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHardwareStream runs the stream test on the first active port of the
// real libibverbs (NEXAR_IBVERBS, else libibverbs.so.1), loopback between
// two queue pairs; it skips, saying why, where there is none.
func TestHardwareStream(t *testing.T) {
	// core's knob table reads NEXAR_IB_HCA and NEXAR_IB_GID_INDEX; this
	// test takes the library only.
	opt := Options{Library: os.Getenv("NEXAR_IBVERBS")}
	a, err := Open(opt)
	if err != nil {
		t.Skipf("skipping: no RDMA hardware to test on: %v", err)
	}
	defer a.Close()
	b, err := Open(opt)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	t.Logf("on %s", a.Describe())
	tx, rx := pair(t, a, b)
	sizes := []int{1, 40 << 10, 64 << 10, 1 << 20, 16 << 20}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- writeFrames(ctx, tx, sizes) }()
	if err := readFrames(rx, sizes); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestSlowReaderIsProbed: a receiver that answers late (its reader is
// busy for 2.5 s) is probed while the sender waits, is found alive each
// time, and gets its buffer intact.
func TestSlowReaderIsProbed(t *testing.T) {
	a := openDev(t, Options{Device: "fake_roce0"})
	b := openDev(t, Options{Device: "fake_roce0"})
	tx, rx := pair(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sizes := []int{4 << 20}
	done := make(chan error, 1)
	go func() { done <- writeFrames(ctx, tx, sizes) }()
	time.Sleep(2500 * time.Millisecond)
	if err := readFrames(rx, sizes); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	tx.mu.Lock()
	probes := tx.probes
	tx.mu.Unlock()
	if probes < 2 {
		t.Errorf("%d probes acknowledged in 2.5 s of waiting, want 2 (one a second)", probes)
	}
}
