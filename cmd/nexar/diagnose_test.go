package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/transport/mesh"
)

// testRank is this test binary started as a rank by nexar run (TestMain,
// NEXAR_TEST_RANK_MODE): "skip": an allreduce and a barrier on every rank,
// then every rank but the last calls another allreduce, which the last
// never calls; it waits to be stopped.
func testRank(mode string) int {
	cfg, err := core.ConfigFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	c, err := core.New(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	buf := make([]byte, 8)
	if err := c.Allreduce(ctx, nil, buf, collective.Float32, collective.Sum); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := c.Barrier(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if mode == "skip" && c.Rank() == c.Size()-1 {
		fmt.Println("skipping the allreduce")
		select {} // until nexar run stops the job
	}
	if err := c.Allreduce(ctx, nil, buf, collective.Float32, collective.Sum); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c.Close()
	return 0
}

// A job where one rank skips a collective: nexar run's watchdog sees no
// progress, collects every rank's flight record (SIGUSR1) and names the
// rank that never called, and the call; nexar diagnose says the same.
func TestRunHangReport(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NEXAR_TEST_RANK_MODE", "skip") // for the ranks
	t.Setenv("NEXAR_TIMEOUT", "120s")        // the watchdog, not the timeout, reports
	dir := t.TempDir()
	var o, e syncBuffer
	sigs := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() {
		done <- launch(runOptions{n: 3, bind: "127.0.0.1", grace: 2 * time.Second, prog: []string{exe},
			stdout: &o, stderr: &e, signals: sigs, flightDir: dir, hang: time.Second})
	}()
	const want = "rank 2 never called collective #2 allreduce(float32, count=2, sum)"
	deadline := time.Now().Add(90 * time.Second)
	for !strings.Contains(e.String(), want) {
		select {
		case err := <-done:
			t.Fatalf("the job ended (%v) without the report:\nstdout:\n%s\nstderr:\n%s", err, o.String(), e.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			sigs <- syscall.SIGKILL
			<-done
			t.Fatalf("no report naming rank 2:\nstdout:\n%s\nstderr:\n%s", o.String(), e.String())
		}
	}
	sigs <- syscall.SIGTERM
	<-done
	report := e.String()
	t.Logf("nexar run's stderr:\n%s", report)
	for _, s := range []string{"no rank progressed in 1s", "in it: rank 0 (waiting", "rank 1 (waiting"} {
		if !strings.Contains(report, s) {
			t.Errorf("report lacks %q:\n%s", s, report)
		}
	}
	if strings.Contains(report, "rank 0 never") || strings.Contains(report, "rank 1 never") {
		t.Errorf("report blames a rank that called:\n%s", report)
	}
	var d, de syncBuffer
	if c := mainErr([]string{"diagnose", dir}, &d, &de); c != 0 || !strings.Contains(d.String(), want) {
		t.Errorf("nexar diagnose: status %d\n%s%s", c, d.String(), de.String())
	}
	if c := mainErr([]string{"diagnose", t.TempDir()}, &d, &de); c == 0 {
		t.Error("nexar diagnose of an empty directory succeeded")
	}
}
