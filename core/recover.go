package core

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fxamacker/cbor/v2"

	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/transport"
)

// This file is recovery without restart, in ULFM's vocabulary (docs/fault-tolerance.md):
// Revoke (every member's pending and later calls fail fast), Agree
// (fault-tolerant agreement on a flag and on the failed members, by the
// membership.Agreement engine) and Shrink (a communicator of the
// survivors, on the connections that exist), and the failure policies
// that decide what a failure does by itself (FailurePolicy).
//
// Agreement messages are control messages of the communicator (ctlAgree:
// seqOrTag numbers the agreement, the payload is a CBOR
// membership.AgreeMsg) and work on a failed or revoked communicator,
// whose collectives and point-to-point calls fail.

// FailurePolicy says what a member's failure does to a communicator.
type FailurePolicy uint8

const (
	// PolicyAbort (the default): the communicator fails for good; every
	// pending and later call fails naming the lost rank, and Agree and
	// Shrink are refused (CodeUnavailable).
	PolicyAbort FailurePolicy = iota
	// PolicyManual: calls fail the same way, and the application
	// recovers: Revoke, Agree, Shrink.
	PolicyManual
	// PolicyShrink: the runtime revokes, agrees and shrinks by itself.
	// The failed call returns its error (naming the lost rank); Successor
	// then returns the survivors' communicator, which the C, C++ and
	// Python handles follow by themselves.
	PolicyShrink
)

var policyNames = [...]string{"abort", "manual", "shrink"}

func (p FailurePolicy) String() string {
	if int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("policy(%d)", int(p))
}

// ParseFailurePolicy reads "abort", "manual" or "shrink" (NEXAR_ON_FAILURE).
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	for i, n := range policyNames {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return FailurePolicy(i), nil
		}
	}
	return 0, fmt.Errorf("core: failure policy %q: want abort, manual or shrink", s)
}

// maxAgreeAhead bounds how far ahead of this rank's own agreements a
// peer's may be before its messages are dropped (they are kept until this
// rank starts that agreement; a bound keeps garbage from growing the table).
const maxAgreeAhead = 64

// agreeInst is one agreement of a communicator, under Comm.mu.
type agreeInst struct {
	a    *membership.Agreement
	wake chan struct{} // one slot: something changed
}

// recovery is a communicator's recovery state, under Comm.mu.
type recovery struct {
	policy    FailurePolicy
	revoked   bool
	nextAgree uint64
	agrees    map[uint64]*agreeInst
	stop      chan struct{} // closed by Close: agreements in progress end
	// shrink policy: the survivors' communicator, made once. started is
	// set (with succDone) when the automatic shrink begins; it is atomic
	// so that Successor's common case takes no lock.
	started  atomic.Bool
	succDone chan struct{} // closed when succ or succErr is set
	succ     *Comm
	succErr  error
	// grow: the seed address of each grow's leader, by agreement number
	// (ctlGrow), and a wake-up.
	growSeeds map[uint64]growSeed
	growWake  chan struct{}
	// grows abandoned, or in formation, by agreement number: why a grow
	// was abandoned (ctlGrowAbort, or this rank) and the cancel of its
	// formation, whichever comes first (core/grow.go abandonGrow).
	growEnds map[uint64]*growEnd
	// afterGrowAgreement, when set (tests only), runs once a grow's
	// agreement is decided, before this rank admits its joiners.
	afterGrowAgreement func()
}

// SetFailurePolicy sets what a member's failure does to c from now on.
// Safe for concurrent use.
func (c *Comm) SetFailurePolicy(p FailurePolicy) error {
	if p > PolicyShrink {
		return invalidArg("set_failure_policy", "policy %d: want abort (0), manual (1) or shrink (2)", int(p))
	}
	c.mu.Lock()
	c.rec.policy = p
	if p == PolicyShrink && c.err != nil && autoShrinks(c.err) {
		c.startAutoShrinkLocked()
	}
	c.mu.Unlock()
	return nil
}

// FailurePolicy returns c's failure policy. Safe for concurrent use.
func (c *Comm) FailurePolicy() FailurePolicy {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rec.policy
}

// Revoke fails every pending and later collective and point-to-point call
// on c, here and, as fast as the message travels, on every other member
// (ULFM's MPIX_Comm_revoke): such calls return CodeRevoked, unless c had
// failed already (they then keep that failure). Agree and Shrink still
// work on a revoked communicator. Revoke is local and idempotent; every
// member that learns of it passes it on, so it reaches every live member
// even if the revoking rank dies meanwhile. Safe for concurrent use.
func (c *Comm) Revoke() { c.revoke(c.rank) }

// revokeMessage takes a revoke from comm rank src: payload names the rank
// that revoked (src, or the rank it learned it from).
func (c *Comm) revokeMessage(src int, payload []byte) {
	by := src
	if len(payload) == 4 {
		if r := int(int32(binary.LittleEndian.Uint32(payload))); r >= 0 && r < c.size {
			by = r
		}
	}
	c.revoke(by)
}

func (c *Comm) revoke(by int) {
	msg := "the communicator was revoked by this rank"
	if by != c.rank {
		msg = fmt.Sprintf("the communicator was revoked by rank %d", by)
	}
	c.mu.Lock()
	first := !c.rec.revoked
	c.rec.revoked = true
	c.failLocked(&Error{Code: CodeRevoked, Op: "comm", Rank: by, Msg: msg})
	if first && c.size > 1 && !c.closing {
		var p [4]byte
		binary.LittleEndian.PutUint32(p[:], uint32(by))
		c.bg.Add(1)
		go func() {
			defer c.bg.Done()
			c.sendControl(ctlRevoke, 0, p[:], -1)
		}()
	}
	c.mu.Unlock()
}

// Revoked reports whether c was revoked (here or by a member). Safe for
// concurrent use.
func (c *Comm) Revoked() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rec.revoked
}

// sendControl sends a control message of c to every live member but this
// rank (only to rank `to` when to >= 0), best effort, each send bounded by
// the heartbeat timeout.
func (c *Comm) sendControl(sub uint8, seq uint64, payload []byte, to int) {
	var th transport.Header
	(&header{kind: kindControl, sub: sub, comm: c.id, seqOrTag: seq, total: uint64(len(payload))}).encode(&th, c.gen)
	for p := 0; p < c.size; p++ {
		if p == c.rank || (to >= 0 && p != to) || c.peerIsDown(p) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.HeartbeatTimeout)
		_ = c.n.ep.Send(ctx, c.world[p], transport.LaneControl, &th, payload)
		cancel()
	}
}

// Agree is fault-tolerant agreement among the live members of c (ULFM's
// MPIX_Comm_agree): every member calls it, and each that returns without
// error returns the same flag, the bitwise AND of the flags of the members
// that took part, and the same list of members left out (failed, or found
// failed by a participant), even when members fail during the call. It
// works on a failed or revoked communicator. A member left out by the
// others gets CodePeerDown naming itself; a side of a partition without a
// quorum of c (a strict majority, or exactly half with rank 0) gets
// CodeNoQuorum. The deadline is ctx's, else Config.Timeout. Refused under
// PolicyAbort. Members must call Agree (and Shrink, which agrees) in the
// same order; it is safe for concurrent use with c's other methods.
func (c *Comm) Agree(ctx context.Context, flag uint64) (uint64, []int, error) {
	d, _, err := c.agree(ctx, "agree", flag, nil, false)
	if err != nil {
		return 0, nil, err
	}
	return d.Flag, d.Failed, nil
}

// agree runs c's next agreement, with this rank's contribution extra
// (membership.Agreement.StartWith), and returns its decision and its
// number. healthyAbort lets it run under PolicyAbort while c has not
// failed (grow, which is not recovery).
func (c *Comm) agree(ctx context.Context, op string, flag uint64, extra [][]byte, healthyAbort bool) (*membership.Decision, uint64, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	c.mu.Lock()
	if e := c.recoveryRefusedLocked(op); e != nil && !(healthyAbort && c.err == nil && c.rec.policy == PolicyAbort) {
		c.mu.Unlock()
		return nil, 0, e
	}
	k := c.rec.nextAgree
	c.rec.nextAgree++
	inst := c.agreeInstLocked(k)
	for old := range c.rec.agrees {
		if old+8 < k {
			delete(c.rec.agrees, old) // done long ago: no member still asks
		}
	}
	suspects := slices.Clone(c.lost.ranks)
	for r := range c.gone {
		suspects = append(suspects, r)
	}
	c.mu.Unlock()
	for r, w := range c.world {
		if r != c.rank && c.n.isDown(w) {
			suspects = append(suspects, r)
		}
	}
	c.mu.Lock()
	inst.a.StartWith(flag, suspects, extra)
	c.flushAgreeLocked(k, inst)
	c.mu.Unlock()

	timeout := time.NewTimer(c.cfg.Timeout)
	defer timeout.Stop()
	for {
		c.mu.Lock()
		d, err := inst.a.Result()
		c.mu.Unlock()
		if d != nil {
			return d, k, nil
		}
		if err != nil {
			return nil, k, c.agreeError(op, err)
		}
		select {
		case <-inst.wake:
		case <-ctx.Done():
			return nil, k, &Error{Code: CodeTimeout, Op: op, Rank: -1, Cause: ctx.Err(),
				Msg: fmt.Sprintf("agreement %d not reached: %v (suspected: %v)", k, ctx.Err(), c.suspected(inst))}
		case <-timeout.C:
			return nil, k, &Error{Code: CodeTimeout, Op: op, Rank: -1,
				Msg: fmt.Sprintf("agreement %d not reached in %v (suspected: %v); a member may not have called it", k, c.cfg.Timeout, c.suspected(inst))}
		case <-c.rec.stop:
			return nil, k, newError(CodeClosed, op, c.rank, "communicator is closed")
		}
	}
}

func (c *Comm) suspected(inst *agreeInst) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return inst.a.Suspected()
}

func (c *Comm) recoveryRefusedLocked(op string) *Error {
	if c.rec.policy == PolicyAbort {
		return newError(CodeUnavailable, op, -1,
			"recovery is off: the communicator's failure policy is abort; set NEXAR_ON_FAILURE (or the communicator's policy) to manual or shrink")
	}
	if e, ok := c.err.(*Error); ok && e.Code == CodeClosed && e.Rank == c.rank {
		return withOp(e, op).(*Error)
	}
	return nil
}

func (c *Comm) agreeError(op string, err error) error {
	ae, ok := err.(*membership.AgreeError)
	if !ok {
		return &Error{Code: CodeInternal, Op: op, Rank: -1, Msg: err.Error(), Cause: err}
	}
	if ae.NoQuorum {
		return &Error{Code: CodeNoQuorum, Op: op, Rank: c.rank, Msg: fmt.Sprintf("rank %d: %v", c.rank, ae), Cause: err}
	}
	return &Error{Code: CodePeerDown, Op: op, Rank: c.rank, Msg: fmt.Sprintf("rank %d: %v", c.rank, ae), Cause: err}
}

// agreeInstLocked returns agreement k, made on first use. Called with c.mu held.
func (c *Comm) agreeInstLocked(k uint64) *agreeInst {
	if c.rec.agrees == nil {
		c.rec.agrees = make(map[uint64]*agreeInst)
	}
	inst := c.rec.agrees[k]
	if inst == nil {
		inst = &agreeInst{a: membership.NewAgreement(c.size, c.rank), wake: make(chan struct{}, 1)}
		c.rec.agrees[k] = inst
	}
	return inst
}

// flushAgreeLocked sends what agreement k has to send (in the
// background: c.mu is held) and wakes its caller.
func (c *Comm) flushAgreeLocked(k uint64, inst *agreeInst) {
	select {
	case inst.wake <- struct{}{}:
	default:
	}
	out := inst.a.Ready()
	if len(out) == 0 || c.closing {
		return // (a closing communicator's goroutines are being waited for)
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		for _, o := range out {
			p, err := cbor.Marshal(o.Msg)
			if err != nil {
				continue
			}
			c.sendControl(ctlAgree, k, p, o.To)
		}
	}()
}

// agreeMessage takes an agreement message from comm rank src.
func (c *Comm) agreeMessage(src int, k uint64, payload []byte) {
	var m membership.AgreeMsg
	if len(payload) > maxAgreeMsg(c.size) || cbor.Unmarshal(payload, &m) != nil || m.Validate(c.size) != nil {
		c.n.log.Warn("nexar: dropping a bad agreement message", "comm", c.id, "from", src)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if k >= c.rec.nextAgree+maxAgreeAhead || (c.rec.agrees[k] == nil && k+8 < c.rec.nextAgree) {
		return
	}
	inst := c.agreeInstLocked(k)
	inst.a.Step(src, m)
	c.flushAgreeLocked(k, inst)
}

// suspectWorldLocked tells c's agreements that world rank w is down here,
// whatever error c reported for it (a rank that was stalled reports its
// own stall, yet cannot reach the peers it lost). Called with node.mu held.
func (c *Comm) suspectWorldLocked(w int) {
	r, ok := c.rankOfWorld(w)
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.suspectLocked(r)
}

// suspectDepartedLocked tells c's agreements, after a grace, that comm
// rank r left. A member that returned from an agreement and closed at once
// has sent its last agreement messages (a Commit) on the control lane, and
// its goodbye may overtake them on another lane: suspecting it at once
// would make a 2-rank agreement lose its quorum with the decision in
// flight. Agreements started later count it as gone at once (agree reads
// c.gone). Called with c.mu held.
func (c *Comm) suspectDepartedLocked(r int) {
	if len(c.rec.agrees) == 0 {
		return
	}
	grace := min(time.Second, c.cfg.HeartbeatTimeout)
	time.AfterFunc(grace, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !c.closing {
			c.suspectLocked(r)
		}
	})
}

// suspectLocked tells c's agreements that comm rank r failed. Called with
// c.mu held.
func (c *Comm) suspectLocked(r int) {
	for k, inst := range c.rec.agrees {
		inst.a.Suspect(r)
		c.flushAgreeLocked(k, inst)
	}
}

// Shrink makes the survivors' communicator (ULFM's MPIX_Comm_shrink): it
// revokes c, agrees with the live members on who failed, and returns a
// communicator of the others, ranked in c's order, on the connections that
// exist. Every live member must call it (members whose calls failed with
// CodeRevoked know to). The new communicator is of the next membership
// generation: nothing sent on c reaches it. A member the others left out
// gets CodePeerDown naming itself; the side of a partition without a quorum
// of c gets CodeNoQuorum. Refused under PolicyAbort. c stays to be closed.
func (c *Comm) Shrink(ctx context.Context) (*Comm, error) {
	c.mu.Lock()
	refused := c.recoveryRefusedLocked("shrink")
	c.mu.Unlock()
	if refused != nil {
		return nil, refused
	}
	c.Revoke()
	d, k, err := c.agree(ctx, "shrink", ^uint64(0), nil, false)
	if err != nil {
		return nil, err
	}
	world, me := c.survivors(d.Failed)
	if least := c.n.minWorld; len(world) < least {
		return nil, newError(CodeUnavailable, "shrink", -1,
			"%d members survive (failed: %v), fewer than the minimum world size %d (NEXAR_MIN_WORLD_SIZE)", len(world), d.Failed, least)
	}
	return c.successorComm("shrink", k, me, world)
}

// survivors returns the world ranks of c's members not in failed (comm
// ranks), in c's order, and this rank's index among them.
func (c *Comm) survivors(failed []int) (world []int, me int) {
	world = make([]int, 0, c.size-len(failed))
	me = -1
	for r, w := range c.world {
		if slices.Contains(failed, r) {
			continue
		}
		if r == c.rank {
			me = len(world)
		}
		world = append(world, w)
	}
	return world, me
}

// successorComm makes the communicator of world (world ranks of c's node)
// that agreement k of c decided: the next membership generation, c's
// failure policy, on the connections that exist.
func (c *Comm) successorComm(op string, k uint64, me int, world []int) (*Comm, error) {
	child := newComm(c.n, childID(c.id, k|1<<63, -1), me, world)
	child.gen = c.gen + 1
	c.mu.Lock()
	child.rec.policy = c.rec.policy
	c.mu.Unlock()
	if err := c.n.register(child); err != nil {
		return nil, withOp(err, op)
	}
	child.startFlight()
	return child, nil
}

// autoShrinks reports whether failure err starts the shrink policy's
// recovery: a member lost, or a revoke (a member recovering).
func autoShrinks(err error) bool {
	code := CodeOf(err)
	return code == CodePeerDown || code == CodeRevoked
}

// startAutoShrinkLocked runs Shrink once, in the background, for the
// shrink policy; Successor waits for it. Called with c.mu held.
func (c *Comm) startAutoShrinkLocked() {
	if c.rec.started.Load() || c.closing {
		return
	}
	c.rec.succDone = make(chan struct{}) // before started: Successor reads it after seeing started
	c.rec.started.Store(true)
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
		defer cancel()
		succ, err := c.Shrink(ctx)
		c.mu.Lock()
		c.rec.succ, c.rec.succErr = succ, err
		close(c.rec.succDone)
		c.mu.Unlock()
		if err != nil {
			c.n.log.Warn("nexar: automatic shrink failed", "comm", c.id, "rank", c.rank, "err", err)
		}
	}()
}

// Successor returns the communicator that carries on for c under the
// shrink policy: c itself while c is healthy (or under another policy),
// else the survivors' communicator, waiting (up to ctx's deadline) for
// the automatic shrink to finish, and following later shrinks too. If the
// shrink failed (no quorum, this rank left out), it returns c and that
// error. Safe for concurrent use.
func (c *Comm) Successor(ctx context.Context) (*Comm, error) {
	cur := c
	for {
		if !cur.rec.started.Load() {
			return cur, nil // the common case: no lock taken
		}
		cur.mu.Lock()
		done := cur.rec.succDone
		cur.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return cur, &Error{Code: CodeTimeout, Op: "successor", Rank: -1, Msg: "the automatic shrink has not finished", Cause: ctx.Err()}
		}
		cur.mu.Lock()
		next, err := cur.rec.succ, cur.rec.succErr
		cur.mu.Unlock()
		if err != nil {
			return cur, err
		}
		cur = next
	}
}

// CloseChain closes c and every successor the shrink policy made for it
// (the C, C++ and Python handles own the whole chain). Closing c ends an
// automatic shrink in progress.
func (c *Comm) CloseChain() error {
	for cur := c; cur != nil; {
		_ = cur.Close() // waits for the automatic shrink's goroutine
		cur.mu.Lock()
		next := cur.rec.succ
		cur.mu.Unlock()
		cur = next
	}
	return nil
}

// maxAgreeMsg bounds an encoded agreement message among n members: the
// suspects, and grow's contributions (a joiner record per waiting joiner).
func maxAgreeMsg(n int) int {
	return 64 + 16*n + min((membership.MaxExtraSize+4)*membership.MaxExtra*n, 1<<20)
}
