package netns

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	recoveredRE = regexp.MustCompile(`RECOVERED rank=(\d+) at=(\d+) size=(\d+)`)
	noQuorumRE  = regexp.MustCompile(`NOQUORUM rank=(\d+) at=(\d+)`)
)

// TestPartition cuts the link between two hosts under a 4-rank job with
// the shrink policy (issue 10's no-split-brain rule): the side holding a
// quorum of the membership (a strict majority, or exactly half with rank
// 0) carries on as a smaller job with correct results; the other side
// fails with NEXAR_ERR_NO_QUORUM and says so. It also gives the recovery
// time across hosts: from the cut to the majority's next correct allreduce.
func TestPartition(t *testing.T) {
	a, b := twoHosts(t)
	_, testprog := build(t)
	cases := []struct {
		name string
		onA  []bool // rank r on host a
		wins host   // the side that carries on
	}{
		{"2|2 rank 0's half continues", []bool{true, true, false, false}, a},
		{"3|1", []bool{true, true, true, false}, a},
		{"1|3 rank 0 alone loses", []bool{true, false, false, false}, b},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			// Every case starts with the link up.
			ip(t, "-n", a.ns, "link", "set", a.dev, "up")
			ip(t, "-n", b.ns, "link", "set", b.dev, "up")
			token := randHex(32)
			seed := fmt.Sprintf("%s:%d", a.addr, 29600+i)
			winners := 0
			for _, x := range tc.onA {
				if x == (tc.wins == a) {
					winners++
				}
			}
			var procs []*proc
			for r, x := range tc.onA {
				h := b
				if x {
					h = a
				}
				env := cleanEnv("NEXAR_RANK="+strconv.Itoa(r), "NEXAR_WORLD_SIZE=4", "NEXAR_SEED="+seed, "NEXAR_TOKEN="+token,
					"NEXAR_ADVERTISE_ADDR="+h.addr, "NEXAR_ON_FAILURE=shrink", "NEXAR_HEARTBEAT_INTERVAL=200ms",
					"NEXAR_HEARTBEAT_TIMEOUT=1s", "NEXAR_TIMEOUT=30s")
				procs = append(procs, startIn(t, ctx, fmt.Sprintf("rank %d in %s", r, h.ns), h.ns, env,
					testprog, "elastic", strconv.Itoa(winners), "30"))
			}
			// Cut once every rank loops.
			deadline := time.Now().Add(60 * time.Second)
			for {
				n := 0
				for _, p := range procs {
					n += strings.Count(p.output(), "LOOPING")
				}
				if n == 4 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the job never started looping")
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(100 * time.Millisecond)
			cut := time.Now()
			ip(t, "-n", a.ns, "link", "set", a.dev, "down")
			for _, p := range procs {
				_ = p.cmd.Wait()
			}
			ip(t, "-n", a.ns, "link", "set", a.dev, "up")
			for r, p := range procs {
				out := p.output()
				onWinner := tc.onA[r] == (tc.wins == a)
				if onWinner {
					if !strings.Contains(out, fmt.Sprintf("DONE rank=%d size=%d", r, winners)) {
						t.Errorf("rank %d, on the side that must carry on:\n%s", r, out)
						continue
					}
					if m := recoveredRE.FindStringSubmatch(out); m != nil {
						ns, _ := strconv.ParseInt(m[2], 10, 64)
						t.Logf("rank %d carried on as one of %d, %v after the cut", r, winners, time.Unix(0, ns).Sub(cut).Round(time.Millisecond))
					}
				} else {
					if !noQuorumRE.MatchString(out) {
						t.Errorf("rank %d, on the side that must stop, did not report no quorum:\n%s", r, out)
						continue
					}
					t.Logf("rank %d stopped: %s", r, firstLine([]byte(out[strings.Index(out, "NOQUORUM"):])))
				}
			}
		})
	}
}

// output is what p printed so far (safe while it runs).
func (p *proc) output() string { return p.out.String() }
