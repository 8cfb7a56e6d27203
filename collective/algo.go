package collective

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// Every algorithm in this package is a function of its arguments and of the
// Tuning its Link carries: calls are safe to run concurrently with each
// other (on different Links or with distinct step scopes). Each algorithm
// returns only after every goroutine it started has returned. Nothing here
// reads or writes package-level state.

// InlineSendMax: in a simultaneous send and receive, sends of at most this
// many bytes are made before the receive, in the same goroutine; larger ones
// run concurrently with it. It is part of the Link contract (a Send this
// small must not wait for its Recv), not a knob.
const InlineSendMax = 64 << 10

// MaxChunkSize is the largest Tuning.ChunkSize: transport.MaxPayload, which
// this package does not import.
const MaxChunkSize = 16 << 20

// Tuning holds the knobs that choose and shape schedules. A Link carries one
// (Link.Tuning) and every call reads it at its start; all ranks must use
// equal values, since the chunk size changes the step numbering and the
// algorithm choice changes who talks to whom. core owns it per communicator
// (core.Config.Tuning) and puts Digest into the signature that ranks
// compare, so ranks that disagree fail with a mismatch instead of hanging.
//
// A zero field means its default (DefaultTuning); WithDefaults fills them.
type Tuning struct {
	// ChunkSize bounds one Link message; larger transfers are split into
	// several Send/Recv steps. At most MaxChunkSize.
	ChunkSize int

	// PipelineSegment is the unit that pipelined schedules (chain broadcast,
	// chain scan) forward while receiving the next one. Clamped to ChunkSize.
	PipelineSegment int

	// AllreduceRingThreshold: allreduce payloads of at least this many bytes
	// use ring reduce-scatter + ring allgather (bandwidth-optimal, 2(n-1)
	// steps); smaller ones use recursive doubling (log2 n steps). On more
	// than two ranks the ring's extra steps cost more, and the crossover
	// moves up to AllreduceRingThresholdMany. Measured in
	// docs/performance.md.
	AllreduceRingThreshold     int
	AllreduceRingThresholdMany int

	// ReduceRingThreshold: reduce payloads of at least this many bytes use
	// ring reduce-scatter followed by a gather to the root; smaller ones a
	// binomial tree.
	ReduceRingThreshold int

	// BroadcastPipelineThreshold: broadcasts of at least this many bytes on
	// more than two ranks use a segmented chain; smaller ones a binomial tree.
	BroadcastPipelineThreshold int

	// AllgatherBruckThreshold: allgathers whose total result is smaller than
	// this use Bruck's algorithm (ceil(log2 n) steps); larger ones the ring.
	AllgatherBruckThreshold int

	// GatherBinomialThreshold: gathers and scatters whose total size is
	// smaller than this use a binomial tree; larger ones talk to the root
	// directly, which moves every byte only once.
	GatherBinomialThreshold int

	// AlltoallBruckThreshold: all-to-alls on more than two ranks whose
	// buffer (all blocks of one rank) is smaller than this use Bruck's
	// algorithm (ceil(log2 n) steps); larger ones the pairwise exchange
	// (n-1 steps, each byte sent once).
	AlltoallBruckThreshold int

	// ScanChainThreshold: scans of at least this many bytes use a pipelined
	// chain (each byte crosses each link once); smaller ones use recursive
	// doubling (log2 n steps, log2 n full-size messages per rank).
	ScanChainThreshold int

	// Force overrides the size-based choice per collective where a field
	// is not AlgoAuto (tests, benchmarks, tuning experiments).
	Force Forced

	// Layout, when set, fits the schedules to a sparse graph of who talks
	// directly (layout.go); nil: rank order. Part of Digest.
	Layout Layout

	// Hosts, when set, says which host each rank runs on (hosts.go):
	// allreduces take the two-level schedules (AlgoHier): in the ring's
	// size range where every host runs the same number of ranks, at least
	// two; below it where some host runs two or more (one leader per host
	// crosses the link). core fills it from where the ranks run. Part of
	// Digest.
	Hosts *HostMap
}

// Forced names an algorithm per collective; AlgoAuto lets the size decide.
// A value that a collective does not implement makes its calls fail with an
// error naming both.
type Forced struct {
	Allreduce Algorithm // AlgoRecursiveDoubling, AlgoRing, AlgoTree, AlgoHier
	Reduce    Algorithm // AlgoBinomial, AlgoRing
	Broadcast Algorithm // AlgoBinomial, AlgoPipeline
	Allgather Algorithm // AlgoBruck, AlgoRing
	Gather    Algorithm // AlgoBinomial, AlgoLinear
	Scatter   Algorithm // AlgoBinomial, AlgoLinear
	Scan      Algorithm // AlgoRecursiveDoubling, AlgoPipeline (also Exscan)
	Alltoall  Algorithm // AlgoBruck, AlgoPairwise, AlgoHier
}

// DefaultTuning returns the measured defaults (docs/performance.md).
func DefaultTuning() Tuning {
	return Tuning{
		ChunkSize:                  4 << 20,
		PipelineSegment:            512 << 10,
		AllreduceRingThreshold:     256 << 10,
		AllreduceRingThresholdMany: 1 << 20,
		ReduceRingThreshold:        256 << 10,
		BroadcastPipelineThreshold: 256 << 10,
		AllgatherBruckThreshold:    64 << 10,
		GatherBinomialThreshold:    64 << 10,
		AlltoallBruckThreshold:     32 << 10,
		ScanChainThreshold:         1 << 20,
	}
}

// sizes lists t's size fields, in a fixed order, for WithDefaults,
// Validate and Digest.
func (t *Tuning) sizes() []*int {
	return []*int{&t.ChunkSize, &t.PipelineSegment, &t.AllreduceRingThreshold,
		&t.AllreduceRingThresholdMany, &t.ReduceRingThreshold, &t.BroadcastPipelineThreshold,
		&t.AllgatherBruckThreshold, &t.GatherBinomialThreshold, &t.AlltoallBruckThreshold,
		&t.ScanChainThreshold}
}

func (f *Forced) all() []Algorithm {
	return []Algorithm{f.Allreduce, f.Reduce, f.Broadcast, f.Allgather, f.Gather, f.Scatter, f.Scan, f.Alltoall}
}

// WithDefaults returns t with every zero size field set to its default.
func (t Tuning) WithDefaults() Tuning {
	d := DefaultTuning()
	def := d.sizes()
	for i, p := range t.sizes() {
		if *p == 0 {
			*p = *def[i]
		}
	}
	return t
}

// Validate reports the first field that no schedule can use.
func (t Tuning) Validate() error {
	t = t.WithDefaults()
	if t.ChunkSize < 0 || t.ChunkSize > MaxChunkSize {
		return fmt.Errorf("collective: chunk size %d is out of range [1, %d]", t.ChunkSize, MaxChunkSize)
	}
	for _, p := range t.sizes() {
		if *p < 0 {
			return fmt.Errorf("collective: tuning size %d is negative", *p)
		}
	}
	for _, a := range t.Force.all() {
		if int(a) >= len(algoNames) {
			return fmt.Errorf("collective: unknown algorithm %d", uint8(a))
		}
	}
	return nil
}

// Digest is a 16-bit FNV-1a hash of every field of t (after WithDefaults):
// what ranks compare to catch different tunings. Two different tunings
// collide with probability 2^-16.
func (t Tuning) Digest() uint16 {
	t = t.WithDefaults()
	h := uint32(2166136261)
	mix := func(v uint64) {
		for i := 0; i < 8; i++ {
			h ^= uint32(byte(v >> (8 * i)))
			h *= 16777619
		}
	}
	for _, p := range t.sizes() {
		mix(uint64(*p))
	}
	for _, a := range t.Force.all() {
		mix(uint64(a))
	}
	if t.Layout != nil {
		mix(t.Layout.Digest())
	}
	if t.Hosts != nil {
		mix(t.Hosts.Digest())
	}
	return uint16(h ^ h>>16)
}

// Algorithm names a schedule. AlgoAuto lets the package choose by payload
// size and world size.
type Algorithm uint8

const (
	AlgoAuto Algorithm = iota
	AlgoRecursiveDoubling
	AlgoRing
	AlgoBinomial
	AlgoPipeline
	AlgoBruck
	AlgoLinear
	AlgoPairwise
	AlgoTree // a reduction up a spanning tree and a broadcast down it (Layout.Tree, else binomial)
	AlgoHier // two levels: within each host, then between hosts (Tuning.Hosts)
)

var algoNames = [...]string{"auto", "recursive-doubling", "ring", "binomial", "pipeline", "bruck", "linear", "pairwise", "tree", "hier"}

func (a Algorithm) String() string {
	if int(a) < len(algoNames) {
		return algoNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm reads an algorithm's name as String writes it.
func ParseAlgorithm(name string) (Algorithm, error) {
	for i, n := range algoNames {
		if n == name {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("collective: unknown algorithm %q (known: %s)", name, strings.Join(algoNames[:], ", "))
}

// choose returns the forced algorithm when set, auto otherwise, and an error
// when the forced one is not among ok.
func choose(name string, forced, auto Algorithm, ok ...Algorithm) (Algorithm, error) {
	if forced == AlgoAuto {
		return auto, nil
	}
	for _, a := range ok {
		if a == forced {
			return a, nil
		}
	}
	return 0, fmt.Errorf("collective: %s has no %s algorithm", name, forced)
}

// steps numbers the messages of one call. Each direction has its own
// counter; a message of k chunks takes k consecutive steps. Both ends issue
// the messages of a direction in the same order with the same lengths, so
// they agree on every step without talking. Reserve steps in the goroutine
// that runs the schedule, before handing work to helper goroutines.
type steps struct {
	n       int // ranks
	chunk   int
	segment int                    // pipeline segment, at most chunk
	small   [2 * smallWorld]uint32 // out and in counters for small worlds
	big     []uint32               // out and in counters above smallWorld
}

const smallWorld = 16

// init prepares st for one call over l. A steps lives in its schedule's
// frame (var st steps; st.init(l)) and nothing keeps it past the call, so
// in a small world it costs no allocation (the counters are indexed, not
// sliced out of small: a pointer into itself would move it to the heap).
func (st *steps) init(l Link) {
	t := l.Tuning()
	c := t.ChunkSize
	if c <= 0 {
		c = DefaultTuning().ChunkSize
	}
	seg := min(t.PipelineSegment, c)
	if seg <= 0 {
		seg = c
	}
	n := l.Size()
	st.n, st.chunk, st.segment = n, c, seg
	if n > smallWorld {
		st.big = make([]uint32, 2*n)
	}
}

// out is the next step to send to peer, in is the next from peer.
func (s *steps) out(peer int) *uint32 {
	if s.big != nil {
		return &s.big[peer]
	}
	return &s.small[peer]
}

func (s *steps) in(peer int) *uint32 {
	if s.big != nil {
		return &s.big[s.n+peer]
	}
	return &s.small[s.n+peer]
}

// nchunks is the number of messages for n bytes: at least one, so that
// empty messages still synchronize.
func nchunks(n, chunk int) int {
	if n <= chunk {
		return 1
	}
	return (n + chunk - 1) / chunk
}

func (s *steps) sendTo(peer, n int) uint32 {
	p := s.out(peer)
	b := *p
	*p += uint32(nchunks(n, s.chunk))
	return b
}

func (s *steps) recvFrom(peer, n int) uint32 {
	p := s.in(peer)
	b := *p
	*p += uint32(nchunks(n, s.chunk))
	return b
}

// sendMsg sends data as consecutive chunks starting at step base.
func (s *steps) sendMsg(ctx context.Context, l Link, peer int, base uint32, data []byte) error {
	return sendChunks(ctx, l, peer, base, data, s.chunk)
}

// sendChunks is sendMsg with the chunk size given (for goroutines, which
// must not keep the schedule's steps alive: see steps.init).
func sendChunks(ctx context.Context, l Link, peer int, base uint32, data []byte, chunk int) error {
	if len(data) <= chunk {
		return l.Send(ctx, peer, base, data)
	}
	for off, i := 0, uint32(0); off < len(data); off, i = off+chunk, i+1 {
		end := min(off+chunk, len(data))
		if err := l.Send(ctx, peer, base+i, data[off:end]); err != nil {
			return err
		}
	}
	return nil
}

func (s *steps) recvMsg(ctx context.Context, l Link, peer int, base uint32, buf []byte) error {
	return recvChunks(ctx, l, peer, base, buf, s.chunk)
}

// recvChunks receives buf as consecutive chunks starting at step base.
func recvChunks(ctx context.Context, l Link, peer int, base uint32, buf []byte, chunk int) error {
	if len(buf) <= chunk {
		return l.Recv(ctx, peer, base, buf)
	}
	for off, i := 0, uint32(0); off < len(buf); off, i = off+chunk, i+1 {
		end := min(off+chunk, len(buf))
		if err := l.Recv(ctx, peer, base+i, buf[off:end]); err != nil {
			return err
		}
	}
	return nil
}

// send sends one whole message to peer.
func (s *steps) send(ctx context.Context, l Link, peer int, data []byte) error {
	return s.sendMsg(ctx, l, peer, s.sendTo(peer, len(data)), data)
}

// recv receives one whole message from peer.
func (s *steps) recv(ctx context.Context, l Link, peer int, buf []byte) error {
	return s.recvMsg(ctx, l, peer, s.recvFrom(peer, len(buf)), buf)
}

// exchange sends data to `to` while receiving buf from `from`. A send of
// more than InlineSendMax bytes runs in its own goroutine because it may
// block under back-pressure until the peer posts its receive; it has
// returned when exchange returns. Smaller ones go first, in the caller:
// transports buffer them, and a goroutine would cost more than the send.
func (s *steps) exchange(ctx context.Context, l Link, to int, data []byte, from int, buf []byte) error {
	sb, rb := s.sendTo(to, len(data)), s.recvFrom(from, len(buf))
	if x, ok := l.(Exchanger); ok {
		return x.Exchange(ctx, to, sb, data, from, rb, buf, s.chunk)
	}
	return exchangeChunks(ctx, l, to, sb, data, from, rb, buf, s.chunk)
}

// exchangeChunks is exchange over a Link that is not an Exchanger, with
// the steps reserved (sb, rb) and the chunk size given.
func exchangeChunks(ctx context.Context, l Link, to int, sb uint32, data []byte, from int, rb uint32, buf []byte, chunk int) error {
	if len(data) <= InlineSendMax {
		if err := sendChunks(ctx, l, to, sb, data, chunk); err != nil {
			return err
		}
		return recvChunks(ctx, l, from, rb, buf, chunk)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- sendChunks(ctx, l, to, sb, data, chunk) }()
	rerr := recvChunks(ctx, l, from, rb, buf, chunk)
	if rerr != nil {
		cancel()
	}
	serr := <-errc
	if rerr != nil {
		return rerr
	}
	return serr
}

// group runs functions concurrently and cancels the rest on the first
// error, like errgroup.WithContext.
type group struct {
	wg     sync.WaitGroup
	cancel context.CancelFunc
	once   sync.Once
	err    error
}

func newGroup(ctx context.Context) (*group, context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	return &group{cancel: cancel}, ctx
}

func (g *group) Go(f func() error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if err := f(); err != nil {
			g.once.Do(func() { g.err = err; g.cancel() })
		}
	}()
}

func (g *group) Wait() error {
	g.wg.Wait()
	g.cancel()
	return g.err
}

// pipeline receives in segment by segment from prev (when prev >= 0), calls
// got(lo, hi) after each segment, and forwards out[lo:hi] to next (when next
// >= 0), overlapping the forward of one segment with the receipt of the
// following ones. in and out have equal lengths (they may be the same slice).
func (s *steps) pipeline(ctx context.Context, l Link, prev int, in []byte, next int, out []byte, got func(lo, hi int)) error {
	seg := s.segment
	n := len(out)
	nseg := nchunks(n, seg)
	bound := func(i int) (int, int) { return i * seg, min((i+1)*seg, n) }
	// Each segment is one message of at most one chunk: one step each.
	var rb, sb uint32
	if prev >= 0 {
		rb = *s.in(prev)
		*s.in(prev) += uint32(nseg)
	}
	if next >= 0 {
		sb = *s.out(next)
		*s.out(next) += uint32(nseg)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan int, nseg) // never blocks the receiving side
	errc := make(chan error, 1)
	if next >= 0 {
		go func() {
			for i := range ready {
				lo, hi := bound(i)
				if err := l.Send(ctx, next, sb+uint32(i), out[lo:hi]); err != nil {
					cancel()
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	var rerr error
	for i := 0; i < nseg; i++ {
		lo, hi := bound(i)
		if prev >= 0 {
			if rerr = l.Recv(ctx, prev, rb+uint32(i), in[lo:hi]); rerr != nil {
				cancel()
				break
			}
		}
		if got != nil {
			got(lo, hi)
		}
		if next >= 0 {
			ready <- i
		}
	}
	close(ready)
	var serr error
	if next >= 0 {
		serr = <-errc
	}
	if rerr != nil {
		return rerr
	}
	return serr
}

// Argument checks shared by the algorithms.

var errNilLink = errors.New("collective: nil link")

func checkLink(l Link) (rank, size int, err error) {
	if l == nil {
		return 0, 0, errNilLink
	}
	rank, size = l.Rank(), l.Size()
	if size < 1 || rank < 0 || rank >= size {
		return 0, 0, fmt.Errorf("collective: rank %d out of range for size %d", rank, size)
	}
	return rank, size, nil
}

func checkRoot(root, size int) error {
	if root < 0 || root >= size {
		return fmt.Errorf("collective: root %d out of range for size %d", root, size)
	}
	return nil
}

func checkElems(name string, n int, dt DType) error {
	if n%dt.Size() != 0 {
		return fmt.Errorf("collective: %s buffer of %d bytes is not a whole number of %s elements", name, n, dt)
	}
	return nil
}

// checkV validates per-rank byte counts and displacements against a buffer
// of length n.
func checkV(name string, counts, displs []int, size, n int) error {
	if len(counts) != size || len(displs) != size {
		return fmt.Errorf("collective: %s needs %d counts and displacements, got %d and %d", name, size, len(counts), len(displs))
	}
	for i := range counts {
		c, d := counts[i], displs[i]
		if c < 0 || d < 0 || d > n || c > n-d {
			return fmt.Errorf("collective: %s block %d (displ %d, count %d) outside buffer of %d bytes", name, i, d, c, n)
		}
	}
	return nil
}

// vblocks slices buf into the per-rank blocks described by counts/displs.
func vblocks(buf []byte, counts, displs []int) [][]byte {
	b := make([][]byte, len(counts))
	for i := range counts {
		b[i] = buf[displs[i] : displs[i]+counts[i] : displs[i]+counts[i]]
	}
	return b
}

// eqblocks slices buf into size blocks of blk bytes.
func eqblocks(buf []byte, size, blk int) [][]byte {
	return appendEqblocks(make([][]byte, 0, size), buf, size, blk)
}

// appendEqblocks appends eqblocks(buf, size, blk) to dst.
func appendEqblocks(dst [][]byte, buf []byte, size, blk int) [][]byte {
	for i := range size {
		dst = append(dst, buf[i*blk:(i+1)*blk:(i+1)*blk])
	}
	return dst
}

// balanced slices buf (count elements of es bytes) into size blocks whose
// element counts differ by at most one, the larger ones first.
func balanced(buf []byte, size, es int) [][]byte {
	count := len(buf) / es
	base, rem := count/size, count%size
	b := make([][]byte, size)
	off := 0
	for i := range b {
		n := base * es
		if i < rem {
			n += es
		}
		b[i] = buf[off : off+n : off+n]
		off += n
	}
	return b
}

// redOp is the operator actually applied: Avg reduces with Sum and divides
// once at the end.
func redOp(op Op) Op {
	if op == Avg {
		return Sum
	}
	return op
}

func mod(a, n int) int { return ((a % n) + n) % n }
