package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/nexar-go/nexar/core"
)

// nexar diagnose DIR: the flight records every rank dumped into DIR
// (NEXAR_FLIGHT_RECORDER_DIR), read together: who waits for whom.
// nexar run --hang-timeout D: a watchdog that asks the ranks for their
// records (SIGUSR1) and prints the same report when none progressed in D.
// docs/diagnostics.md.

const diagnoseSynopsis = "diagnose DIR"

func cmdDiagnose(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("diagnose", diagnoseSynopsis, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	if fs.NArg() != 1 {
		return usageError("diagnose: give the directory of the flight records (nexar %s)", diagnoseSynopsis)
	}
	recs, err := core.ReadFlightRecords(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("diagnose: %w", err)
	}
	for _, l := range core.FlightReport(recs) {
		fmt.Fprintln(stdout, l)
	}
	return nil
}

// progressKey sums up where every rank's communicators stand: it changes
// when any rank records an operation or completes one.
func progressKey(recs []core.FlightRecord) (key string, inFlight bool) {
	var parts []string
	for _, r := range recs {
		var last uint64
		for _, e := range r.Entries {
			if e.State == core.FlightStarted {
				inFlight = true
			} else {
				last = max(last, e.ID)
			}
		}
		parts = append(parts, fmt.Sprintf("%x/%d/%d/%d", r.Comm, r.Rank, r.Recorded, last))
	}
	sort.Strings(parts)
	return strings.Join(parts, " "), inFlight
}

// listening returns the processes whose records say they dump on SIGUSR1:
// those with a record not final (a process installs its handler before
// its first record and removes it after its last, final, one) that ours
// says are still ours (a rank killed before its final record leaves its
// PID behind, which the system may give to another process).
func listening(recs []core.FlightRecord, ours func(pid int) bool) []int {
	seen := map[int]bool{}
	var pids []int
	for _, r := range recs {
		if !r.Final && r.PID > 0 && !seen[r.PID] && ours(r.PID) {
			seen[r.PID] = true
			pids = append(pids, r.PID)
		}
	}
	return pids
}

// watchProgress is nexar run's watchdog: every period it asks every
// listening rank for its flight record (SIGUSR1 to the processes named in
// dir's records, never to one that did not install the handler, nor to one
// in none of the process groups of the ranks: groups), and
// when no rank progressed since the previous round while an operation is
// in flight, prints the report on w, once per stall. It returns when stop
// is closed.
func watchProgress(dir string, period time.Duration, groups []int, w io.Writer, stop <-chan struct{}) {
	ours := func(pid int) bool {
		g, err := syscall.Getpgid(pid)
		return err == nil && slices.Contains(groups, g)
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	prev, reported := "", false
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		recs, err := core.ReadFlightRecords(dir)
		if err != nil {
			continue // no rank has a communicator yet
		}
		for _, pid := range listening(recs, ours) {
			_ = syscall.Kill(pid, syscall.SIGUSR1)
		}
		// The ranks write their records in a few milliseconds.
		select {
		case <-stop:
			return
		case <-time.After(min(period/4, time.Second)):
		}
		if recs, err = core.ReadFlightRecords(dir); err != nil {
			continue
		}
		key, inFlight := progressKey(recs)
		if key != prev || !inFlight {
			prev, reported = key, false
			continue
		}
		if reported {
			continue
		}
		reported = true
		fmt.Fprintf(w, "nexar run: no rank progressed in %v; flight records in %s (nexar diagnose %s):\n", period, dir, dir)
		for _, l := range core.FlightReport(recs) {
			fmt.Fprintf(w, "nexar run: %s\n", l)
		}
	}
}

// flightDir returns the directory for the ranks' flight records: dir, or
// a new temporary one when the watchdog needs one and none was given.
func flightDir(dir string, hang time.Duration) (string, error) {
	if dir != "" || hang <= 0 {
		if dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return "", fmt.Errorf("run: --flight-dir: %w", err)
			}
		}
		return dir, nil
	}
	d, err := os.MkdirTemp("", "nexar-flight-")
	if err != nil {
		return "", fmt.Errorf("run: a directory for flight records: %w", err)
	}
	return d, nil
}
