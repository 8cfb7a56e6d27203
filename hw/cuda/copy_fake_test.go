//go:build cgo

package cuda

import (
	"bytes"
	"runtime"
	"sync"
	"testing"

	"github.com/nexar-go/nexar/tests/fakes/cudart"
)

// TestCopyKeepsGoBufferAlive: CopyToDevice and CopyFromDevice pass the Go
// buffer to the runtime as an integer, which does not keep it alive; while
// the (fake, delayed) copy runs, a collection must not free it. Before
// runtime.KeepAlive this lost data within a few rounds (the source read as
// zeros once its memory was reused).
func TestCopyKeepsGoBufferAlive(t *testing.T) {
	path, err := cudart.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NEXAR_FAKE_CUDA_DELAY_US", "2000")
	rt, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const n = 1 << 20
	fill := func(round int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + round + 1)
		}
		return b
	}
	p, err := rt.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Free(p)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // collect, and reuse what was freed
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			runtime.GC()
			_ = bytes.Repeat([]byte{0}, n)
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	for round := 0; round < 40; round++ {
		if err := rt.CopyToDevice(p, fill(round)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := rt.CopyFromDevice(got, p); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, fill(round)) {
			t.Fatalf("round %d: the device holds other bytes than were copied in", round)
		}
	}
}
