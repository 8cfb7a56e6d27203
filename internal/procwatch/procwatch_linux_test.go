//go:build linux

package procwatch_test

import (
	"github.com/nexar-go/nexar/internal/procwatch"
	"github.com/nexar-go/nexar/internal/procwatch/procwatchtest"

	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// child is procwatchtest.Child without its reap.
func child(t *testing.T) (*exec.Cmd, procwatch.ID) {
	cmd, id, _ := procwatchtest.Child(t)
	return cmd, id
}

func newTestWatch(t *testing.T) (*procwatch.Watch, chan [2]int) {
	t.Helper()
	exits := make(chan [2]int, 8)
	w, err := procwatch.New(func(peer, pid int) { exits <- [2]int{peer, pid} })
	if err != nil {
		t.Skipf("no process watch here: %v", err)
	}
	t.Cleanup(w.Close)
	return w, exits
}

// TestProcWatch: each watched process's exit is reported once, naming its
// peer and pid; a pid whose start time does not match is refused.
func TestProcWatch(t *testing.T) {
	w, exits := newTestWatch(t)
	c1, id1 := child(t)
	c2, id2 := child(t)
	if err := w.Add(1, id1); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(2, id2); err != nil {
		t.Fatal(err)
	}
	if err := w.Add(1, id1); err != nil {
		t.Fatalf("adding a peer again: %v", err)
	}
	reused := id1
	reused.Start++
	if err := w.Add(3, reused); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("a pid with another start time was watched (err %v)", err)
	}
	if !w.Watching(1) || !w.Watching(2) || w.Watching(3) {
		t.Fatal("watching the wrong peers")
	}
	for _, c := range []struct {
		cmd  *exec.Cmd
		peer int
	}{{c2, 2}, {c1, 1}} {
		c.cmd.Process.Kill()
		select {
		case got := <-exits:
			if got != [2]int{c.peer, c.cmd.Process.Pid} {
				t.Fatalf("reported %v, want peer %d pid %d", got, c.peer, c.cmd.Process.Pid)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("exit of peer %d not reported", c.peer)
		}
		if w.Watching(c.peer) {
			t.Fatalf("peer %d still watched after its exit", c.peer)
		}
	}
	// Reaped: the pid is gone (or another process's).
	c1.Wait()
	if err := w.Add(4, id1); err == nil {
		t.Fatal("a reaped process was watched")
	}
	select {
	case got := <-exits:
		t.Fatalf("reported %v twice", got)
	default:
	}
}

// TestProcWatchExitedBeforeAdd: a process that exits (unreaped) before it is
// watched is reported too.
func TestProcWatchExitedBeforeAdd(t *testing.T) {
	w, exits := newTestWatch(t)
	c, id := child(t)
	c.Process.Kill()
	// Not reaped: the pid and its start time stay until Wait.
	for deadline := time.Now().Add(30 * time.Second); ; {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(id.PID) + "/stat")
		if strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("child did not die")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := w.Add(1, id); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-exits:
		if got != [2]int{1, id.PID} {
			t.Fatalf("reported %v", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("exit not reported")
	}
}
