package membership

import (
	"bytes"
	"fmt"
	"slices"
)

// This file is fault-tolerant agreement (ULFM's MPIX_Comm_agree) as an
// IO-free engine, in the manner of raft's RawNode: the caller feeds it
// events (Start, Suspect, Step), sends what Ready returns and reads Result.
// It has no goroutines, no clock and no locks.
//
// Ranks 0..n-1 of a membership agree on one Decision: the AND of the flags
// of the members that took part, and the set of members left out (failed,
// or suspected by a participant). Every rank that returns a Decision
// returns the same one, also when members fail during the agreement, and
// only a quorum can decide (Quorum), so a partition never lets two sides
// decide differently.
//
// The protocol is single-decree Paxos with the coordinator's rank as the
// ballot:
//
//   - Suspicion is gossip and final: every message carries its sender's
//     suspects, a receiver adopts them, and a rank once suspected by anyone
//     is left out (a rank that learns it is suspected fails: ErrExcluded).
//     Suspect sets only grow, so every rank follows the lowest rank it does
//     not suspect, and coordinators only move up.
//   - Propose: on Start and whenever its suspects grow, a rank sends its
//     flag, suspects and any value it accepted to every rank it does not
//     suspect. To the rank it follows, that is its promise: it accepts
//     values from no lower coordinator (it suspects them all).
//   - The coordinator waits for a promise from every rank it does not
//     suspect (a quorum at least). If a promise carries an accepted value,
//     it takes the one of the highest ballot; else the new value is the AND
//     of the promised flags and its suspects. It sends Accept to all.
//   - A rank accepts a value from the coordinator it follows and acks.
//   - With acks from every rank it does not suspect (a quorum at least),
//     the coordinator commits: the value is chosen. A rank that knows the
//     chosen value answers any later Propose or Accept with Commit, so a
//     coordinator's death after committing loses nothing.
//
// Safety rests on two quorums always sharing a member (Quorum), so a new
// coordinator's promises include an acceptor of any value that may have
// been chosen. Liveness needs the failure detector: a coordinator waits
// for a silent rank until the caller reports it (Suspect) or gives up.

// Decision is the outcome of an agreement.
type Decision struct {
	// Flag is the bitwise AND of the flags of the members that took part.
	Flag uint64 `cbor:"1,keyasint"`
	// Failed lists the members left out, ascending.
	Failed []int `cbor:"2,keyasint"`
	// Extra is the union of the participants' contributions (StartWith),
	// sorted bytewise, without duplicates: grow's joiners.
	Extra [][]byte `cbor:"3,keyasint,omitempty"`
}

// Equal reports whether d and o are the same decision.
func (d Decision) Equal(o Decision) bool {
	return d.Flag == o.Flag && slices.Equal(d.Failed, o.Failed) &&
		slices.EqualFunc(d.Extra, o.Extra, bytes.Equal)
}

// Bounds on a contribution (StartWith), checked on every message: a
// member's lobby holds at most MaxExtra joiners at a time.
const (
	MaxExtra     = 256
	MaxExtraSize = 64
)

// Quorum reports whether the members in q (ranks of a membership of n)
// may decide for it: a strict majority, or exactly half when it holds rank
// 0 (the lowest member). Any two quorums share a member, so two sides of a
// partition can never both decide; an even split goes to rank 0's side.
func Quorum(n int, q []bool) bool {
	k := 0
	for _, in := range q {
		if in {
			k++
		}
	}
	return 2*k > n || (2*k == n && len(q) > 0 && q[0])
}

// Agreement message kinds.
const (
	AgreePropose uint8 = 1 // flag, suspects, accepted value: gossip, and the promise to the coordinator
	AgreeAccept  uint8 = 2 // the coordinator's value
	AgreeAck     uint8 = 3 // accepted
	AgreeCommit  uint8 = 4 // the chosen value
)

// AgreeMsg is one message of an agreement (CBOR on the wire).
type AgreeMsg struct {
	Kind     uint8     `cbor:"1,keyasint"`
	Ballot   int       `cbor:"2,keyasint"` // Propose: the coordinator the sender follows; Accept, Ack: the coordinator's ballot
	Flag     uint64    `cbor:"3,keyasint"`
	Suspects []int     `cbor:"4,keyasint,omitempty"`
	Value    *Decision `cbor:"5,keyasint,omitempty"` // Propose: accepted (if any); Accept: proposed; Commit: chosen
	VBallot  int       `cbor:"6,keyasint"`           // Propose: the ballot Value was accepted in
	Extra    [][]byte  `cbor:"7,keyasint,omitempty"` // Propose: the sender's contribution
}

// Validate checks a decoded message against a membership of n.
func (m *AgreeMsg) Validate(n int) error {
	if m.Kind < AgreePropose || m.Kind > AgreeCommit {
		return fmt.Errorf("membership: agreement message of unknown kind %d", m.Kind)
	}
	if m.Ballot < 0 || m.Ballot >= n || m.VBallot < -1 || m.VBallot >= n {
		return fmt.Errorf("membership: agreement ballot %d/%d outside a membership of %d", m.Ballot, m.VBallot, n)
	}
	check := func(rs []int) error {
		if len(rs) > n {
			return fmt.Errorf("membership: agreement message lists %d ranks of %d", len(rs), n)
		}
		for _, r := range rs {
			if r < 0 || r >= n {
				return fmt.Errorf("membership: agreement message names rank %d outside a membership of %d", r, n)
			}
		}
		return nil
	}
	if err := check(m.Suspects); err != nil {
		return err
	}
	checkExtra := func(x [][]byte, limit int) error {
		if len(x) > limit {
			return fmt.Errorf("membership: agreement message carries %d contributions, more than %d", len(x), limit)
		}
		for _, b := range x {
			if len(b) == 0 || len(b) > MaxExtraSize {
				return fmt.Errorf("membership: agreement contribution of %d bytes (1 to %d)", len(b), MaxExtraSize)
			}
		}
		return nil
	}
	if err := checkExtra(m.Extra, MaxExtra); err != nil {
		return err
	}
	if m.Value != nil {
		if err := checkExtra(m.Value.Extra, MaxExtra*n); err != nil {
			return err
		}
		return check(m.Value.Failed)
	}
	return nil
}

// Outbound is a message for rank To.
type Outbound struct {
	To  int
	Msg AgreeMsg
}

// AgreeError says why an agreement ended without a decision for this rank.
type AgreeError struct {
	Excluded bool // the others left this rank out (suspected it, or decided without it)
	NoQuorum bool // the ranks this rank does not suspect are no quorum
	By       int  // Excluded: a rank that suspected this one, or -1
	Alive    int  // NoQuorum: how many ranks this rank does not suspect
	N        int
}

func (e *AgreeError) Error() string {
	switch {
	case e.Excluded && e.By >= 0:
		return fmt.Sprintf("this rank was left out of the agreement: rank %d reported it failed", e.By)
	case e.Excluded:
		return "this rank was left out of the agreement: the others decided without it"
	default:
		return fmt.Sprintf("no quorum: this rank can reach %d of the %d members, not a strict majority (nor half with rank 0), so its side must not continue", e.Alive, e.N)
	}
}

type early struct {
	from int
	msg  AgreeMsg
}

// Agreement is one rank's part in one agreement. It is not safe for
// concurrent use: the caller serialises every call (core holds its
// communicator's lock).
type Agreement struct {
	n, self int
	started bool
	flag    uint64
	extra   [][]byte
	suspect []bool
	by      []int // per rank: who reported it suspected (-1: this rank's detector)
	coord   int   // the coordinator this rank follows: the lowest it does not suspect

	acc       *Decision // accepted value
	accBallot int

	promises []*AgreeMsg // coordinator: the latest Propose from each rank that follows it
	proposed *Decision   // coordinator: the value sent in Accept
	acks     []bool

	done *Decision
	err  *AgreeError
	out  []Outbound
	wait []early // messages before Start
}

// NewAgreement is rank self's part in an agreement among n ranks.
func NewAgreement(n, self int) *Agreement {
	a := &Agreement{n: n, self: self, suspect: make([]bool, n), by: make([]int, n), coord: -1, accBallot: -1,
		promises: make([]*AgreeMsg, n), acks: make([]bool, n)}
	for i := range a.by {
		a.by[i] = -1
	}
	return a
}

// Start joins the agreement with flag and the ranks this rank knows
// failed. Messages that came before are taken now.
func (a *Agreement) Start(flag uint64, suspects []int) { a.StartWith(flag, suspects, nil) }

// StartWith is Start with a contribution: the decision's Extra is the
// union of the contributions of the members whose promises the deciding
// coordinator counted (a member left out contributes nothing). Entries
// must be 1 to MaxExtraSize bytes, at most MaxExtra of them (the rest are
// dropped here, and so never decided).
func (a *Agreement) StartWith(flag uint64, suspects []int, extra [][]byte) {
	if a.started {
		return
	}
	for _, b := range extra {
		if len(b) > 0 && len(b) <= MaxExtraSize && len(a.extra) < MaxExtra {
			a.extra = append(a.extra, bytes.Clone(b))
		}
	}
	a.started, a.flag = true, flag
	for _, r := range suspects {
		a.addSuspect(r, -1)
	}
	a.gossip()
	a.advance()
	for _, e := range a.wait {
		a.Step(e.from, e.msg)
	}
	a.wait = nil
}

// Suspect reports that rank r failed (this rank's detector, or a departure).
func (a *Agreement) Suspect(r int) {
	if r < 0 || r >= a.n || a.suspect[r] {
		return
	}
	a.addSuspect(r, -1)
	if a.started && a.done == nil && a.err == nil {
		a.gossip()
		a.advance()
	}
}

// Step takes message m from rank from.
func (a *Agreement) Step(from int, m AgreeMsg) {
	if from < 0 || from >= a.n || from == a.self || m.Validate(a.n) != nil {
		return
	}
	if !a.started {
		a.wait = append(a.wait, early{from, m})
		return
	}
	if a.done != nil {
		if m.Kind == AgreePropose || m.Kind == AgreeAccept {
			a.send(from, AgreeMsg{Kind: AgreeCommit, Value: a.done, VBallot: -1})
		}
		return
	}
	if a.err != nil {
		return
	}
	if m.Kind == AgreeCommit { // a chosen value, whoever relays it
		a.decide(m.Value)
		return
	}
	if a.suspect[from] {
		return
	}
	grew := false
	for _, r := range m.Suspects {
		if !a.suspect[r] {
			a.addSuspect(r, from)
			grew = true
		}
	}
	if grew && !a.suspect[a.self] {
		a.gossip()
	}
	switch m.Kind {
	case AgreePropose:
		if m.Ballot == a.self {
			mm := m
			a.promises[from] = &mm
		}
	case AgreeAccept:
		a.advance() // follow the sender if its suspects made it the coordinator
		if m.Ballot == a.coord && m.Ballot == from && m.Value != nil && a.err == nil {
			v := *m.Value
			a.acc, a.accBallot = &v, m.Ballot
			a.send(from, AgreeMsg{Kind: AgreeAck, Ballot: m.Ballot, VBallot: -1})
		}
	case AgreeAck:
		if m.Ballot == a.self && a.proposed != nil {
			a.acks[from] = true
		}
	}
	a.advance()
}

// Ready returns the messages to send since the last call.
func (a *Agreement) Ready() []Outbound {
	out := a.out
	a.out = nil
	return out
}

// Result returns the decision, or why this rank has none; both nil while
// the agreement goes on.
func (a *Agreement) Result() (*Decision, error) {
	if a.err != nil {
		return nil, a.err
	}
	return a.done, nil
}

// Suspected returns the ranks this rank suspects now (for errors and logs).
func (a *Agreement) Suspected() []int { return a.suspectList() }

func (a *Agreement) addSuspect(r, by int) {
	if r < 0 || r >= a.n || a.suspect[r] {
		return
	}
	a.suspect[r], a.by[r] = true, by
}

func (a *Agreement) suspectList() []int {
	var s []int
	for r, x := range a.suspect {
		if x {
			s = append(s, r)
		}
	}
	return s
}

func (a *Agreement) send(to int, m AgreeMsg) { a.out = append(a.out, Outbound{To: to, Msg: m}) }

// gossip sends this rank's Propose to every rank it does not suspect.
func (a *Agreement) gossip() {
	lead := a.lowest()
	m := AgreeMsg{Kind: AgreePropose, Ballot: max(lead, 0), Flag: a.flag, Suspects: a.suspectList(), Value: a.acc, VBallot: a.accBallot, Extra: a.extra}
	for r := 0; r < a.n; r++ {
		if r != a.self && !a.suspect[r] {
			a.send(r, m)
		}
	}
}

func (a *Agreement) lowest() int {
	for r := 0; r < a.n; r++ {
		if !a.suspect[r] {
			return r
		}
	}
	return -1
}

func (a *Agreement) alive() []bool {
	q := make([]bool, a.n)
	for r := range q {
		q[r] = !a.suspect[r]
	}
	return q
}

// advance checks the end conditions and, on the coordinator, moves the
// protocol on.
func (a *Agreement) advance() {
	if a.done != nil || a.err != nil || !a.started {
		return
	}
	if a.suspect[a.self] {
		a.err = &AgreeError{Excluded: true, By: a.by[a.self], N: a.n}
		return
	}
	if alive := a.alive(); !Quorum(a.n, alive) {
		k := 0
		for _, x := range alive {
			if x {
				k++
			}
		}
		a.err = &AgreeError{NoQuorum: true, Alive: k, N: a.n, By: -1}
		return
	}
	a.coord = a.lowest()
	if a.coord != a.self {
		return
	}
	if a.proposed == nil {
		for r := 0; r < a.n; r++ {
			if r != a.self && !a.suspect[r] && a.promises[r] == nil {
				return // a promise still to come
			}
		}
		v, vb := a.acc, a.accBallot
		flag := a.flag
		extra := slices.Clone(a.extra)
		for r, p := range a.promises {
			if p == nil || a.suspect[r] {
				continue
			}
			flag &= p.Flag
			extra = append(extra, p.Extra...)
			if p.Value != nil && p.VBallot > vb {
				v, vb = p.Value, p.VBallot
			}
		}
		if v == nil {
			slices.SortFunc(extra, bytes.Compare)
			extra = slices.CompactFunc(extra, bytes.Equal)
			v = &Decision{Flag: flag, Failed: a.suspectList(), Extra: extra}
		}
		val := *v
		a.proposed, a.acc, a.accBallot = &val, &val, a.self
		a.acks[a.self] = true
		for r := 0; r < a.n; r++ {
			if r != a.self && !a.suspect[r] {
				a.send(r, AgreeMsg{Kind: AgreeAccept, Ballot: a.self, Suspects: a.suspectList(), Value: a.proposed, VBallot: -1})
			}
		}
	}
	q := make([]bool, a.n)
	for r := 0; r < a.n; r++ {
		if a.suspect[r] {
			continue
		}
		if !a.acks[r] {
			return // an ack still to come
		}
		q[r] = true
	}
	if !Quorum(a.n, q) {
		return
	}
	v := *a.proposed
	for r := 0; r < a.n; r++ {
		if r != a.self && !a.suspect[r] {
			a.send(r, AgreeMsg{Kind: AgreeCommit, Value: &v, VBallot: -1})
		}
	}
	a.decide(&v)
}

func (a *Agreement) decide(v *Decision) {
	if v == nil || a.done != nil {
		return
	}
	if slices.Contains(v.Failed, a.self) {
		a.err = &AgreeError{Excluded: true, By: -1, N: a.n}
		return
	}
	d := Decision{Flag: v.Flag, Failed: slices.Clone(v.Failed), Extra: slices.Clone(v.Extra)}
	a.done = &d
}
