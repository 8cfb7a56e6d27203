package membership

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// simNet runs n Agreements over a simulated network: messages are
// delivered in random order; a crashed rank sends and receives nothing
// more (some of its messages in flight are lost); a cut link drops
// messages between two sides. A rank's detector reports a crashed or cut
// peer some random steps later.
type simNet struct {
	t       *testing.T
	n       int
	a       []*Agreement
	flags   []uint64
	extras  [][][]byte // each rank's contribution
	rng     *rand.Rand
	q       []flight
	crashed []bool
	side    []int // partition side per rank (all 0: no partition)
	notices []notice
	steps   int
}

type flight struct {
	from, to int
	m        AgreeMsg
}

type notice struct {
	at, to, about int
}

func newSim(t *testing.T, n int, seed uint64) *simNet {
	s := &simNet{t: t, n: n, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b9)), crashed: make([]bool, n), side: make([]int, n)}
	for r := 0; r < n; r++ {
		s.a = append(s.a, NewAgreement(n, r))
		s.flags = append(s.flags, ^uint64(0)&^(uint64(s.rng.IntN(4))<<uint(r%60)))
		var x [][]byte
		for i := s.rng.IntN(3); i > 0; i-- {
			// Some contributions collide across ranks: the union dedups.
			x = append(x, []byte(fmt.Sprintf("j%d", s.rng.IntN(2*n))))
		}
		s.extras = append(s.extras, x)
	}
	return s
}

func (s *simNet) collect(r int) {
	for _, o := range s.a[r].Ready() {
		if o.To < 0 || o.To >= s.n || o.To == r {
			s.t.Fatalf("rank %d sent to rank %d", r, o.To)
		}
		// A message travels encoded: the engine must not share memory.
		m := o.Msg
		m.Suspects = slices.Clone(m.Suspects)
		m.Extra = slices.Clone(m.Extra)
		if m.Value != nil {
			v := *m.Value
			v.Failed = slices.Clone(v.Failed)
			v.Extra = slices.Clone(v.Extra)
			m.Value = &v
		}
		s.q = append(s.q, flight{r, o.To, m})
	}
}

func (s *simNet) start(r int) {
	s.a[r].StartWith(s.flags[r], nil, s.extras[r])
	s.collect(r)
}

func (s *simNet) crash(r int) {
	if s.crashed[r] {
		return
	}
	s.crashed[r] = true
	kept := s.q[:0]
	for _, f := range s.q {
		if f.to == r || (f.from == r && s.rng.IntN(2) == 0) {
			continue
		}
		kept = append(kept, f)
	}
	s.q = kept
	for p := 0; p < s.n; p++ {
		if p != r {
			s.notices = append(s.notices, notice{at: s.steps + 1 + s.rng.IntN(3*s.n), to: p, about: r})
		}
	}
}

func (s *simNet) partition(sides []int) {
	copy(s.side, sides)
	for p := 0; p < s.n; p++ {
		for r := 0; r < s.n; r++ {
			if s.side[p] != s.side[r] {
				s.notices = append(s.notices, notice{at: s.steps + 1 + s.rng.IntN(3*s.n), to: p, about: r})
			}
		}
	}
}

// step delivers one message or notice; false when nothing is left.
func (s *simNet) step() bool {
	s.steps++
	for i, nt := range s.notices {
		if nt.at <= s.steps {
			s.notices = slices.Delete(s.notices, i, i+1)
			if !s.crashed[nt.to] {
				s.a[nt.to].Suspect(nt.about)
				s.collect(nt.to)
			}
			return true
		}
	}
	if len(s.q) == 0 {
		if len(s.notices) == 0 {
			return false
		}
		return true
	}
	i := s.rng.IntN(len(s.q))
	f := s.q[i]
	s.q = slices.Delete(s.q, i, i+1)
	if s.crashed[f.to] || s.crashed[f.from] && s.rng.IntN(2) == 0 || s.side[f.from] != s.side[f.to] {
		return true
	}
	s.a[f.to].Step(f.from, f.m)
	s.collect(f.to)
	return true
}

func (s *simNet) run(limit int) {
	for s.step() {
		if s.steps > limit {
			s.t.Fatalf("no quiescence after %d steps", limit)
		}
	}
}

// check verifies agreement among the live ranks and returns the decision
// (nil when none decided).
func (s *simNet) check() *Decision {
	s.t.Helper()
	var d *Decision
	for r, a := range s.a {
		if s.crashed[r] {
			continue
		}
		got, err := a.Result()
		if err == nil && got == nil {
			s.t.Fatalf("rank %d has neither a decision nor an error", r)
		}
		if got == nil {
			continue
		}
		if d == nil {
			d = got
		} else if !d.Equal(*got) {
			s.t.Fatalf("rank %d decided %+v, another %+v", r, *got, *d)
		}
	}
	if d != nil {
		want := ^uint64(0)
		for r := 0; r < s.n; r++ {
			if !slices.Contains(d.Failed, r) {
				want &= s.flags[r]
			}
		}
		if d.Flag != want {
			s.t.Fatalf("decided flag %x, the AND of the flags of the members not left out is %x (failed %v)", d.Flag, want, d.Failed)
		}
		// Extra: every member not left out contributed, nobody else's
		// entries appear, sorted without duplicates.
		all := map[string]bool{}
		for r := 0; r < s.n; r++ {
			for _, b := range s.extras[r] {
				all[string(b)] = true
			}
		}
		got := map[string]bool{}
		for i, b := range d.Extra {
			if i > 0 && string(d.Extra[i-1]) >= string(b) {
				s.t.Fatalf("decided extra %q is not sorted and unique", d.Extra)
			}
			if !all[string(b)] {
				s.t.Fatalf("decided extra %q: nobody contributed it", b)
			}
			got[string(b)] = true
		}
		for r := 0; r < s.n; r++ {
			if slices.Contains(d.Failed, r) {
				continue
			}
			for _, b := range s.extras[r] {
				if !got[string(b)] {
					s.t.Fatalf("rank %d (not left out) contributed %q, missing from the decision %q", r, b, d.Extra)
				}
			}
		}
		for _, r := range d.Failed {
			if !s.crashed[r] && s.side[r] == s.side[0] && s.allSameSide() {
				s.t.Fatalf("rank %d left out though it never failed", r)
			}
		}
	}
	return d
}

func (s *simNet) allSameSide() bool {
	for _, x := range s.side {
		if x != s.side[0] {
			return false
		}
	}
	return true
}

func TestAgreeNoFailure(t *testing.T) {
	for n := 1; n <= 7; n++ {
		s := newSim(t, n, uint64(n))
		for r := 0; r < n; r++ {
			s.start(r)
		}
		s.run(100000)
		d := s.check()
		if d == nil || len(d.Failed) != 0 {
			t.Fatalf("n=%d: decision %+v, want every rank in", n, d)
		}
		for r, a := range s.a {
			if got, err := a.Result(); got == nil || err != nil {
				t.Fatalf("n=%d: rank %d: %v %v", n, r, got, err)
			}
		}
	}
}

func TestAgreeKnownFailed(t *testing.T) {
	// Rank 1 is dead before the agreement; rank 2 knows, the others learn
	// it from rank 2's gossip before their detectors fire.
	s := newSim(t, 5, 7)
	s.crashed[1] = true
	s.a[2].StartWith(s.flags[2], []int{1}, s.extras[2])
	s.collect(2)
	for _, r := range []int{0, 3, 4} {
		s.start(r)
	}
	s.run(100000)
	d := s.check()
	if d == nil || !slices.Equal(d.Failed, []int{1}) {
		t.Fatalf("decision %+v, want failed [1]", d)
	}
}

// TestAgreeCoordinatorDiesAfterCommit: rank 0 commits and dies with its
// Commit delivered to rank 1 only; the others must still decide the same.
func TestAgreeCoordinatorDiesAfterCommit(t *testing.T) {
	s := newSim(t, 4, 3)
	for r := 0; r < 4; r++ {
		s.start(r)
	}
	for {
		if got, _ := s.a[0].Result(); got != nil {
			break
		}
		if !s.step() {
			t.Fatal("rank 0 never decided")
		}
	}
	// Drop rank 0's Commits except the one to rank 1, then crash it.
	kept := s.q[:0]
	for _, f := range s.q {
		if f.from == 0 && f.m.Kind == AgreeCommit && f.to != 1 {
			continue
		}
		kept = append(kept, f)
	}
	s.q = kept
	s.crashed[0] = true
	for p := 1; p < 4; p++ {
		s.notices = append(s.notices, notice{at: s.steps + 1 + p, to: p, about: 0})
	}
	s.run(100000)
	d := s.check()
	first, _ := s.a[0].Result()
	if d == nil || !d.Equal(*first) {
		t.Fatalf("survivors decided %+v, the dead coordinator %+v", d, first)
	}
}

func TestAgreePartitions(t *testing.T) {
	cases := []struct {
		sides []int
		wins  int // the side that decides, -1 none
	}{
		{[]int{0, 0, 1, 1}, 0},       // 2|2: rank 0's half
		{[]int{1, 1, 0, 0}, 1},       // 2|2 the other way: still rank 0's half
		{[]int{0, 0, 0, 1}, 0},       // 3|1
		{[]int{1, 0, 0, 0}, 0},       // 1|3, rank 0 in the minority
		{[]int{0, 1, 2, 2, 2}, 2},    // 1|1|3
		{[]int{0, 0, 1, 1, 2, 2}, 0}, // 2|2|2 of 6: no strict majority, no half with 0 ... see below
		{[]int{0, 1}, 0},             // 1|1 of 2: rank 0 continues
	}
	for i, tc := range cases {
		t.Run(fmt.Sprint(tc.sides), func(t *testing.T) {
			n := len(tc.sides)
			s := newSim(t, n, uint64(100+i))
			s.partition(tc.sides)
			for r := 0; r < n; r++ {
				s.start(r)
			}
			s.run(200000)
			s.check()
			want := tc.wins
			if n == 6 {
				want = -1 // 2 of 6 is no quorum
			}
			for r := 0; r < n; r++ {
				got, err := s.a[r].Result()
				if tc.sides[r] == want {
					if got == nil {
						t.Fatalf("rank %d on the winning side: %v", r, err)
					}
					for q := 0; q < n; q++ {
						if slices.Contains(got.Failed, q) == (tc.sides[q] == want) {
							t.Fatalf("rank %d decided failed %v for sides %v", r, got.Failed, tc.sides)
						}
					}
				} else {
					var ae *AgreeError
					if got != nil || err == nil || !asAgreeErr(err, &ae) || !(ae.NoQuorum || ae.Excluded) {
						t.Fatalf("rank %d on a losing side: decision %+v, err %v", r, got, err)
					}
				}
			}
		})
	}
}

func asAgreeErr(err error, ae **AgreeError) bool {
	e, ok := err.(*AgreeError)
	*ae = e
	return ok
}

// TestAgreeRandomCrashes crashes up to a minority of the ranks at random
// points of the agreement, many times over, and checks that the live
// ranks decide the same, with the right flag, and that a live rank is
// left out only if a crash notice could not have been the reason.
func TestAgreeRandomCrashes(t *testing.T) {
	rounds := 400
	if testing.Short() {
		rounds = 100
	}
	for i := 0; i < rounds; i++ {
		seed := uint64(1000 + i)
		rng := rand.New(rand.NewPCG(seed, 1))
		n := 2 + rng.IntN(7)
		s := newSim(t, n, seed)
		kills := rng.IntN((n+1)/2 + 1) // up to half may die
		when := make(map[int]int)
		for len(when) < kills {
			when[rng.IntN(n)] = rng.IntN(20 * n)
		}
		for r := 0; r < n; r++ {
			s.start(r)
		}
		for s.steps < 500000 {
			for r, at := range when {
				if at == s.steps {
					s.crash(r)
				}
			}
			if !s.step() && s.steps > 20*n {
				break
			}
		}
		d := s.check()
		live := make([]bool, n)
		for r := range live {
			live[r] = !s.crashed[r]
		}
		for r := 0; r < n; r++ {
			if s.crashed[r] {
				continue
			}
			got, err := s.a[r].Result()
			if got == nil {
				var ae *AgreeError
				if !asAgreeErr(err, &ae) || !ae.NoQuorum {
					t.Fatalf("seed %d n=%d crashed %v: live rank %d: %v", seed, n, s.crashed, r, err)
				}
				if Quorum(n, live) {
					// Only crashed ranks are suspected: a live quorum decides.
					t.Fatalf("seed %d n=%d crashed %v: live rank %d found no quorum", seed, n, s.crashed, r)
				}
			}
		}
		if d != nil {
			for _, r := range d.Failed {
				if !s.crashed[r] {
					t.Fatalf("seed %d: live rank %d left out (crashed %v)", seed, r, s.crashed)
				}
			}
		}
	}
}

func TestQuorum(t *testing.T) {
	cases := []struct {
		q    []bool
		want bool
	}{
		{[]bool{true}, true},
		{[]bool{true, false}, true},
		{[]bool{false, true}, false},
		{[]bool{true, true, false}, true},
		{[]bool{false, true, false}, false},
		{[]bool{false, false, true, true}, false},
		{[]bool{true, false, false, true}, true},
		{[]bool{false, true, true, true}, true},
	}
	for _, tc := range cases {
		if got := Quorum(len(tc.q), tc.q); got != tc.want {
			t.Errorf("Quorum(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
}

func TestAgreeMsgValidate(t *testing.T) {
	bad := []AgreeMsg{
		{Kind: 0},
		{Kind: 9},
		{Kind: AgreePropose, Ballot: 4},
		{Kind: AgreePropose, Ballot: -1},
		{Kind: AgreePropose, Suspects: []int{7}},
		{Kind: AgreeCommit, Value: &Decision{Failed: []int{-1}}},
		{Kind: AgreePropose, Suspects: []int{0, 1, 2, 3, 0}},
		{Kind: AgreePropose, Extra: [][]byte{{}}},
		{Kind: AgreePropose, Extra: [][]byte{make([]byte, MaxExtraSize+1)}},
		{Kind: AgreePropose, Extra: make([][]byte, MaxExtra+1)},
		{Kind: AgreeCommit, Value: &Decision{Extra: [][]byte{nil}}},
	}
	for _, m := range bad {
		if m.Validate(4) == nil {
			t.Errorf("%+v validated", m)
		}
	}
	good := AgreeMsg{Kind: AgreeAccept, Ballot: 3, Suspects: []int{0, 1, 2}, Value: &Decision{Failed: []int{0}, Extra: [][]byte{{1}}}, VBallot: -1, Extra: [][]byte{make([]byte, MaxExtraSize)}}
	if err := good.Validate(4); err != nil {
		t.Error(err)
	}
}

// TestAgreeAdoptsAcceptedValue: a new coordinator whose promises carry a
// value accepted under an earlier coordinator proposes that value, not
// its own (Paxos's rule; what keeps a possibly chosen value chosen).
func TestAgreeAdoptsAcceptedValue(t *testing.T) {
	a := NewAgreement(3, 1)
	a.Start(^uint64(0), []int{0})
	a.Ready()
	v := Decision{Flag: 5, Failed: []int{}}
	a.Step(2, AgreeMsg{Kind: AgreePropose, Ballot: 1, Flag: 1, Suspects: []int{0}, Value: &v, VBallot: 0})
	var sent *Decision
	for _, o := range a.Ready() {
		if o.Msg.Kind == AgreeAccept {
			sent = o.Msg.Value
		}
	}
	if sent == nil || sent.Flag != 5 || len(sent.Failed) != 0 {
		t.Fatalf("coordinator proposed %+v, want the accepted %+v", sent, v)
	}
	a.Step(2, AgreeMsg{Kind: AgreeAck, Ballot: 1, VBallot: -1})
	if d, err := a.Result(); err != nil || d == nil || d.Flag != 5 {
		t.Fatalf("result %+v %v", d, err)
	}
}
