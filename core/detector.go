package core

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// This file is the failure detector's judgement, IO-free: fed the times
// at which each peer was last heard from, it says at a given time whether
// a peer is alive, stalled or dead (docs/fault-tolerance.md, "Failure
// detection"). The monitor (node.go) feeds it and acts on its verdicts.
//
// The rules:
//   - A peer whose process the data path knows to run, so that its death
//     would reach the node at once (transport.DataPath.PeerAlive: on this
//     host, its process watched; on another, a TCP connection its kernel
//     answers on), is never dead by silence alone. Past the floor it is stalled: reported once per
//     silence, and a call that waits on it ends at its own deadline with a
//     timeout naming it.
//   - Any other peer is judged by phi accrual (Hayashibara et al., as
//     Cassandra and Akka do): the gaps between its arrivals, a normal
//     distribution fitted to the last gapWindow of them, and phi =
//     -log10(P(a gap at least this long)). It is dead when phi passes the
//     threshold, but never before the floor (Config.HeartbeatTimeout) and
//     always by the ceiling: a busy host or a pause that the peer has shown
//     before buys it more time, up to the ceiling, and a real death is seen
//     within the ceiling.

// verdict is the detector's judgement of one peer at one time.
type verdict uint8

const (
	verdictAlive   verdict = iota // heard from recently enough
	verdictStalled                // silent past the floor, its process known to run
	verdictDead                   // silent past its limit: declare it down
)

// gapWindow is how many inter-arrival gaps per peer the detector fits.
const gapWindow = 64

// detectorParams are the detector's settings, from the Config.
type detectorParams struct {
	interval time.Duration // heartbeat interval: the gap expected of a quiet peer
	floor    time.Duration // never dead sooner (Config.HeartbeatTimeout)
	ceiling  time.Duration // always dead by then, unless its process is known to run
	phi      float64       // threshold
}

// detector holds each peer's arrival history. Not safe for concurrent
// use: the monitor goroutine alone drives it.
type detector struct {
	p      detectorParams
	minStd float64 // the smallest deviation fitted, in ns: regular beats are not a promise of perfection
	peers  []peerHistory
}

type peerHistory struct {
	last    int64 // the last arrival, on the caller's clock (ns)
	gaps    [gapWindow]float64
	n, next int     // gaps recorded (up to gapWindow), where the next goes
	sum, sq float64 // of the recorded gaps and their squares
	stalled bool    // reported stalled in the current silence
}

func newDetector(size int, p detectorParams, now int64) *detector {
	d := &detector{p: p, minStd: float64(p.interval) / 4, peers: make([]peerHistory, size)}
	for i := range d.peers {
		d.peers[i].last = now
	}
	return d
}

// arrived records that peer was heard from at at (a reading of lastSeen);
// a reading no later than the last one recorded is no news.
func (d *detector) arrived(peer int, at int64) {
	h := &d.peers[peer]
	if at <= h.last {
		return
	}
	// A gap longer than the ceiling is recorded as the ceiling: one long
	// pause must not stretch the limit past what the ceiling allows anyway.
	g := float64(min(at-h.last, int64(d.p.ceiling)))
	h.last = at
	h.stalled = false
	if h.n == gapWindow {
		old := h.gaps[h.next]
		h.sum -= old
		h.sq -= old * old
	} else {
		h.n++
	}
	h.gaps[h.next] = g
	h.sum += g
	h.sq += g * g
	h.next = (h.next + 1) % gapWindow
}

// restart counts peer's silence afresh from at, with no gap recorded:
// this process itself was stopped or starved, so the silence said nothing
// about the peer.
func (d *detector) restart(peer int, at int64) {
	h := &d.peers[peer]
	h.last = max(h.last, at)
	h.stalled = false
}

// fit returns the mean and deviation of peer's gaps (ns). With no gap yet
// it assumes the heartbeat interval.
func (d *detector) fit(peer int) (mean, std float64) {
	h := &d.peers[peer]
	if h.n == 0 {
		return float64(d.p.interval), d.minStd
	}
	mean = h.sum / float64(h.n)
	v := h.sq/float64(h.n) - mean*mean
	return mean, max(math.Sqrt(max(v, 0)), d.minStd)
}

// phi is the suspicion of peer after a silence of silent: -log10 of the
// probability that a gap is at least that long, under the normal fit of
// its gaps (the logistic approximation of its tail that Akka uses).
func (d *detector) phi(peer int, silent time.Duration) float64 {
	mean, std := d.fit(peer)
	y := (float64(silent) - mean) / std
	e := math.Exp(-y * (1.5976 + 0.070566*y*y))
	if y > 0 {
		return -math.Log10(e / (1 + e))
	}
	return -math.Log10(1 - 1/(1+e))
}

// limit is how long peer, judged by its gaps, may stay silent before it
// is dead (another host, or a process not watched): where phi reaches the
// threshold, within [floor, ceiling].
func (d *detector) limit(peer int) time.Duration {
	lo, hi := d.p.floor, d.p.ceiling
	if d.phi(peer, lo) >= d.p.phi {
		return lo
	}
	if d.phi(peer, hi) < d.p.phi {
		return hi
	}
	for hi-lo > time.Millisecond { // phi grows with the silence
		mid := lo + (hi-lo)/2
		if d.phi(peer, mid) >= d.p.phi {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// check judges peer at now; alive says whether a peer's process is known
// to run on this host (asked only of a peer silent past the floor). first
// is true for the first stalled verdict of a silence (report it once).
// silent is how long it has been silent.
func (d *detector) check(peer int, now int64, alive func(peer int) bool) (v verdict, silent time.Duration, first bool) {
	h := &d.peers[peer]
	silent = time.Duration(now - h.last)
	if silent <= d.p.floor {
		return verdictAlive, silent, false
	}
	if alive(peer) {
		first = !h.stalled
		h.stalled = true
		return verdictStalled, silent, first
	}
	if silent > d.p.ceiling || d.phi(peer, silent) >= d.p.phi {
		return verdictDead, silent, false
	}
	return verdictAlive, silent, false
}

const (
	// ceilingTimeouts is the ceiling in heartbeat timeouts: 12 s with the
	// defaults.
	ceilingTimeouts = 4
	// phiThreshold is the suspicion at which a peer is dead: a gap that
	// long has about one chance in 10^8 under the fit of its gaps
	// (Cassandra's and Akka's default).
	phiThreshold = 8
)

// detectorParamsOf derives the detector's settings from cfg (defaults
// filled): the floor is HeartbeatTimeout, the ceiling HeartbeatCeiling
// (default ceilingTimeouts of the floor), the threshold HeartbeatPhi.
func detectorParamsOf(cfg Config) detectorParams {
	return detectorParams{interval: cfg.HeartbeatInterval, floor: cfg.HeartbeatTimeout,
		ceiling: cfg.HeartbeatCeiling, phi: cfg.HeartbeatPhi}
}

// timeoutError is the error of op, which reached its deadline (cause
// err). Where a member is stalled (its process known to run, silent
// past the floor: never declared dead for that), it is the likely reason,
// and the error names it: the one silent longest.
func (c *Comm) timeoutError(op string, err error) *Error {
	e := &Error{Code: CodeTimeout, Op: op, Rank: -1, Msg: "Timed out before the operation completed (deadline exceeded)", Cause: err}
	since := int64(0)
	for r, w := range c.world {
		if q := c.n.quiet[w].Load(); q != 0 && (e.Rank < 0 || q < since) {
			e.Rank, since = r, q
		}
	}
	if e.Rank >= 0 {
		e.Msg = fmt.Sprintf("Timed out before the operation completed (deadline exceeded): rank %d has been silent for %v (stalled: its process is alive)",
			e.Rank, time.Duration(c.n.mono()-since).Round(100*time.Millisecond))
		return e
	}
	// No peer is silent: name the one whose message the call waited for
	// (on a busy host, a rank still working on what comes before).
	var aw *awaitedError
	if errors.As(err, &aw) {
		e.Rank = aw.src
		e.Msg = fmt.Sprintf("Timed out before the operation completed (deadline exceeded): waiting for rank %d's message (collective %d, step %d); rank %d answers heartbeats, so it had not reached this call or was still working towards it",
			aw.src, aw.seq, aw.step, aw.src)
	}
	return e
}

// watchedIdle is the idle timeout of the mesh's connections where
// heartbeats watch every one (not on demand): the detector judges silence,
// and QUIC's own timeout must undercut neither the ceiling, by which a
// silent peer of another host is declared dead, nor the deadline of a call
// (Config.Timeout), to which a stalled peer of this host is tolerated.
func watchedIdle(cfg Config) time.Duration {
	return max(detectorParamsOf(cfg).ceiling, cfg.Timeout)
}
