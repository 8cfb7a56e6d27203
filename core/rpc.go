package core

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nexar-go/nexar/internal/chanctx"
	"github.com/nexar-go/nexar/transport"
)

// This file is RPC: a member registers handlers under function ids and the
// others call them by rank. Requests and replies travel on LaneRPC, which
// the transport keeps apart from the data lane (a ring or TCP connection of
// its own per peer and direction, else QUIC streams of its own), so RPC
// traffic and collectives never wait for each other; replies are matched
// by call id, any number in flight.

// RPCHandler serves one call: from is the caller's rank in the
// communicator, req the request (the handler's to keep). Its result is the
// reply; an error goes back to the caller as one (an *Error keeps its code,
// any other error arrives as CodeInternal with its message). ctx ends when
// the communicator fails or is closed.
type RPCHandler func(ctx context.Context, from int, req []byte) ([]byte, error)

// RPCLentHandler serves one call like RPCHandler, but borrows instead of
// owning: req stays valid only until the reply has been sent (its buffer
// is then reused; the reply may be req itself or part of it), and the
// reply is lent back: it is sent as it is, without a copy, and then
// release (when not nil) is called exactly once, also when the reply is
// not sent (an error, the communicator closing). The reply must not change
// until release. This is how the C and Python handlers serve large
// payloads without copying them into and out of Go memory.
type RPCLentHandler func(ctx context.Context, from int, req []byte) (reply []byte, release func(), err error)

// Wire: kind rpc; sub is the message; seqOrTag the call id (the caller's);
// step the function id; total the payload length.
const (
	rpcRequest  uint8 = 1
	rpcReply    uint8 = 2
	rpcErrReply uint8 = 3 // payload: encodeCause of the error
)

// DefaultRPCHandlers is the default bound on handlers running at once per
// communicator (Config.RPCHandlers).
const DefaultRPCHandlers = 64

// rpcState is a communicator's RPC state; guarded by its mu.
type rpcState struct {
	mu       sync.Mutex
	handlers map[uint32]rpcHandler
	nextID   uint64
	calls    map[uint64]*Call
	err      error         // the communicator's failure: no call starts, every call in flight ended
	sem      chan struct{} // one slot per running handler
	running  sync.WaitGroup
	pool     bufPool // payload buffers of 64 KiB and more (its own lock)
}

// rpcHandler is a registered handler: exactly one of the two is set.
type rpcHandler struct {
	own  RPCHandler
	lent RPCLentHandler
}

func newRPCState(limit, poolBytes int) *rpcState {
	if limit <= 0 {
		limit = DefaultRPCHandlers
	}
	return &rpcState{handlers: make(map[uint32]rpcHandler), calls: make(map[uint64]*Call), sem: make(chan struct{}, limit),
		pool: bufPool{max: poolBytes}}
}

// rpcPoolBytes bounds a communicator's idle RPC buffers: the RPC share of
// the ring budget (a quarter, as for the RPC rings), or 16 MiB without one.
func rpcPoolBytes(cfg Config) int {
	if cfg.RingBudget > 0 {
		return cfg.RingBudget / 4
	}
	return 16 << 20
}

// Call is an RPC in flight (ICall). Its methods are safe for concurrent
// use.
type Call struct {
	c        *Comm
	id       uint64
	peer     int
	fn       uint32
	done     chan struct{}
	once     sync.Once
	mu       sync.Mutex // guards stop and finished
	finished bool
	reply    []byte
	pooled   bool // reply is from the pool: Recycle may give it back
	recycled bool // guarded by mu
	err      error
	stop     func() // ends the deadline's watch (ICallContext)
}

// Register makes h the handler of function id on c, replacing any earlier
// one; h nil removes it. Calls that arrive for an id with no handler fail
// at the caller with CodeInvalidArgument. Safe for concurrent use.
func (c *Comm) Register(id uint32, h RPCHandler) {
	c.rpc.setHandler(id, rpcHandler{own: h}, h == nil)
}

// RegisterLent is Register for a handler that borrows its request and
// lends its reply (RPCLentHandler); h nil removes the handler of id.
// Safe for concurrent use.
func (c *Comm) RegisterLent(id uint32, h RPCLentHandler) {
	c.rpc.setHandler(id, rpcHandler{lent: h}, h == nil)
}

// setHandler installs h for id, or removes id's handler.
func (s *rpcState) setHandler(id uint32, h rpcHandler, remove bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if remove {
		delete(s.handlers, id)
		return
	}
	s.handlers[id] = h
}

// CallRPC calls function id on rank peer with req and returns its reply.
// ctx's deadline is the call's deadline.
// It fails with the handler's error, with CodeInvalidArgument when peer has
// no handler for id, CodePeerDown when peer is lost (the communicator fails),
// CodeTimeout at ctx's deadline or the communicator's Timeout, and the
// communicator's failure once it has failed. req must not change until it
// returns.
func (c *Comm) CallRPC(ctx context.Context, peer int, id uint32, req []byte) ([]byte, error) {
	return c.startCall(peer, id, req, true).Wait(ctx)
}

// CallRPCInto is CallRPC that lends the reply to use instead of returning
// it: the reply is valid only while use runs (its buffer is then reused),
// so a caller that copies it elsewhere (the C and Python layers) saves an
// allocation per call. use runs only on success; its error is returned.
func (c *Comm) CallRPCInto(ctx context.Context, peer int, id uint32, req []byte, use func(reply []byte) error) error {
	call := c.startCall(peer, id, req, true)
	reply, err := call.Wait(ctx)
	if err != nil {
		return err
	}
	err = use(reply)
	call.Recycle()
	return err
}

// ICall starts calling function id on rank peer with req; Wait returns the
// reply. req must not change until the call is done.
func (c *Comm) ICall(peer int, id uint32, req []byte) *Call {
	return c.startCall(peer, id, req, false)
}

// ICallContext is ICall with a deadline: when ctx ends before the reply
// comes, the call fails with CodeTimeout (a later reply is dropped),
// whether or not anyone waits. Wait's own context and the communicator's
// Timeout still bound a wait.
func (c *Comm) ICallContext(ctx context.Context, peer int, id uint32, req []byte) *Call {
	call := c.startCall(peer, id, req, false)
	if ctx.Done() == nil {
		return call
	}
	stop := context.AfterFunc(ctx, func() { call.expire(ctx.Err()) })
	call.mu.Lock()
	done := call.finished
	if !done {
		call.stop = func() { stop() }
	}
	call.mu.Unlock()
	if done {
		stop()
	}
	return call
}

// expire fails the call, if still pending, with CodeTimeout for cause.
func (call *Call) expire(cause error) {
	call.c.rpcDone(call.id, -1, nil, &Error{Code: CodeTimeout, Op: "rpc", Rank: call.peer,
		Msg: fmt.Sprintf("no reply from rank %d to function %d: %v", call.peer, call.fn, cause), Cause: cause})
}

// startCall registers a call and sends its request: in the caller's
// goroutine when inline (CallRPC, which waits anyway), else in one of its
// own.
func (c *Comm) startCall(peer int, id uint32, req []byte, inline bool) *Call {
	call := &Call{c: c, peer: peer, fn: id, done: make(chan struct{})}
	if peer < 0 || peer >= c.size {
		call.finish(nil, invalidArg("rpc", "peer %d is out of range [0, %d)", peer, c.size))
		return call
	}
	if len(req) > transport.MaxPayload {
		call.finish(nil, invalidArg("rpc", "request of %d bytes exceeds %d", len(req), transport.MaxPayload))
		return call
	}
	s := c.rpc
	s.mu.Lock()
	if s.err != nil { // checked with the registration, so failAll cannot miss the call
		s.mu.Unlock()
		call.finish(nil, s.err)
		return call
	}
	s.nextID++
	call.id = s.nextID
	s.calls[call.id] = call
	s.mu.Unlock()
	if peer == c.rank {
		c.serveRPC(c.rank, call.id, id, req, false, false) // no transport to oneself
		return call
	}
	send := func() {
		ctx, cancel := c.opContext(context.Background())
		defer cancel()
		if err := c.sendRPC(ctx, peer, rpcRequest, call.id, id, req); err != nil {
			c.rpcDone(call.id, -1, nil, c.opError("rpc", ctx, err))
		}
	}
	if inline {
		send()
		return call
	}
	c.ops.Add(1)
	go func() {
		defer c.ops.Done()
		send()
	}()
	return call
}

// Wait waits for the reply. When ctx (or the communicator's Timeout) ends
// first it returns CodeTimeout and the call is abandoned: a reply that
// comes later is dropped. The communicator's failure ends every call
// (rpcState.failAll).
func (call *Call) Wait(ctx context.Context) ([]byte, error) {
	select {
	case <-call.done:
		return call.reply, call.err
	default:
	}
	c := call.c
	ctx, cancel := c.opContext(ctx)
	defer cancel()
	select {
	case <-call.done:
	case <-ctx.Done():
		call.expire(ctx.Err()) // nothing if c's failure finished it first
	}
	<-call.done
	return call.reply, call.err
}

// Recycle says that the caller is done with the reply of a finished call:
// its buffer may be reused, so the reply (from Wait or Test) must not be
// used any more. Optional; later calls do nothing.
func (call *Call) Recycle() {
	select {
	case <-call.done:
	default:
		return
	}
	call.mu.Lock()
	again := call.recycled
	call.recycled = true
	call.mu.Unlock()
	if !again && call.pooled {
		call.c.rpc.pool.put(call.reply)
	}
}

// Done is closed when the call has its reply or failed.
func (call *Call) Done() <-chan struct{} { return call.done }

// Test reports, without waiting, whether the call is done, and then its
// reply or error.
func (call *Call) Test() (done bool, reply []byte, err error) {
	select {
	case <-call.done:
		return true, call.reply, call.err
	default:
		return false, nil, nil
	}
}

func (call *Call) finish(reply []byte, err error) {
	call.finishPooled(reply, false, err)
}

// finishPooled is finish with a reply from the pool when pooled; it
// reports whether the call took the reply.
func (call *Call) finishPooled(reply []byte, pooled bool, err error) (took bool) {
	call.once.Do(func() {
		took = true
		call.reply, call.pooled, call.err = reply, pooled, err
		call.mu.Lock()
		call.finished = true
		stop := call.stop
		call.mu.Unlock()
		if stop != nil {
			stop()
		}
		close(call.done)
	})
	return took
}

// failAll fails every call in flight, and every later one, with err (the
// communicator failed).
func (s *rpcState) failAll(err error) {
	s.mu.Lock()
	s.err = withOp(err, "rpc")
	calls := s.calls
	s.calls = make(map[uint64]*Call)
	s.mu.Unlock()
	for _, call := range calls {
		call.finish(nil, s.err)
	}
}

// rpcDone completes call id, if still pending, with a reply from comm rank
// from (ignored when it is not the rank called) or, for from < 0, with
// what this rank found.
func (c *Comm) rpcDone(id uint64, from int, reply []byte, err error) {
	c.rpcDonePooled(id, from, reply, false, err)
}

// rpcDonePooled is rpcDone with a reply from the pool when pooled: it goes
// back to the pool when no call takes it.
func (c *Comm) rpcDonePooled(id uint64, from int, reply []byte, pooled bool, err error) {
	s := c.rpc
	s.mu.Lock()
	call := s.calls[id]
	if call == nil || (from >= 0 && call.peer != from) {
		s.mu.Unlock()
		if pooled {
			s.pool.put(reply)
		}
		return
	}
	delete(s.calls, id)
	s.mu.Unlock()
	if !call.finishPooled(reply, pooled, err) && pooled {
		s.pool.put(reply)
	}
}

func (c *Comm) sendRPC(ctx context.Context, peer int, sub uint8, id uint64, fn uint32, payload []byte) error {
	var th transport.Header
	(&header{kind: kindRPC, sub: sub, comm: c.id, seqOrTag: id, step: fn, total: uint64(len(payload))}).encode(&th, c.gen)
	return c.n.ep.Send(ctx, c.world[peer], transport.LaneRPC, &th, payload)
}

// placeRPC is the transport.PlaceFunc part for RPC (node.place): a large
// request or reply is read straight into a pooled buffer and delivered
// from there, so that neither the Go runtime's zeroing of a fresh buffer
// nor the garbage it leaves is paid per call.
func (c *Comm) placeRPC(src int, h header, size int) ([]byte, func(error)) {
	if uint64(size) != h.total || poolClass(size) < 0 {
		return nil, nil // the Handler takes it (and reports what is wrong)
	}
	b := c.rpc.pool.get(size)
	return b, func(err error) {
		if err != nil {
			c.rpc.pool.put(b)
			return
		}
		c.deliverRPCPooled(src, h, b, true, false)
	}
}

// deliverRPC takes an RPC message from comm rank src. A request waits for
// a handler slot (back-pressure on src's RPC lane only) unless mustNotBlock.
func (c *Comm) deliverRPC(src int, h header, payload []byte, mustNotBlock bool) {
	c.deliverRPCPooled(src, h, payload, false, mustNotBlock)
}

// deliverRPCPooled is deliverRPC for a payload from the pool when pooled.
func (c *Comm) deliverRPCPooled(src int, h header, payload []byte, pooled, mustNotBlock bool) {
	switch h.sub {
	case rpcRequest:
		c.serveRPC(src, h.seqOrTag, h.step, payload, pooled, !mustNotBlock)
	case rpcReply:
		c.rpcDonePooled(h.seqOrTag, src, payload, pooled, nil)
	case rpcErrReply:
		e := c.decodeCause(payload)
		if pooled {
			c.rpc.pool.put(payload)
		}
		if e == nil {
			e = &Error{Code: CodeInternal, Op: "rpc", Rank: src, Msg: "malformed error reply"}
		}
		e.Op = "rpc"
		c.rpcDone(h.seqOrTag, src, nil, e)
	default:
		if pooled {
			c.rpc.pool.put(payload)
		}
	}
}

// serveRPC runs the handler of fn for a request from comm rank src (this
// rank for a call to itself) in a goroutine of its own, once a handler slot
// is free (waiting for it here when wait, else in that goroutine), and
// sends the reply. A pooled request goes back to the pool once a lent
// handler is done with it (an owning handler keeps it).
func (c *Comm) serveRPC(src int, id uint64, fn uint32, req []byte, pooled, wait bool) {
	recycle := func() {
		if pooled {
			c.rpc.pool.put(req)
		}
	}
	if err := c.failure("rpc"); err != nil {
		recycle()
		c.replyRPC(src, id, nil, nil, err)
		return
	}
	s := c.rpc
	s.mu.Lock()
	h, ok := s.handlers[fn]
	s.mu.Unlock()
	if !ok {
		recycle()
		c.replyRPC(src, id, nil, nil, &Error{Code: CodeInvalidArgument, Op: "rpc", Rank: c.rank,
			Msg: fmt.Sprintf("rank %d has no handler for function %d", c.rank, fn)})
		return
	}
	acquire := func() bool {
		select {
		case s.sem <- struct{}{}:
			return true
		case <-c.ctx.Done():
			return false
		}
	}
	if wait && !acquire() {
		recycle()
		return
	}
	s.running.Add(1)
	go func() {
		defer s.running.Done()
		if !wait && !acquire() {
			recycle()
			return
		}
		defer func() { <-s.sem }()
		var reply []byte
		var release func()
		var err error
		if h.lent != nil {
			reply, release, err = runLentHandler(c.ctx, h.lent, src, req)
			defer recycle() // after the reply is sent: it may be req itself
			if release == nil {
				release = func() {} // still lent: a call to oneself gets a copy
			}
		} else {
			reply, err = runHandler(c.ctx, h.own, src, req)
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				e = &Error{Code: CodeInternal, Op: "rpc", Rank: c.rank, Msg: err.Error()}
			}
			err = &Error{Code: e.Code, Op: "rpc", Rank: c.rank, Msg: fmt.Sprintf("rank %d, function %d: %s", c.rank, fn, e.Msg)}
		} else if len(reply) > transport.MaxPayload {
			err = &Error{Code: CodeInvalidArgument, Op: "rpc", Rank: c.rank,
				Msg: fmt.Sprintf("rank %d, function %d: reply of %d bytes exceeds %d", c.rank, fn, len(reply), transport.MaxPayload)}
		}
		c.replyRPC(src, id, reply, release, err)
	}()
}

// runHandler calls h, turning a panic into an error.
func runHandler(ctx context.Context, h RPCHandler, from int, req []byte) (reply []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			reply, err = nil, fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h(ctx, from, req)
}

// runLentHandler calls h, turning a panic into an error.
func runLentHandler(ctx context.Context, h RPCLentHandler, from int, req []byte) (reply []byte, release func(), err error) {
	defer func() {
		if p := recover(); p != nil {
			reply, release, err = nil, nil, fmt.Errorf("handler panicked: %v", p)
		}
	}()
	return h(ctx, from, req)
}

// replyRPC sends the reply (or err) of call id to comm rank dst, then
// calls release (when not nil: the reply was lent).
func (c *Comm) replyRPC(dst int, id uint64, reply []byte, release func(), err error) {
	if release != nil {
		defer release()
	}
	if dst == c.rank {
		if release != nil && err == nil && len(reply) > 0 {
			// The lent reply is released on return: the caller gets a copy.
			b := c.rpc.pool.get(len(reply))
			copy(b, reply)
			c.rpcDonePooled(id, dst, b, poolClass(len(b)) >= 0, nil)
			return
		}
		c.rpcDone(id, dst, reply, err)
		return
	}
	sub, payload := rpcReply, reply
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{Code: CodeInternal, Op: "rpc", Rank: c.rank, Msg: err.Error()}
		}
		sub, payload = rpcErrReply, encodeCause(e)
	}
	// Not bounded by c.ctx: a communicator that failed still tells its
	// callers why.
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Timeout)
	defer cancel()
	stop := context.AfterFunc(chanctx.Of(c.n.done), cancel)
	defer stop()
	_ = c.sendRPC(ctx, dst, sub, id, 0, payload) // a caller gone or lost fails on its side
}
