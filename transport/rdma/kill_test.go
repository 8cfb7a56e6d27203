//go:build cgo

package rdma

import (
	"bufio"
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
// while a 64 MiB RDMA WRITE to it is under way. The sender's Write fails
// within seconds with an error naming the peer (the NIC's transport retries
// run out), and closing leaves no queue pair, region or goroutine behind.
func TestPeerKilledMidWrite(t *testing.T) {
	if os.Getenv("NEXAR_RDMA_KILL_CHILD") != "" {
		killChild()
		return
	}
	lib := fakeLib(t)
	before := runtime.NumGoroutine()
	a, err := Open(Options{Library: lib, Device: "fake_roce0"})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerKilledMidWrite$")
	cmd.Env = append(os.Environ(), "NEXAR_RDMA_KILL_CHILD="+lib)
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
	time.Sleep(5 * time.Millisecond) // the WRITE is on its way (64 MiB)
	cmd.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	cmd.Wait()
	select {
	case err := <-done:
		if err == nil {
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
	io.ReadFull(rx, make([]byte, 64<<20)) // killed in here
	os.Exit(0)
}
