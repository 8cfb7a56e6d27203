package collective

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"
)

// memNet is an in-memory Link fabric for tests. Every (from, to, step) of
// more than InlineSendMax bytes is a rendezvous: Send blocks until the
// matching Recv takes the message, which is the strictest back-pressure a
// transport can apply, so a schedule that would deadlock on a real
// transport deadlocks here too (and times out). Smaller messages are eager,
// as the Link contract requires. It also rejects self-sends, reused steps
// and length mismatches.
type memNet struct {
	n      int
	tuning Tuning // a copy of testTuning when the net was made
	mu     sync.Mutex
	boxes  map[msgKey]*mbox
	sent   map[msgKey]bool
}

type msgKey struct {
	from, to int
	step     uint32
}

// mbox holds one message: data (capacity 1, so an eager send never waits)
// and taken, closed by the receiver.
type mbox struct {
	data  chan []byte
	taken chan struct{}
}

func newMemNet(n int) *memNet {
	return &memNet{n: n, tuning: testTuning.WithDefaults(), boxes: map[msgKey]*mbox{}, sent: map[msgKey]bool{}}
}

func (m *memNet) box(k msgKey) *mbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.boxes[k]
	if !ok {
		b = &mbox{data: make(chan []byte, 1), taken: make(chan struct{})}
		m.boxes[k] = b
	}
	return b
}

type memLink struct {
	net  *memNet
	rank int
}

// streamLink is a memLink that says it streams (Streamer): 2-rank ring
// allreduces over it take pairStream.
type streamLink struct{ *memLink }

func (streamLink) Stream(int) bool { return true }

func (l *memLink) Rank() int { return l.rank }
func (l *memLink) Size() int { return l.net.n }

func (l *memLink) Tuning() *Tuning { return &l.net.tuning }

func (l *memLink) Send(ctx context.Context, peer int, step uint32, data []byte) error {
	if peer < 0 || peer >= l.net.n || peer == l.rank {
		return fmt.Errorf("memlink: rank %d sends to bad peer %d", l.rank, peer)
	}
	k := msgKey{l.rank, peer, step}
	l.net.mu.Lock()
	dup := l.net.sent[k]
	l.net.sent[k] = true
	l.net.mu.Unlock()
	if dup {
		return fmt.Errorf("memlink: step %d reused from %d to %d", step, l.rank, peer)
	}
	b := l.net.box(k)
	b.data <- append([]byte(nil), data...) // never blocks: one message per box
	if len(data) <= InlineSendMax {
		return nil
	}
	select {
	case <-b.taken:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *memLink) Recv(ctx context.Context, peer int, step uint32, buf []byte) error {
	if peer < 0 || peer >= l.net.n || peer == l.rank {
		return fmt.Errorf("memlink: rank %d receives from bad peer %d", l.rank, peer)
	}
	b := l.net.box(msgKey{peer, l.rank, step})
	select {
	case d := <-b.data:
		close(b.taken)
		if len(d) != len(buf) {
			return fmt.Errorf("memlink: step %d from %d to %d: got %d bytes, want %d", step, peer, l.rank, len(d), len(buf))
		}
		copy(buf, d)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runRanks runs f on n ranks as goroutines and fails t with every rank's
// error. The first error cancels the others.
func runRanks(t *testing.T, n int, f func(ctx context.Context, l Link) error) {
	t.Helper()
	if err := tryRanks(n, 30*time.Second, f); err != nil {
		t.Fatal(err)
	}
}

func tryRanks(n int, timeout time.Duration, f func(ctx context.Context, l Link) error) error {
	net := newMemNet(n)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l Link = &memLink{net, r}
			if testStream != nil && testStream(r) {
				l = streamLink{&memLink{net, r}}
			}
			if err := f(ctx, l); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Element helpers for the reference. Integers are held as uint64 bits
// (sign-extended for signed types), floats as float64.

func getInt(b []byte, dt DType, i int) uint64 {
	switch dt {
	case Int8:
		return uint64(int64(int8(b[i])))
	case Uint8:
		return uint64(b[i])
	case Int32:
		return uint64(int64(int32(binary.LittleEndian.Uint32(b[4*i:]))))
	case Uint32:
		return uint64(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return binary.LittleEndian.Uint64(b[8*i:])
}

func putInt(b []byte, dt DType, i int, v uint64) {
	switch dt.Size() {
	case 1:
		b[i] = byte(v)
	case 4:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(b[8*i:], v)
	}
}

func getFloat(b []byte, dt DType, i int) float64 {
	switch dt {
	case Float16:
		return float64(F16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	case BFloat16:
		return float64(BF16ToF32(binary.LittleEndian.Uint16(b[2*i:])))
	case Float32:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b[8*i:]))
}

func putFloat(b []byte, dt DType, i int, v float64) {
	switch dt {
	case Float16:
		binary.LittleEndian.PutUint16(b[2*i:], F32ToF16(float32(v)))
	case BFloat16:
		binary.LittleEndian.PutUint16(b[2*i:], F32ToBF16(float32(v)))
	case Float32:
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
	default:
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
}

func signed(dt DType) bool { return dt == Int8 || dt == Int32 || dt == Int64 }

// refFold reduces ins in order into a new buffer: a sequential fold, the
// obvious definition of every reduction. For floats the test data keep
// every intermediate exact, so any association gives the same bits.
func refFold(ins [][]byte, dt DType, op Op) []byte {
	out := append([]byte(nil), ins[0]...)
	count := len(out) / dt.Size()
	if dt.IsFloat() {
		for i := 0; i < count; i++ {
			acc := getFloat(ins[0], dt, i)
			for _, in := range ins[1:] {
				x := getFloat(in, dt, i)
				switch op {
				case Sum, Avg:
					acc += x
				case Prod:
					acc *= x
				case Min:
					acc = math.Min(acc, x)
				case Max:
					acc = math.Max(acc, x)
				}
			}
			if op == Avg {
				acc /= float64(len(ins))
			}
			putFloat(out, dt, i, acc)
		}
		return out
	}
	for i := 0; i < count; i++ {
		acc := getInt(ins[0], dt, i)
		for _, in := range ins[1:] {
			x := getInt(in, dt, i)
			switch op {
			case Sum:
				acc += x
			case Prod:
				acc *= x
			case Band:
				acc &= x
			case Bor:
				acc |= x
			case Bxor:
				acc ^= x
			case Min, Max:
				less := acc < x
				if signed(dt) {
					less = int64(acc) < int64(x)
				}
				if less == (op == Max) {
					acc = x
				}
			}
		}
		putInt(out, dt, i, acc)
	}
	return out
}

// genInputs makes one input buffer of count elements per rank. Integers are
// random bits (the reference wraps like the kernels). Floats are small
// integers so that every partial result is exact in every type: products
// use ±1 and ±2 only, and for Avg the last rank's value makes each column
// sum divisible by n. sameAll gives every rank the same data.
func genInputs(rng *rand.Rand, n, count int, dt DType, op Op, sameAll bool) [][]byte {
	es := dt.Size()
	ins := make([][]byte, n)
	for r := range ins {
		ins[r] = make([]byte, count*es)
		if sameAll && r > 0 {
			copy(ins[r], ins[0])
			continue
		}
		if !dt.IsFloat() {
			fillRand(rng, ins[r])
			continue
		}
		for i := 0; i < count; i++ {
			var v float64
			if op == Prod {
				v = [...]float64{-2, -1, 1, 2}[rng.IntN(4)]
			} else {
				v = float64(rng.IntN(9) - 4)
			}
			putFloat(ins[r], dt, i, v)
		}
	}
	if op == Avg && !sameAll && n > 1 {
		for i := 0; i < count; i++ {
			s := 0.0
			for r := range ins {
				s += getFloat(ins[r], dt, i)
			}
			m := math.Mod(s, float64(n))
			last := getFloat(ins[n-1], dt, i)
			putFloat(ins[n-1], dt, i, last-m)
		}
	}
	return ins
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	fillRand(rng, b)
	return b
}

func fillRand(rng *rand.Rand, b []byte) {
	for len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, rng.Uint64())
		b = b[8:]
	}
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

type combo struct {
	dt DType
	op Op
}

func (c combo) String() string { return c.dt.String() + "/" + c.op.String() }

// allCombos lists every valid (dtype, op).
func allCombos() []combo {
	var cs []combo
	for dt := DType(0); dt < numDTypes; dt++ {
		for op := Op(0); op < numOps; op++ {
			if Check(dt, op) == nil {
				cs = append(cs, combo{dt, op})
			}
		}
	}
	return cs
}

// someCombos covers every dtype (with Sum) and every op (on one integer
// and one float type): enough for the algorithm variants.
func someCombos() []combo {
	var cs []combo
	for dt := DType(0); dt < numDTypes; dt++ {
		cs = append(cs, combo{dt, Sum})
	}
	for op := Op(0); op < numOps; op++ {
		if op == Sum {
			continue
		}
		for _, dt := range []DType{Int32, Float32, Float16} {
			if Check(dt, op) == nil {
				cs = append(cs, combo{dt, op})
			}
		}
	}
	return cs
}

var (
	worldSizes = []int{1, 2, 3, 4, 5, 8}
	smallCount = []int{0, 1, 7, 1000}
	largeCount = (1 << 20) + 3
)

// largeCases lists the (combo, world size) pairs run with largeCount
// elements. Under -short only the size-chosen algorithms get two of them;
// otherwise those get every dtype and op and the forced variants the two.
// The small counts (smallCount: 0, 1, the prime 7 and 1000, past every
// kernel's vector width) always run every combo on every world size.
//
// NEXAR_TEST_QUICK=1 (what `make test` sets for its -race run, where the
// large count costs most of the time) keeps the size-chosen algorithms to
// quickCombos on an odd and an even world size: one float and one integer
// kernel family besides the common float32 sum.
//
// NEXAR_TEST_EXHAUSTIVE=1 crosses largeCount with every dtype, op and world
// size instead (minutes without -race, hours with it: not part of make
// test); it overrides NEXAR_TEST_QUICK.
func largeCases(forced bool) ([]combo, []int) {
	switch {
	case os.Getenv("NEXAR_TEST_EXHAUSTIVE") == "1":
		return allCombos(), worldSizes
	case testing.Short() && forced:
		return nil, nil
	case testing.Short():
		return []combo{{Float32, Sum}}, []int{3}
	case forced:
		return []combo{{Float32, Sum}, {Int8, Max}}, []int{3}
	case quick():
		return quickCombos, []int{3, 8}
	}
	return someCombos(), []int{3, 8}
}

// quickCombos are the large-count combos of NEXAR_TEST_QUICK=1: float32
// sum, a half-precision float with an op that divides (avg), and a signed
// integer with a comparison.
var quickCombos = []combo{{Float32, Sum}, {BFloat16, Avg}, {Int64, Min}}

// quick reports whether NEXAR_TEST_QUICK=1 asks for the reduced matrix.
func quick() bool { return os.Getenv("NEXAR_TEST_QUICK") == "1" }

// testTuning is what the next memNet's links carry. Only this package's
// tests touch it, never in parallel (no test here calls t.Parallel): it
// keeps the many check helpers free of a tuning parameter.
var testTuning Tuning

// testStream says which ranks' links, of the next memNet, stream
// (streamLink); nil: none.
var testStream func(rank int) bool

// withForce sets one field of testTuning.Force for the duration of f.
func withForce(p *Algorithm, a Algorithm, f func()) {
	old := *p
	*p = a
	defer func() { *p = old }()
	f()
}

func equalBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: first difference at byte %d of %d: got %#x, want %#x", what, i, len(got), got[i], want[i])
		}
	}
}
