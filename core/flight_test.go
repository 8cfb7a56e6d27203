package core

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
)

func TestFlightRecordRing(t *testing.T) {
	cfg := testConfig()
	cfg.FlightRecorderSize = 4
	comms, err := NewLocal(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx := context.Background()
	errs := each(comms, func(c *Comm) error {
		for range 3 {
			if err := c.Allreduce(ctx, nil, make([]byte, 8), collective.Float32, collective.Sum); err != nil {
				return err
			}
		}
		if err := c.Broadcast(ctx, make([]byte, 24), collective.Int64, 1); err != nil {
			return err
		}
		if c.Rank() == 0 {
			return c.Send(ctx, []byte("hello"), 1, 7)
		}
		_, err := c.Recv(ctx, make([]byte, 16), 0, 7)
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	rec := comms[1].FlightRecord()
	if rec.Recorded != 5 || rec.NextSeq != 4 || rec.Rank != 1 || rec.Size != 2 {
		t.Fatalf("record: recorded %d next_seq %d rank %d size %d; want 5 4 1 2", rec.Recorded, rec.NextSeq, rec.Rank, rec.Size)
	}
	if len(rec.Entries) != 4 {
		t.Fatalf("%d entries, want the ring's 4: %+v", len(rec.Entries), rec.Entries)
	}
	// the oldest (the first allreduce) fell out of the ring
	want := []struct {
		op    string
		seq   uint64
		bytes uint64
		dtype string
		root  int
		peer  int
	}{
		{"allreduce", 1, 8, "float32", -1, -2},
		{"allreduce", 2, 8, "float32", -1, -2},
		{"broadcast", 3, 24, "int64", 1, -2},
		{"recv", 0, 16, "", -1, 0},
	}
	for i, w := range want {
		e := rec.Entries[i]
		if e.Op != w.op || e.Seq != w.seq || e.Bytes != w.bytes || e.DType != w.dtype || e.Root != w.root || e.Peer != w.peer {
			t.Errorf("entry %d: %+v; want %+v", i, e, w)
		}
		if e.State != FlightCompleted || e.Start.IsZero() || e.End.Before(e.Start) {
			t.Errorf("entry %d: state %s start %v end %v", i, e.State, e.Start, e.End)
		}
	}
	if e := rec.Entries[3]; e.Tag != 7 || e.ID != 5 {
		t.Errorf("recv entry: tag %d id %d; want 7 5", e.Tag, e.ID)
	}
	if e := comms[0].FlightRecord().Entries[3]; e.Op != "send" || e.Peer != 1 || e.Bytes != 5 {
		t.Errorf("rank 0's last entry: %+v; want the send of 5 bytes to 1", e)
	}
	if c := rec.Entries[2].Call; c != "broadcast(int64, count=3, root=1)" {
		t.Errorf("broadcast's call: %q", c)
	}
}

func TestFlightRecorderOff(t *testing.T) {
	cfg := testConfig()
	cfg.FlightRecorderSize = -1
	comms, err := NewLocal(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	if err := comms[0].Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if rec := comms[0].FlightRecord(); len(rec.Entries) != 0 || rec.Recorded != 0 {
		t.Fatalf("recorder off, but %+v", rec)
	}
}

// reportHas fails t unless some line of the report contains every part.
func reportHas(t *testing.T, report []string, parts ...string) {
	t.Helper()
	for _, l := range report {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(l, p)
		}
		if ok {
			return
		}
	}
	t.Errorf("no report line has %q:\n%s", parts, strings.Join(report, "\n"))
}

// A rank skips a collective: the others time out and dump their records
// (Config.FlightRecorderDir), the skipper dumps on request; the report names
// the rank that never called and the call.
func TestFlightReportSkippedCall(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig()
	cfg.Timeout = 700 * time.Millisecond
	cfg.FlightRecorderDir = dir
	comms, err := NewLocal(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx := context.Background()
	errs := each(comms, func(c *Comm) error {
		if err := c.Allreduce(ctx, nil, make([]byte, 8), collective.Float32, collective.Sum); err != nil {
			return err
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() == 2 {
			return nil // skips the next allreduce
		}
		return c.Allreduce(ctx, nil, make([]byte, 8), collective.Float32, collective.Sum)
	})
	for r := range 2 {
		if CodeOf(errs[r]) != CodeTimeout {
			t.Fatalf("rank %d: %v; want a timeout", r, errs[r])
		}
		// The timeout names whom the call waited for (a rank of the
		// call's ring), not only that it timed out. A rank that hears of
		// the other waiting rank's timeout before its own deadline
		// reports that one, which names whom that rank waited for.
		var e *Error
		own := errors.As(errs[r], &e) && e.Rank >= 0 && e.Rank != r &&
			strings.Contains(e.Msg, fmt.Sprintf("waiting for rank %d's message", e.Rank))
		heard := e != nil && strings.HasPrefix(e.Msg, fmt.Sprintf("rank %d failed: ", 1-r)) &&
			strings.Contains(e.Msg, "waiting for rank ")
		if !own && !heard {
			t.Fatalf("rank %d: %v; want the timeout to name the rank it waited for", r, errs[r])
		}
	}
	for r := range 2 {
		if _, err := os.Stat(filepath.Join(dir, FlightRecordFile(r, comms[r].id))); err != nil {
			t.Fatalf("rank %d did not dump on its timeout: %v", r, err)
		}
	}
	if err := comms[2].DumpFlightRecord(filepath.Join(dir, FlightRecordFile(2, comms[2].id))); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadFlightRecords(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	report := FlightReport(recs)
	t.Logf("report:\n%s", strings.Join(report, "\n"))
	reportHas(t, report, "collective #2 allreduce(float32, count=2, sum) is not complete everywhere")
	reportHas(t, report, "rank 2 never called collective #2 allreduce(float32, count=2, sum)", "its last was #1 barrier")
	reportHas(t, report, "in it: rank 0 (failed:", "rank 1 (failed:")
	for _, l := range report {
		if strings.Contains(l, "rank 0 never") || strings.Contains(l, "rank 1 never") {
			t.Errorf("blames a rank that called: %s", l)
		}
	}
}

// The call that differs: one rank calls broadcast where the others call
// allreduce (every rank fails at once as mismatched); the report names it.
func TestFlightReportDifferentCall(t *testing.T) {
	comms, err := NewLocal(3, testConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	ctx := context.Background()
	each(comms, func(c *Comm) error {
		if c.Rank() == 1 {
			return c.Broadcast(ctx, make([]byte, 8), collective.Float32, 0)
		}
		return c.Allreduce(ctx, nil, make([]byte, 8), collective.Float32, collective.Sum)
	})
	var recs []FlightRecord
	for _, c := range comms {
		recs = append(recs, c.FlightRecord())
	}
	report := FlightReport(recs)
	reportHas(t, report, "collective #0 allreduce(float32, count=2, sum)")
	reportHas(t, report, "rank 1 called broadcast(float32, count=2, root=0) as collective #0 instead")
}

// A receive with no matching send is named, with its peer.
func TestFlightReportP2P(t *testing.T) {
	cfg := testConfig()
	comms, err := NewLocal(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(t, comms)
	req := comms[0].IRecv(make([]byte, 4), 1, 9)
	report := FlightReport([]FlightRecord{comms[0].FlightRecord(), comms[1].FlightRecord()})
	reportHas(t, report, "rank 0: recv from rank 1 (tag 9, 4 bytes) is started", "rank 1's record holds no send to rank 0 with tag 9")
	if err := comms[1].Send(context.Background(), []byte("abcd"), 0, 9); err != nil {
		t.Fatal(err)
	}
	if err := req.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	report = FlightReport([]FlightRecord{comms[0].FlightRecord(), comms[1].FlightRecord()})
	reportHas(t, report, "nothing in flight")
}

func TestFlightDumpOnSignal(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig()
	cfg.FlightRecorderDir = dir
	cfg.FlightDumpOnSignal = true
	comms, err := NewLocal(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, FlightRecordFile(0, comms[0].id))
	read := func() FlightRecord {
		recs, err := ReadFlightRecords(dir)
		if err != nil || len(recs) != 1 {
			return FlightRecord{}
		}
		return recs[0]
	}
	waitFor := func(reason string) FlightRecord {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if r := read(); strings.HasPrefix(r.Reason, reason) {
				return r
			}
		}
		t.Fatalf("no %q record in %s: %+v", reason, path, read())
		return FlightRecord{}
	}
	waitFor("start") // the watcher listens from here on
	if err := comms[0].Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	r := waitFor("signal")
	if len(r.Entries) != 1 || r.Entries[0].Op != "barrier" || r.Final {
		t.Fatalf("signal record: %+v", r)
	}
	comms[0].Close()
	if r := waitFor("closed"); !r.Final {
		t.Fatalf("closing record not final: %+v", r)
	}
}

func TestDebugLogger(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) })
	l, err := newDebugLogger(w, "trace", "COLL,INIT")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("a net record", "subsys", SubsysNet)
	l.With("subsys", SubsysNet).Warn("a net warning")
	l.Info("an init record", "subsys", SubsysInit)
	l.Warn("a record of no subsystem")
	cfg := testConfig()
	cfg.Logger = l
	comms, err := NewLocal(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := comms[0].Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := comms[0].Send(context.Background(), nil, 0, 1); err != nil {
		t.Fatal(err)
	}
	closeAll(t, comms)
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, s := range []string{"an init record", "a record of no subsystem", "nexar: collective started", "nexar: collective ended", "call=barrier"} {
		if !strings.Contains(out, s) {
			t.Errorf("missing %q in:\n%s", s, out)
		}
	}
	for _, s := range []string{"a net", "nexar: send"} {
		if strings.Contains(out, s) {
			t.Errorf("%q passed a filter without NET and P2P:\n%s", s, out)
		}
	}

	buf.Reset()
	l, err = newDebugLogger(w, "WARN", "^COLL")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("info below WARN", "subsys", SubsysInit)
	l.Warn("warn of COLL", "subsys", SubsysColl)
	l.Warn("warn of P2P", "subsys", SubsysP2P)
	if out := buf.String(); strings.Contains(out, "below WARN") || strings.Contains(out, "of COLL") || !strings.Contains(out, "of P2P") {
		t.Errorf("WARN ^COLL:\n%s", out)
	}
	if traceOn(l, SubsysP2P) {
		t.Error("trace on at WARN")
	}
	for _, bad := range [][2]string{{"LOUD", ""}, {"INFO", "COLL,DISK"}} {
		if _, err := newDebugLogger(w, bad[0], bad[1]); err == nil {
			t.Errorf("NEXAR_DEBUG=%s NEXAR_DEBUG_SUBSYS=%s accepted", bad[0], bad[1])
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestDiagnosticsFromEnv(t *testing.T) {
	env := func(kv ...string) func(string) (string, bool) {
		m := map[string]string{"NEXAR_WORLD_SIZE": "1"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	// resolved as New does: the environment, then the defaults (the
	// logger is built there).
	resolved := func(lookup func(string) (string, bool)) (Config, error) {
		cfg, err := ConfigFromLookup(lookup)
		if err != nil {
			return cfg, err
		}
		return cfg.resolve()
	}
	cfg, err := resolved(env("NEXAR_FLIGHT_RECORDER_SIZE", "64", "NEXAR_FLIGHT_RECORDER_DIR", "/tmp/x",
		"NEXAR_FLIGHT_RECORDER_DUMP_ON_SIGNAL", "1", "NEXAR_DEBUG", "INFO", "NEXAR_DEBUG_SUBSYS", "NET"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.FlightRecorderSize != 64 || cfg.FlightRecorderDir != "/tmp/x" || !cfg.FlightDumpOnSignal {
		t.Errorf("config %+v", cfg)
	}
	if _, ok := cfg.Logger.Handler().(*subsysHandler); !ok {
		t.Errorf("NEXAR_DEBUG=INFO: logger %T", cfg.Logger.Handler())
	}
	cfg, err = resolved(env())
	if err != nil || cfg.FlightRecorderSize != defaultFlightRecorderSize || cfg.FlightDumpOnSignal || cfg.Logger != slog.Default() {
		t.Errorf("defaults: %+v, %v", cfg, err)
	}
	for _, bad := range [][]string{
		{"NEXAR_FLIGHT_RECORDER_SIZE", "many"},
		{"NEXAR_FLIGHT_RECORDER_DUMP_ON_SIGNAL", "1"}, // no directory
		{"NEXAR_FLIGHT_RECORDER_DUMP_ON_SIGNAL", "sometimes", "NEXAR_FLIGHT_RECORDER_DIR", "/tmp"},
		{"NEXAR_DEBUG", "VERBOSE"},
	} {
		if _, err := resolved(env(bad...)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// BenchmarkFlightRecord times what an operation adds to its call: its
// entry at the start and at the end (no allocation).
func BenchmarkFlightRecord(b *testing.B) {
	f := newFlightRecorder(Config{FlightRecorderSize: defaultFlightRecorderSize}, slog.New(slog.DiscardHandler), 0, 0)
	sig := signature{kind: collAllreduce, dt: collective.Float32, op: collective.Sum, root: -1, count: 2}
	b.ReportAllocs()
	for i := range b.N {
		f.end(f.startColl(uint64(i), sig, time.Now()), nil)
	}
}
