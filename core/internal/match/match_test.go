package match

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"unsafe"
)

func yes(int64) bool { return true }
func no(int64) bool  { return false }

// collEv is one event of a collective script: post a receive of n bytes,
// deliver or place a chunk of a message total bytes long, unpost.
type collEv struct {
	do    string // "post", "deliver", "deliver-full" (room refused), "place", "unpost"
	total int    // deliver/place: the sender's message length
	data  string // deliver/place: the chunk
	n     int    // post: buffer length

	want     Outcome // deliver
	pending  bool    // post: a message to wait for is returned
	mismatch bool    // post/deliver: reports a Mismatch
	released int64   // post: bytes the engine stopped holding
	done     bool    // a completion is reported by this event
}

func TestCollScripts(t *testing.T) {
	k := Key{Src: 1, Seq: 7, Step: 2}
	for _, tc := range []struct {
		name   string
		evs    []collEv
		result string // the posted buffer at the end
	}{
		{"posted then delivered in chunks", []collEv{
			{do: "post", n: 6, pending: true},
			{do: "deliver", total: 6, data: "abc", want: Copied},
			{do: "deliver", total: 6, data: "def", want: Copied, done: true},
		}, "abcdef"},
		{"delivered whole then posted", []collEv{
			{do: "deliver", total: 6, data: "abc", want: Buffered},
			{do: "deliver", total: 6, data: "def", want: Buffered},
			{do: "post", n: 6, released: 6},
		}, "abcdef"},
		{"half delivered, posted, rest delivered", []collEv{
			{do: "deliver", total: 6, data: "ab", want: Buffered},
			{do: "post", n: 6, pending: true, released: 2},
			{do: "deliver", total: 6, data: "cdef", want: Copied, done: true},
		}, "abcdef"},
		{"no room then room", []collEv{
			{do: "deliver-full", total: 3, data: "xyz", want: NoRoom},
			{do: "deliver", total: 3, data: "xyz", want: Buffered},
			{do: "post", n: 3, released: 3},
		}, "xyz"},
		{"placed chunks", []collEv{
			{do: "post", n: 4, pending: true},
			{do: "place", total: 4, data: "ab"},
			{do: "place", total: 4, data: "cd", done: true},
		}, "abcd"},
		{"placed whole", []collEv{
			{do: "post", n: 4, pending: true},
			{do: "place", total: 4, data: "abcd"},
			{do: "deliver", total: 4, data: "zz", want: Buffered}, // a later message of the key is held
		}, "abcd"},
		{"placed then delivered", []collEv{
			{do: "post", n: 4, pending: true},
			{do: "place", total: 4, data: "ab"},
			{do: "deliver", total: 4, data: "cd", want: Copied, done: true},
		}, "abcd"},
		{"sender longer than the posted receive", []collEv{
			{do: "post", n: 4, pending: true},
			{do: "deliver", total: 8, data: "abcd", want: Mismatched, mismatch: true},
		}, "\x00\x00\x00\x00"},
		{"arrived longer than the receive posted after", []collEv{
			{do: "deliver", total: 8, data: "abcdefgh", want: Buffered},
			{do: "post", n: 4, mismatch: true},
		}, "\x00\x00\x00\x00"},
		{"withdrawn receive: later chunks are held, not written", []collEv{
			{do: "post", n: 2, pending: true},
			{do: "unpost"},
			{do: "deliver", total: 2, data: "zz", want: Buffered},
		}, "\x00\x00"},
		{"empty message", []collEv{
			{do: "post", n: 0, pending: true},
			{do: "deliver", total: 0, data: "", want: Copied, done: true},
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(4)
			var buf []byte
			var m *Msg
			for i, ev := range tc.evs {
				var out Outcome
				var mm *Mismatch
				switch ev.do {
				case "post":
					buf = make([]byte, ev.n)
					var rel int64
					m, rel, mm = e.PostColl(k, buf)
					if (m != nil) != ev.pending || rel != ev.released {
						t.Fatalf("event %d: post: pending %v released %d, want %v %d", i, m != nil, rel, ev.pending, ev.released)
					}
				case "deliver", "deliver-full":
					room := yes
					if ev.do == "deliver-full" {
						room = no
					}
					out, mm = e.DeliverColl(k, ev.total, []byte(ev.data), room)
					if out != ev.want {
						t.Fatalf("event %d: deliver: %v, want %v", i, out, ev.want)
					}
				case "place":
					pm, dst, whole := e.PlaceColl(k, ev.total, len(ev.data))
					if pm == nil {
						t.Fatalf("event %d: place refused", i)
					}
					if whole != (len(ev.data) == ev.total) {
						t.Fatalf("event %d: placed whole %v for %d of %d bytes", i, whole, len(ev.data), ev.total)
					}
					if again, _, _ := e.PlaceColl(k, ev.total, 1); again != nil {
						t.Fatalf("event %d: a second place while filling was accepted", i)
					}
					copy(dst, ev.data)
					if whole {
						// The driver completes it: the engine forgot it.
						if e.lookup(k) != nil {
							t.Fatalf("event %d: a message placed whole is still registered", i)
						}
						pm.EndFill()
						pm.Done.Fire()
					} else {
						e.FilledColl(k, pm, len(ev.data), true)
					}
				case "unpost":
					e.UnpostColl(k, m)
				}
				if (mm != nil) != ev.mismatch {
					t.Fatalf("event %d: mismatch %+v, want %v", i, mm, ev.mismatch)
				}
				ready := e.Ready()
				if (len(ready) == 1) != ev.done || len(ready) > 1 {
					t.Fatalf("event %d: completions %+v, want done=%v", i, ready, ev.done)
				}
				if ev.done && (ready[0].Coll != m || ready[0].Err != nil) {
					t.Fatalf("event %d: completion %+v names another message", i, ready[0])
				}
			}
			if string(buf) != tc.result {
				t.Fatalf("buffer %q, want %q", buf, tc.result)
			}
		})
	}
}

// Pooled chunks go back through Free once copied into their receive, and
// only then: held ones when PostColl takes them, others at once; the
// driver's other chunks never do.
func TestDeliverCollPooledFrees(t *testing.T) {
	e := New(2)
	var freed []string
	e.Free = func(b []byte) {
		freed = append(freed, string(b))
		clear(b) // the driver reuses it: the receive must not see this
	}
	early := Key{Src: 1, Seq: 1}
	if out, _ := e.DeliverCollPooled(early, 6, []byte("abc"), yes); out != Buffered {
		t.Fatalf("first chunk: %v, want Buffered", out)
	}
	if out, _ := e.DeliverColl(early, 6, []byte("de"), yes); out != Buffered {
		t.Fatalf("second chunk: %v, want Buffered", out)
	}
	if len(freed) != 0 {
		t.Fatalf("freed %q while held", freed)
	}
	buf := make([]byte, 6)
	m, rel, mm := e.PostColl(early, buf)
	if m == nil || mm != nil || rel != 5 {
		t.Fatalf("PostColl: %v %d %v", m, rel, mm)
	}
	if len(freed) != 1 || freed[0] != "abc" {
		t.Fatalf("freed %q, want the pooled chunk alone", freed)
	}
	if out, _ := e.DeliverCollPooled(early, 6, []byte("f"), yes); out != Copied {
		t.Fatalf("last chunk: %v, want Copied", out)
	}
	if len(freed) != 2 || freed[1] != "f" {
		t.Fatalf("freed %q, want the copied chunk too", freed)
	}
	if string(buf) != "abcdef" {
		t.Fatalf("receive %q, want abcdef", buf)
	}
}

// Likewise for point-to-point messages: an unexpected one's pooled chunks
// go back when a receive takes it, a matched one's at once.
func TestDeliverP2PPooledFrees(t *testing.T) {
	e := New(2)
	var freed []string
	e.Free = func(b []byte) {
		freed = append(freed, string(b))
		clear(b)
	}
	if out := e.DeliverP2PPooled(1, 7, 5, []byte("hel"), yes); out != Buffered {
		t.Fatalf("unexpected chunk: %v, want Buffered", out)
	}
	if len(freed) != 0 {
		t.Fatalf("freed %q while held", freed)
	}
	r := &Recv{Src: 1, Tag: 7, Buf: make([]byte, 5)}
	if ok, rel := e.TakeUnexpected(r); !ok || rel != 3 {
		t.Fatalf("TakeUnexpected: %v %d", ok, rel)
	}
	if len(freed) != 1 || freed[0] != "hel" {
		t.Fatalf("freed %q, want the held chunk", freed)
	}
	if out := e.DeliverP2PPooled(1, 7, 5, []byte("lo"), yes); out != Copied {
		t.Fatalf("matched chunk: %v, want Copied", out)
	}
	if len(freed) != 2 || freed[1] != "lo" {
		t.Fatalf("freed %q, want the copied chunk too", freed)
	}
	if string(r.Buf) != "hello" {
		t.Fatalf("receive %q, want hello", r.Buf)
	}
	if out := e.DeliverP2P(0, 1, 2, []byte("no"), yes); out != Buffered || len(freed) != 2 {
		t.Fatalf("a chunk not from the pool: %v, freed %q", out, freed)
	}
}

func TestCollMismatchNamesTheCall(t *testing.T) {
	e := New(2)
	k := Key{Src: 1, Seq: 3, Step: 9}
	e.PostColl(k, make([]byte, 4))
	_, mm := e.DeliverColl(k, 12, make([]byte, 12), yes)
	if mm == nil || *mm != (Mismatch{Key: k, Sent: 12, Want: 4}) {
		t.Fatalf("mismatch %+v", mm)
	}
}

func TestPlaceRefusals(t *testing.T) {
	k := Key{Src: 0, Seq: 1}
	e := New(2)
	if m, _, _ := e.PlaceColl(k, 4, 4); m != nil {
		t.Fatal("placed a message with no receive posted")
	}
	e.PostColl(k, make([]byte, 4))
	if m, _, _ := e.PlaceColl(k, 8, 4); m != nil {
		t.Fatal("placed into a receive of another length")
	}
	if m, _, _ := e.PlaceColl(k, 4, 5); m != nil {
		t.Fatal("placed past the end of the buffer")
	}
	m, _, whole := e.PlaceColl(k, 4, 2)
	if whole {
		t.Fatal("half a message placed whole")
	}
	e.FilledColl(k, m, 2, false) // the transport failed mid-write
	if len(e.Ready()) != 0 || m.Filling() {
		t.Fatal("a failed write completed the receive or left it filling")
	}
}

// p2pEv is one event of a point-to-point script.
type p2pEv struct {
	do    string // "recv" (post a receive), "deliver", "place", "cancel"
	src   int
	tag   uint64
	total int
	data  string
	n     int // recv: buffer length
	id    int // recv/cancel: which receive

	done []int // receives completed by this event, in order
}

func TestP2PScripts(t *testing.T) {
	for _, tc := range []struct {
		name string
		evs  []p2pEv
		bufs map[int]string // the receives' buffers at the end
		cnt  map[int]int    // Count of completed receives
		tot  map[int]int    // Total of completed receives
	}{
		{"posted then delivered", []p2pEv{
			{do: "recv", id: 1, src: 2, tag: 5, n: 4},
			{do: "deliver", src: 2, tag: 5, total: 4, data: "ab"},
			{do: "deliver", src: 2, tag: 5, total: 4, data: "cd", done: []int{1}},
		}, map[int]string{1: "abcd"}, map[int]int{1: 4}, map[int]int{1: 4}},
		{"unexpected then received", []p2pEv{
			{do: "deliver", src: 2, tag: 5, total: 3, data: "xyz"},
			{do: "recv", id: 1, src: 2, tag: 5, n: 8, done: []int{1}},
		}, map[int]string{1: "xyz\x00\x00\x00\x00\x00"}, map[int]int{1: 3}, map[int]int{1: 3}},
		{"half arrived, received, rest arrives", []p2pEv{
			{do: "deliver", src: 0, tag: 1, total: 4, data: "ab"},
			{do: "recv", id: 1, src: AnySource, tag: 1, n: 4},
			{do: "deliver", src: 0, tag: 1, total: 4, data: "cd", done: []int{1}},
		}, map[int]string{1: "abcd"}, map[int]int{1: 4}, map[int]int{1: 4}},
		{"tags select, order per tag is kept", []p2pEv{
			{do: "deliver", src: 1, tag: 9, total: 1, data: "a"},
			{do: "deliver", src: 1, tag: 8, total: 1, data: "b"},
			{do: "deliver", src: 1, tag: 9, total: 1, data: "c"},
			{do: "recv", id: 1, src: 1, tag: 8, n: 1, done: []int{1}},
			{do: "recv", id: 2, src: 1, tag: 9, n: 1, done: []int{2}},
			{do: "recv", id: 3, src: 1, tag: 9, n: 1, done: []int{3}},
		}, map[int]string{1: "b", 2: "a", 3: "c"}, nil, nil},
		{"posted receives match in posting order", []p2pEv{
			{do: "recv", id: 1, src: AnySource, tag: 4, n: 1},
			{do: "recv", id: 2, src: 3, tag: 4, n: 1},
			{do: "deliver", src: 3, tag: 4, total: 1, data: "p", done: []int{1}},
			{do: "deliver", src: 3, tag: 4, total: 1, data: "q", done: []int{2}},
		}, map[int]string{1: "p", 2: "q"}, nil, nil},
		{"truncated", []p2pEv{
			{do: "recv", id: 1, src: 0, tag: 0, n: 2},
			{do: "deliver", src: 0, tag: 0, total: 5, data: "hello", done: []int{1}},
		}, map[int]string{1: "he"}, map[int]int{1: 2}, map[int]int{1: 5}},
		{"cancelled receive neither completes nor is written", []p2pEv{
			{do: "recv", id: 1, src: 0, tag: 0, n: 4},
			{do: "deliver", src: 0, tag: 0, total: 4, data: "ab"},
			{do: "cancel", id: 1},
			{do: "deliver", src: 0, tag: 0, total: 4, data: "cd"},
		}, map[int]string{1: "ab\x00\x00"}, nil, nil},
		{"cancelled before anything arrived: the message is unexpected", []p2pEv{
			{do: "recv", id: 1, src: 0, tag: 0, n: 1},
			{do: "cancel", id: 1},
			{do: "deliver", src: 0, tag: 0, total: 1, data: "z"},
			{do: "recv", id: 2, src: 0, tag: 0, n: 1, done: []int{2}},
		}, map[int]string{1: "\x00", 2: "z"}, nil, nil},
		{"placed whole", []p2pEv{
			{do: "recv", id: 1, src: 1, tag: 2, n: 4},
			{do: "place", src: 1, tag: 2, total: 4, data: "ab"},
			{do: "place", src: 1, tag: 2, total: 4, data: "cd", done: []int{1}},
		}, map[int]string{1: "abcd"}, map[int]int{1: 4}, map[int]int{1: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(4)
			recvs := map[int]*Recv{}
			for i, ev := range tc.evs {
				switch ev.do {
				case "recv":
					r := &Recv{Src: ev.src, Tag: ev.tag, Buf: make([]byte, ev.n), Owner: ev.id}
					recvs[ev.id] = r
					if ok, _ := e.TakeUnexpected(r); !ok {
						e.Post(r)
					}
				case "deliver":
					if out := e.DeliverP2P(ev.src, ev.tag, ev.total, []byte(ev.data), yes); out == NoRoom || out == Mismatched {
						t.Fatalf("event %d: %v", i, out)
					}
				case "place":
					m, dst := e.PlaceP2P(ev.src, ev.tag, ev.total, len(ev.data), nil)
					if m == nil {
						t.Fatalf("event %d: place refused", i)
					}
					copy(dst, ev.data)
					e.FilledP2P(ev.src, m, len(ev.data), true)
				case "cancel":
					e.Cancel(recvs[ev.id])
				}
				var got []int
				for _, d := range e.Ready() {
					if d.Err != nil {
						t.Fatalf("event %d: completion with error %v", i, d.Err)
					}
					id := d.Recv.Owner.(int)
					got = append(got, id)
					if want, ok := tc.cnt[id]; ok && d.Count != want {
						t.Fatalf("receive %d: Count %d, want %d", id, d.Count, want)
					}
					if want, ok := tc.tot[id]; ok && d.Total != want {
						t.Fatalf("receive %d: Total %d, want %d", id, d.Total, want)
					}
				}
				if !equalInts(got, ev.done) {
					t.Fatalf("event %d (%s): completed %v, want %v", i, ev.do, got, ev.done)
				}
			}
			for id, want := range tc.bufs {
				if !bytes.Equal(recvs[id].Buf, []byte(want)) {
					t.Fatalf("receive %d holds %q, want %q", id, recvs[id].Buf, want)
				}
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPlaceP2PLeavesTruncationToDeliver(t *testing.T) {
	e := New(2)
	r := &Recv{Src: 1, Buf: make([]byte, 2)}
	e.Post(r)
	if m, _ := e.PlaceP2P(1, 0, 8, 2, nil); m != nil {
		t.Fatal("placed a message longer than the receive's buffer")
	}
	if m, _ := e.PlaceP2P(0, 0, 2, 2, nil); m != nil {
		t.Fatal("placed a message from another source")
	}
}

func TestNoRoomHoldsNothing(t *testing.T) {
	e := New(2)
	if out := e.DeliverP2P(1, 0, 4, []byte("ab"), no); out != NoRoom {
		t.Fatalf("%v, want NoRoom", out)
	}
	if held := e.Drop(); held != 0 {
		t.Fatalf("Drop released %d bytes never accounted", held)
	}
}

func TestDepart(t *testing.T) {
	gone := errors.New("rank 1 left")
	e := New(3)
	// Rank 1 left having completed every collective before seq 5.
	whole := Key{Src: 1, Seq: 4, Step: 0}    // arrived whole: still receivable
	partial := Key{Src: 1, Seq: 4, Step: 1}  // cut short: dropped
	later := Key{Src: 2, Seq: 5, Step: 0}    // rank 2's, of a call that fails everywhere: dropped
	waiting := Key{Src: 1, Seq: 3, Step: 0}  // posted: fails
	waiting2 := Key{Src: 2, Seq: 6, Step: 0} // posted, from rank 2 but of a failed call: fails
	kept := Key{Src: 2, Seq: 4, Step: 0}     // posted, rank 2, an earlier call: stays
	e.DeliverColl(whole, 2, []byte("ok"), yes)
	e.DeliverColl(partial, 4, []byte("ha"), yes)
	e.DeliverColl(later, 3, []byte("xyz"), yes)
	mw, _, _ := e.PostColl(waiting, make([]byte, 1))
	mw2, _, _ := e.PostColl(waiting2, make([]byte, 1))
	mk, _, _ := e.PostColl(kept, make([]byte, 1))
	// Point-to-point: a receive for rank 1, one for any source, a message
	// in progress from rank 1 matched with a receive, one from rank 1 not
	// matched (after the first completes).
	rFor1 := &Recv{Src: 1, Tag: 1, Buf: make([]byte, 1), Owner: "for1"}
	rAny := &Recv{Src: AnySource, Tag: 1, Buf: make([]byte, 1), Owner: "any"}
	rCut := &Recv{Src: 1, Tag: 2, Buf: make([]byte, 4), Owner: "cut"}
	e.Post(rCut)
	e.DeliverP2P(1, 2, 4, []byte("ab"), yes) // in progress, matched with rCut
	e.Post(rFor1)
	e.Post(rAny)
	if len(e.Ready()) != 0 {
		t.Fatal("completions before the departure")
	}
	released := e.Depart(1, 5, gone)
	if released != 2+3 {
		t.Fatalf("released %d bytes, want 5 (the cut-short and the failed call's)", released)
	}
	failed := map[any]bool{}
	for _, d := range e.Ready() {
		if d.Err != gone {
			t.Fatalf("completion %+v without the departure's error", d)
		}
		if d.Coll != nil {
			failed[d.Coll] = true
		} else {
			failed[d.Recv.Owner] = true
		}
	}
	for what, want := range map[any]bool{mw: true, mw2: true, mk: false, "for1": true, "cut": true, "any": false} {
		if failed[what] != want {
			t.Errorf("%v failed: %v, want %v", what, failed[what], want)
		}
	}
	if mw.Err != gone {
		t.Error("the failed collective receive's Err is not the departure's")
	}
	buf := make([]byte, 2)
	if m, rel, mm := e.PostColl(whole, buf); m != nil || mm != nil || rel != 2 || string(buf) != "ok" {
		t.Fatalf("the message that arrived whole before the departure: %v %v %d %q", m, mm, rel, buf)
	}
	if e.Arrived(partial) || e.Arrived(later) {
		t.Fatal("a dropped message is still held")
	}
}

func TestDepartDropsUnmatchedMessageInProgress(t *testing.T) {
	e := New(2)
	e.DeliverP2P(1, 0, 10, []byte("abcd"), yes)
	if released := e.Depart(1, 0, errors.New("left")); released != 4 {
		t.Fatalf("released %d, want 4", released)
	}
	if held := e.Drop(); held != 0 {
		t.Fatalf("Drop after Depart released %d more bytes", held)
	}
}

// A partial unmatched message is both unexpected and in progress; Drop
// must count its bytes once (the code before the engine counted twice).
func TestDropCountsEachHeldByteOnce(t *testing.T) {
	e := New(3)
	e.DeliverP2P(1, 0, 10, []byte("abcd"), yes)             // partial, unexpected
	e.DeliverP2P(2, 0, 2, []byte("xy"), yes)                // whole, unexpected
	e.DeliverColl(Key{Src: 1, Seq: 1}, 3, []byte("q"), yes) // partial collective
	if held := e.Drop(); held != 4+2+1 {
		t.Fatalf("Drop released %d bytes, want 7", held)
	}
	if held := e.Drop(); held != 0 {
		t.Fatalf("second Drop released %d", held)
	}
}

// TestReleaseReuses checks that a released collective message comes back
// as a fresh one for another key: no state of the old call leaks into it
// (its Signal unfired, no error, nothing received), the driver's Fill is
// kept, and the new receive completes on its own data.
func TestReleaseReuses(t *testing.T) {
	e := New(2)
	k1, k2 := Key{Src: 1, Seq: 1}, Key{Src: 1, Seq: 2}
	b1 := make([]byte, 4)
	m, _, _ := e.PostColl(k1, b1)
	fill := func(error) {}
	m.Fill = fill
	if out, _ := e.DeliverColl(k1, 4, []byte("abcd"), yes); out != Copied {
		t.Fatalf("deliver: %v", out)
	}
	for _, d := range e.Ready() {
		d.Coll.Done.Fire()
	}
	if !m.Done.Fired() || string(b1) != "abcd" {
		t.Fatalf("first receive: fired %v, got %q", m.Done.Fired(), b1)
	}
	m.Err = errors.New("stale")
	e.Release(m)
	// sync.Pool may drop what it holds (it does, at random, under the race
	// detector): reuse is likely, not certain; a reused one must be clean.
	b2 := make([]byte, 2)
	m2, _, _ := e.PostColl(k2, b2)
	if m2 == nil || m2.Done.Fired() || m2.Err != nil || m2.Key() != k2 || m2.Filling() {
		t.Fatalf("second receive starts dirty: %+v", m2)
	}
	if m2 == m && m2.Fill == nil {
		t.Fatal("a reused message lost the driver's Fill")
	}
	if p := e.lookup(k1); p != nil {
		t.Fatal("the first call's message is still registered")
	}
	if out, _ := e.DeliverColl(k2, 2, []byte("xy"), yes); out != Copied {
		t.Fatalf("deliver: %v", out)
	}
	if r := e.Ready(); len(r) != 1 || r[0].Coll != m2 || string(b2) != "xy" {
		t.Fatalf("second receive: %d completions, got %q", len(r), b2)
	}
}

// TestCollSlotsAndOverflow runs messages that do not fit their call's slot
// (more than slotMsgs per call, and calls sharing a slot,
// seq and seq+collWindow) through every collective entry point: each is
// found, completed, withdrawn, departed and dropped exactly as a message
// in its slot is, and a slot freed by its call is taken by the next.
func TestCollSlotsAndOverflow(t *testing.T) {
	const steps = slotMsgs + 3
	for _, tc := range []struct {
		name string
		keys []Key
	}{
		{"many steps in one call", func() (ks []Key) {
			for s := range steps {
				ks = append(ks, Key{Src: 1, Seq: 5, Step: uint32(s)})
			}
			return ks
		}()},
		{"calls sharing a slot", []Key{
			{Src: 1, Seq: 5}, {Src: 1, Seq: 5 + collWindow}, {Src: 0, Seq: 5 + 2*collWindow}, {Src: 0, Seq: 5},
		}},
	} {
		t.Run(tc.name+"/posted first", func(t *testing.T) {
			e := New(2)
			ms := make([]*Msg, len(tc.keys))
			bufs := make([][]byte, len(tc.keys))
			for i, k := range tc.keys {
				bufs[i] = make([]byte, 2)
				if ms[i], _, _ = e.PostColl(k, bufs[i]); ms[i] == nil {
					t.Fatalf("key %+v: nothing to wait for", k)
				}
			}
			if len(e.coll) == 0 || len(e.coll) == len(tc.keys) {
				t.Fatalf("%d of %d messages in the overflow: the case misses slot or overflow", len(e.coll), len(tc.keys))
			}
			for i := len(tc.keys) - 1; i >= 0; i-- { // out of order
				k := tc.keys[i]
				if e.Arrived(k) {
					t.Fatalf("key %+v: a posted receive reported arrived", k)
				}
				if out, _ := e.DeliverColl(k, 2, []byte{byte(i), 1}, no); out != Copied {
					t.Fatalf("key %+v: deliver %v", k, out)
				}
				r := e.Ready()
				if len(r) != 1 || r[0].Coll != ms[i] || bufs[i][0] != byte(i) {
					t.Fatalf("key %+v: completions %+v, buffer %v", k, r, bufs[i])
				}
				if e.lookup(k) != nil {
					t.Fatalf("key %+v: still registered after completing", k)
				}
			}
			if len(e.coll) != 0 || len(e.registered()) != 0 {
				t.Fatalf("left registered: %d in the overflow, %d in all", len(e.coll), len(e.registered()))
			}
		})
		t.Run(tc.name+"/arrived first", func(t *testing.T) {
			e := New(2)
			for i, k := range tc.keys {
				if out, _ := e.DeliverColl(k, 2, []byte{byte(i), 2}, yes); out != Buffered {
					t.Fatalf("key %+v: deliver %v", k, out)
				}
				if !e.Arrived(k) {
					t.Fatalf("key %+v: not arrived", k)
				}
			}
			for i, k := range tc.keys {
				buf := make([]byte, 2)
				m, rel, mm := e.PostColl(k, buf)
				if m != nil || rel != 2 || mm != nil || buf[0] != byte(i) {
					t.Fatalf("key %+v: post: %v, released %d, %+v, got %v", k, m, rel, mm, buf)
				}
			}
			if len(e.registered()) != 0 {
				t.Fatalf("%d left registered", len(e.registered()))
			}
		})
		t.Run(tc.name+"/withdrawn, departed, dropped", func(t *testing.T) {
			e := New(2)
			ms := make([]*Msg, len(tc.keys))
			for i, k := range tc.keys {
				ms[i], _, _ = e.PostColl(k, make([]byte, 2))
			}
			e.UnpostColl(tc.keys[0], ms[0])
			if e.lookup(tc.keys[0]) != nil {
				t.Fatal("a withdrawn receive is still registered")
			}
			e.UnpostColl(tc.keys[1], ms[0]) // another key's message: no effect
			if e.lookup(tc.keys[1]) != ms[1] {
				t.Fatal("withdrawing another message removed this one")
			}
			cause := errors.New("gone")
			e.Depart(1, ^uint64(0), cause)
			failed := map[*Msg]bool{}
			for _, d := range e.Ready() {
				if d.Err != cause {
					t.Fatalf("completion %+v", d)
				}
				failed[d.Coll] = true
			}
			for i, k := range tc.keys[1:] {
				if failed[ms[i+1]] != (k.Src == 1) || (e.lookup(k) != nil) == (k.Src == 1) {
					t.Fatalf("key %+v after rank 1 departed: failed %v, registered %v", k, failed[ms[i+1]], e.lookup(k) != nil)
				}
			}
			e.DeliverColl(Key{Src: 0, Seq: 9 + collWindow}, 3, []byte("abc"), yes)
			if held := e.Drop(); held != 3 {
				t.Fatalf("drop: held %d, want 3", held)
			}
			if len(e.registered()) != 0 || len(e.coll) != 0 {
				t.Fatal("registered after Drop")
			}
		})
	}
}

// fenced is a receive buffer the host may not touch (PROT_NONE, as the
// fake CUDA's device memory is): a copy into it by the engine crashes the
// test. Its Put writes into shadow instead, at the same offsets.
type fenced struct {
	buf, shadow []byte
	puts        int
	fail        error
}

func newFenced(t *testing.T, n int) *fenced {
	t.Helper()
	page := syscall.Getpagesize()
	m, err := syscall.Mmap(-1, 0, (n+page-1)/page*page+page, syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(m) })
	return &fenced{buf: m[:n:n], shadow: make([]byte, n)}
}

func (f *fenced) put(dst, src []byte) error {
	if f.fail != nil {
		return f.fail
	}
	off := int(uintptr(unsafe.Pointer(&dst[0])) - uintptr(unsafe.Pointer(&f.buf[0])))
	if off < 0 || off+len(dst) > len(f.buf) || len(src) != len(dst) {
		panic("Put outside the receive's buffer")
	}
	copy(f.shadow[off:], src)
	f.puts++
	return nil
}

// TestPutNeverTouchesBuf: a receive with Put gets every byte the engine
// would copy (early chunks taken, chunks delivered, a truncated message
// cut at the buffer's end) through Put, never by a copy into Buf; it is
// placed only where putOK allows; a failed Put fails the receive.
func TestPutNeverTouchesBuf(t *testing.T) {
	never := func(int) bool { return false }
	always := func(int) bool { return true }
	t.Run("taken, then delivered", func(t *testing.T) {
		e := New(2)
		f := newFenced(t, 6)
		e.DeliverP2P(1, 5, 6, []byte("ab"), yes)
		r := &Recv{Src: AnySource, Tag: 5, Buf: f.buf, Put: f.put}
		if ok, released := e.TakeUnexpected(r); !ok || released != 2 {
			t.Fatalf("TakeUnexpected: %v, %d", ok, released)
		}
		if m, _ := e.PlaceP2P(1, 5, 6, 4, never); m != nil {
			t.Fatal("placed into a Put receive where putOK says no")
		}
		e.DeliverP2P(1, 5, 6, []byte("cdef"), yes)
		c := e.Ready()
		if len(c) != 1 || c[0].Recv != r || c[0].Err != nil || c[0].Count != 6 || string(f.shadow) != "abcdef" {
			t.Fatalf("completions %+v, shadow %q", c, f.shadow)
		}
	})
	t.Run("truncated", func(t *testing.T) {
		e := New(2)
		f := newFenced(t, 3)
		r := &Recv{Src: 1, Tag: 0, Buf: f.buf, Put: f.put}
		e.Post(r)
		if m, _ := e.PlaceP2P(1, 0, 5, 5, always); m != nil {
			t.Fatal("placed a message longer than the buffer")
		}
		e.DeliverP2P(1, 0, 5, []byte("wx"), yes)
		e.DeliverP2P(1, 0, 5, []byte("yz!"), yes)
		c := e.Ready()
		if len(c) != 1 || c[0].Total != 5 || c[0].Count != 3 || string(f.shadow) != "wxy" || f.puts != 2 {
			t.Fatalf("completions %+v, shadow %q after %d puts", c, f.shadow, f.puts)
		}
	})
	t.Run("placed where putOK", func(t *testing.T) {
		e := New(2)
		f := newFenced(t, 4)
		r := &Recv{Src: 1, Tag: 0, Buf: f.buf, Put: f.put}
		e.Post(r)
		m, dst := e.PlaceP2P(1, 0, 4, 4, always)
		if m == nil || &dst[0] != &f.buf[0] || len(dst) != 4 {
			t.Fatal("not placed into the receive's buffer where putOK allows")
		}
		e.FilledP2P(1, m, 4, true)
		if c := e.Ready(); len(c) != 1 || c[0].Err != nil || f.puts != 0 {
			t.Fatalf("completions %+v after %d puts", c, f.puts)
		}
	})
	t.Run("failed put", func(t *testing.T) {
		e := New(2)
		f := newFenced(t, 4)
		f.fail = errors.New("copy failed")
		e.Post(&Recv{Src: 1, Tag: 0, Buf: f.buf, Put: f.put})
		e.DeliverP2P(1, 0, 4, []byte("abcd"), yes)
		if c := e.Ready(); len(c) != 1 || !errors.Is(c[0].Err, f.fail) {
			t.Fatalf("completions %+v, want the Put's error", c)
		}
	})
}
