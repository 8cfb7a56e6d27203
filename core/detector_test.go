package core

import (
	"testing"
	"time"
)

// The detector's rules, without a network: each case feeds one peer's
// arrivals (gaps between them) and asks for a verdict after a silence.
func TestDetectorVerdicts(t *testing.T) {
	p := detectorParams{interval: 500 * time.Millisecond, floor: 3 * time.Second, ceiling: 12 * time.Second, phi: phiThreshold}
	ms := time.Millisecond
	regular := repeat(500*ms, 40)
	jittery := func() []time.Duration { // a busy host: beats 0.2-2.6 s apart
		var g []time.Duration
		for i := range 40 {
			g = append(g, []time.Duration{200 * ms, 2600 * ms, 900 * ms, 1700 * ms}[i%4])
		}
		return g
	}()
	var wild []time.Duration // gaps of 1 s and 20 s: phi stays low long past the ceiling
	for i := range 40 {
		wild = append(wild, []time.Duration{time.Second, 20 * time.Second}[i%2])
	}
	for _, tc := range []struct {
		name   string
		gaps   []time.Duration
		silent time.Duration
		alive  bool // its process runs on this host, watched
		want   verdict
	}{
		{"quiet peer, within the floor", regular, 2900 * ms, false, verdictAlive},
		{"regular beats: dead just past the floor", regular, 3100 * ms, false, verdictDead},
		{"no history: the floor", nil, 3100 * ms, false, verdictDead},
		{"jittery peer tolerated past the floor", jittery, 4 * time.Second, false, verdictAlive},
		{"jittery peer dead by the ceiling", jittery, 12100 * ms, false, verdictDead},
		{"pauses of 10 s seen before: still dead past the ceiling", repeat(10*time.Second, 40), 12100 * ms, false, verdictDead},
		{"wild gaps: alive within the ceiling", wild, 11 * time.Second, false, verdictAlive},
		{"wild gaps: dead by the ceiling all the same", wild, 12100 * ms, false, verdictDead},
		{"same host, alive: stalled, not dead", regular, 3100 * ms, true, verdictStalled},
		{"same host, alive: stalled past the ceiling too", regular, time.Minute, true, verdictStalled},
		{"same host, alive, within the floor", regular, 2 * time.Second, true, verdictAlive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDetector(2, p, 0)
			at := int64(0)
			for _, g := range tc.gaps {
				at += int64(g)
				d.arrived(1, at)
			}
			asked := false
			alive := func(peer int) bool {
				if peer != 1 {
					t.Errorf("asked about peer %d", peer)
				}
				asked = true
				return tc.alive
			}
			v, silent, _ := d.check(1, at+int64(tc.silent), alive)
			if v != tc.want {
				t.Errorf("verdict %d after %v of silence (limit %v), want %d", v, tc.silent, d.limit(1), tc.want)
			}
			if silent != tc.silent {
				t.Errorf("silent %v, want %v", silent, tc.silent)
			}
			if asked && tc.silent <= p.floor {
				t.Error("asked whether the process is alive within the floor")
			}
		})
	}
}

// The limit grows with the jitter a peer has shown and stays within
// [floor, ceiling]; a stall is reported once per silence; an arrival ends
// it; restart counts the silence afresh without learning a gap.
func TestDetectorLimitAndStall(t *testing.T) {
	p := detectorParams{interval: 500 * time.Millisecond, floor: 3 * time.Second, ceiling: 12 * time.Second, phi: phiThreshold}
	d := newDetector(3, p, 0)
	at := int64(0)
	for i := range 64 {
		at += int64(500 * time.Millisecond)
		d.arrived(1, at)
		g := []time.Duration{300 * time.Millisecond, 2500 * time.Millisecond}[i%2]
		d.arrived(2, int64(time.Duration(i+1)*1400*time.Millisecond)+int64(g))
	}
	if l := d.limit(1); l != p.floor {
		t.Errorf("regular peer: limit %v, want the floor %v", l, p.floor)
	}
	if l := d.limit(2); l <= p.floor || l > p.ceiling {
		t.Errorf("jittery peer: limit %v, want in (%v, %v]", l, p.floor, p.ceiling)
	}
	alive := func(int) bool { return true }
	now := at + int64(4*time.Second)
	if v, _, first := d.check(1, now, alive); v != verdictStalled || !first {
		t.Fatalf("first check of a silent local peer: %d first=%v, want stalled, first", v, first)
	}
	if v, _, first := d.check(1, now+int64(time.Second), alive); v != verdictStalled || first {
		t.Fatalf("second check: %d first=%v, want stalled, not first", v, first)
	}
	d.arrived(1, now+int64(2*time.Second))
	if v, _, _ := d.check(1, now+int64(2500*time.Millisecond), alive); v != verdictAlive {
		t.Fatalf("after an arrival: %d, want alive", v)
	}
	if v, _, first := d.check(1, now+int64(6*time.Second), alive); v != verdictStalled || !first {
		t.Fatalf("a new silence: %d first=%v, want stalled, first", v, first)
	}
	before := d.peers[1].n
	d.restart(1, now+int64(10*time.Second))
	if d.peers[1].n != before {
		t.Error("restart recorded a gap")
	}
	if v, _, _ := d.check(1, now+int64(11*time.Second), func(int) bool { return false }); v != verdictAlive {
		t.Errorf("after restart: %d, want alive", v)
	}
}

func repeat(g time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = g
	}
	return out
}
