//go:build cgo

package multiproc

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
)

// TestRDMAFake runs the check program (every collective and p2p pattern,
// verified) in separate processes with the data path forced onto RDMA
// (NEXAR_BULK=rdma) over the fake libibverbs (NEXAR_IBVERBS), on each of
// its devices: RoCE v2 addressing by GID and InfiniBand by LID. Every rank
// must report its data path to every peer as RDMA and its results correct.
func TestRDMAFake(t *testing.T) {
	lib, err := ibverbs.Cached()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		hca, path string
		n         int
	}{
		{"fake_roce0", "rdma fake_roce0:1 roce v2", 2},
		{"fake_ib0", "rdma fake_ib0:1 ib lid 0x11", 3},
	} {
		t.Run(tc.hca, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, nexarBin, "run", "-n", fmt.Sprint(tc.n), "--", testprogBin, "check")
			cmd.Env = cleanEnv("NEXAR_BULK=rdma", "NEXAR_IBVERBS="+lib, "NEXAR_IB_HCA="+tc.hca)
			var o, e bytes.Buffer
			cmd.Stdout, cmd.Stderr = &o, &e
			start := time.Now()
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, o.String(), e.String())
			}
			out := o.String()
			for r := range tc.n {
				if !strings.Contains(out, fmt.Sprintf("[%d] CHECKED rank=%d size=%d\n", r, r, tc.n)) {
					t.Errorf("rank %d did not report CHECKED", r)
				}
				for p := range tc.n {
					if p != r && !strings.Contains(out, fmt.Sprintf("[%d] PATH rank=%d peer=%d %s\n", r, r, p, tc.path)) {
						t.Errorf("rank %d: path to %d is not %q", r, p, tc.path)
					}
				}
			}
			if t.Failed() {
				t.Logf("stdout:\n%s\nstderr:\n%s", out, e.String())
			}
			t.Logf("%d ranks checked over %s in %v", tc.n, tc.path, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestRDMAKillRank SIGKILLs one of 3 ranks looping on 4 MiB allreduces
// whose data goes over RDMA (the fake libibverbs): every survivor's
// pending allreduce fails within 5 s naming the dead rank, whichever
// detector sees it first (its process exit on this host, the NIC's
// retries, the heartbeats).
func TestRDMAKillRank(t *testing.T) {
	lib, err := ibverbs.Cached()
	if err != nil {
		t.Fatal(err)
	}
	killLooping(t, 3, 1, syscall.SIGKILL, []string{"NEXAR_BULK=rdma", "NEXAR_IBVERBS=" + lib}, []string{"4194304"}, 5*time.Second, "")
}
