//go:build cgo

package rdma

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
	"github.com/nexar-go/nexar/transport/transporttest"
)

// TestPeerKilledMidWrite: the receiving end is another process, SIGKILLed
// while a 64 MiB buffer is on its way to it: after it took the buffer's
// announcement and before it answered (the sender waits for the answer
// with nothing of its own in flight, so only its probe can tell), and
// right after it answered (the RDMA WRITE is under way). The sender's
// Write fails within seconds with an error naming the peer (the NIC's
// transport retries run out), and closing leaves no queue pair, region or
// goroutine behind.
func TestPeerKilledMidWrite(t *testing.T) {
	if os.Getenv("NEXAR_RDMA_KILL_CHILD") != "" {
		killChild()
		return
	}
	for _, c := range []struct{ name, at string }{{"before the CTS", "rts"}, {"mid-WRITE", "cts"}} {
		t.Run(c.name, func(t *testing.T) { peerKilled(t, c.at) })
	}
}

// peerKilled kills the receiving process once its Read reached stage at.
func peerKilled(t *testing.T, at string) {
	lib := fakeLib(t)
	before := runtime.NumGoroutine()
	a, err := Open(Options{Library: lib, Device: "fake_roce0"})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerKilledMidWrite$")
	cmd.Env = append(os.Environ(), "NEXAR_RDMA_KILL_CHILD="+lib, "NEXAR_RDMA_KILL_AT="+at)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 8)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(prefix string) string {
		select {
		case l, ok := <-lines:
			if !ok || !strings.HasPrefix(l, prefix) {
				t.Fatalf("child said %q, want %s", l, prefix)
			}
			return strings.TrimPrefix(l, prefix)
		case <-time.After(20 * time.Second):
			t.Fatalf("child silent, want %s", prefix)
		}
		return ""
	}
	offer, _ := hex.DecodeString(next("OFFER "))
	tx, answer, err := a.dial(1, offer)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(in, "%x\n", answer)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- writeFrames(ctx, tx, []int{64 << 20}) }()
	next("READING")
	next("AT " + at)
	cmd.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	cmd.Wait()
	select {
	case err := <-done:
		if err == nil {
			if at == "rts" {
				t.Fatal("the Write completed though the receiver was killed before it told where to write")
			}
			t.Logf("the WRITE completed before the kill landed (%v)", killed.Sub(start))
		} else {
			if !strings.Contains(err.Error(), "rank 1") {
				t.Errorf("error %q does not name the peer", err)
			}
			t.Logf("Write failed %v after the kill: %v", time.Since(killed).Round(time.Millisecond), err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Write still blocked 20 s after the peer was killed")
	}
	// A later write fails too, at once.
	if _, err := tx.Write(ctx, []byte("after")); err == nil {
		// Only possible if the first write completed before the kill:
		// the next message then meets the dead peer.
		if _, err := tx.Write(ctx, make([]byte, 1<<20)); err == nil {
			t.Error("writes to a killed peer succeed")
		}
	}
	tx.Close()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if after, _ := ibverbs.Live(lib); after.QPs != 0 || after.MRs != 0 || after.CQs != 0 || after.Channels != 0 {
		t.Errorf("live objects after close: %+v", after)
	}
	transporttest.CheckGoroutines(t, before)
}

func killChild() {
	d, err := Open(Options{Library: os.Getenv("NEXAR_RDMA_KILL_CHILD"), Device: "fake_roce0"})
	if err != nil {
		fmt.Println("child:", err)
		os.Exit(1)
	}
	at := os.Getenv("NEXAR_RDMA_KILL_AT")
	buf := make([]byte, 64<<20)
	d.stage = func(s string) {
		if s != at {
			return
		}
		// Mid-WRITE: once the first bytes landed (the NIC writes the
		// buffer from its start; the sender's pattern is not all zero).
		for deadline := time.Now().Add(20 * time.Second); s == "cts" && bytes.Count(buf[:4096], []byte{0}) == 4096; {
			if time.Now().After(deadline) {
				fmt.Println("child: no byte of the WRITE landed in 20 s")
				os.Exit(1)
			}
			time.Sleep(50 * time.Microsecond)
		}
		fmt.Println("AT " + s)
		time.Sleep(time.Hour) // killed in here
	}
	rx, offer, err := d.listen(0)
	if err != nil {
		fmt.Println("child:", err)
		os.Exit(1)
	}
	fmt.Printf("OFFER %x\n", offer)
	var line string
	fmt.Scanln(&line)
	answer, _ := hex.DecodeString(line)
	if err := rx.Accept(answer); err != nil {
		fmt.Println("child:", err)
		os.Exit(1)
	}
	pre := make([]byte, 64)
	if _, err := io.ReadFull(rx, pre); err != nil {
		fmt.Println("child:", err)
		os.Exit(1)
	}
	fmt.Println("READING")
	io.ReadFull(rx, buf)
	fmt.Println("child: read the buffer; it should have been killed")
	os.Exit(1)
}
