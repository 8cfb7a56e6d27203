package core

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// This file reads the flight records of every rank (flight.go) and says
// who waits for whom: per communicator, the first collective not completed
// everywhere, the ranks waiting in it, the ranks that never called it and
// those that called something else; and the point-to-point operations in
// flight with no counterpart on their peer. `nexar diagnose` prints it.

// ReadFlightRecords reads every flight record file (nexar-flight-*.json) in
// dir.
func ReadFlightRecords(dir string) ([]FlightRecord, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "nexar-flight-*.json"))
	if err != nil {
		return nil, err
	}
	var out []FlightRecord
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var r FlightRecord
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %v", p, err)
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no flight records (nexar-flight-*.json) in %s", dir)
	}
	return out, nil
}

// FlightReport analyses the flight records of the ranks of one or more
// communicators (the latest record per communicator and rank counts) and
// returns its findings, one per line, communicator by communicator. Ranks
// are communicator ranks; "(world w)" follows where they differ.
func FlightReport(recs []FlightRecord) []string {
	byComm := map[uint64]map[int]FlightRecord{}
	for _, r := range recs {
		m := byComm[r.Comm]
		if m == nil {
			m = map[int]FlightRecord{}
			byComm[r.Comm] = m
		}
		if old, ok := m[r.Rank]; !ok || r.Time.After(old.Time) {
			m[r.Rank] = r
		}
	}
	ids := make([]uint64, 0, len(byComm))
	for id := range byComm {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	var out []string
	for _, id := range ids {
		out = append(out, commReport(id, byComm[id])...)
	}
	return out
}

func commReport(id uint64, ranks map[int]FlightRecord) []string {
	size := 0
	var world []int
	for _, r := range ranks {
		size = max(size, r.Size)
		if len(r.World) > len(world) {
			world = r.World
		}
	}
	name := func(r int) string {
		if r < len(world) && world[r] != r {
			return fmt.Sprintf("rank %d (world %d)", r, world[r])
		}
		return fmt.Sprintf("rank %d", r)
	}
	head := fmt.Sprintf("communicator %x (%d ranks)", id, size)
	var out []string
	say := func(f string, a ...any) { out = append(out, head+": "+fmt.Sprintf(f, a...)) }
	var missing []string
	for r := 0; r < size; r++ {
		if _, ok := ranks[r]; !ok {
			missing = append(missing, name(r))
		}
	}
	if len(missing) > 0 {
		say("no flight record from %s (dead, stuck outside nexar, never created the communicator, or no recorder)",
			strings.Join(missing, ", "))
	}

	// Collectives: the first sequence number not completed everywhere.
	coll := map[int]map[uint64]FlightEntry{}
	stuck, found := uint64(0), false
	for r, rec := range ranks {
		m := map[uint64]FlightEntry{}
		for _, e := range rec.Entries {
			if e.Op == "send" || e.Op == "recv" {
				continue
			}
			m[e.Seq] = e
			if e.State != FlightCompleted && (!found || e.Seq < stuck) {
				stuck, found = e.Seq, true
			}
		}
		coll[r] = m
	}
	if found {
		var waiting, never, differ []string
		calls := map[string][]int{}
		for r := 0; r < size; r++ {
			if e, ok := coll[r][stuck]; ok {
				calls[e.Call] = append(calls[e.Call], r)
			}
		}
		// the call most ranks made is "the" call; others differ
		want, wantN := "", 0
		for c, rs := range calls {
			if len(rs) > wantN || len(rs) == wantN && c < want {
				want, wantN = c, len(rs)
			}
		}
		for r := 0; r < size; r++ {
			rec, ok := ranks[r]
			if !ok {
				continue
			}
			e, called := coll[r][stuck]
			switch {
			case called && e.Call != want:
				differ = append(differ, fmt.Sprintf("%s called %s as collective #%d instead", name(r), e.Call, stuck))
			case called && e.State == FlightStarted:
				waiting = append(waiting, fmt.Sprintf("%s (waiting %s)", name(r), rec.Time.Sub(e.Start).Round(time.Millisecond)))
			case called && e.State == FlightFailed:
				waiting = append(waiting, fmt.Sprintf("%s (failed: %s)", name(r), e.Err))
			case !called && rec.NextSeq <= stuck:
				last := "no collective before it"
				if p, ok := coll[r][rec.NextSeq-1]; ok && rec.NextSeq > 0 {
					last = fmt.Sprintf("its last was #%d %s, %s", p.Seq, p.Call, p.State)
				} else if rec.NextSeq > 0 {
					last = fmt.Sprintf("its last was #%d", rec.NextSeq-1)
				}
				never = append(never, fmt.Sprintf("%s never called collective #%d %s (%s)", name(r), stuck, want, last))
			}
		}
		say("collective #%d %s is not complete everywhere", stuck, want)
		if len(waiting) > 0 {
			say("in it: %s", strings.Join(waiting, "; "))
		}
		for _, s := range never {
			say("%s", s)
		}
		for _, s := range differ {
			say("%s", s)
		}
		if len(never) == 0 && len(differ) == 0 && len(missing) == 0 {
			say("every rank called it: the data did not arrive (a slow or lost peer, or the network)")
		}
	}

	// Point-to-point: operations in flight with no counterpart.
	for a := 0; a < size; a++ {
		for _, e := range ranks[a].Entries {
			if e.State == FlightCompleted || (e.Op != "send" && e.Op != "recv") {
				continue
			}
			b := e.Peer
			what := fmt.Sprintf("%s: %s %s rank %d (tag %d, %d bytes) is %s", name(a), e.Op,
				map[string]string{"send": "to", "recv": "from"}[e.Op], b, e.Tag, e.Bytes, e.State)
			if e.Err != "" {
				what += ": " + e.Err
			}
			if b < 0 {
				say("%s", what)
				continue
			}
			peer, ok := ranks[b]
			if !ok {
				say("%s", what)
				continue
			}
			other := map[string]string{"send": "recv", "recv": "send"}[e.Op]
			has := false
			for _, f := range peer.Entries {
				if f.Op == other && (f.Peer == a || f.Peer == AnySource) && f.Tag == e.Tag {
					has = true
					break
				}
			}
			if !has {
				what += fmt.Sprintf("; %s's record holds no %s %s rank %d with tag %d", name(b), other,
					map[string]string{"send": "to", "recv": "from"}[other], a, e.Tag)
			}
			say("%s", what)
		}
	}
	if len(out) == 0 {
		say("nothing in flight")
	}
	return out
}
