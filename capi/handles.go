//go:build cgo

package main

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/nexar-go/nexar/core"
)

// nextHandle is shared by every table, so a handle of one kind is never a
// valid handle of another kind, and values are never reused. It starts far
// from 0 so small integers (and NULL) are never valid.
var nextHandle atomic.Uint64

func init() { nextHandle.Store(0x6e78 << 16) }

// handleTable maps handles to Go values. It is safe for concurrent use.
type handleTable[T any] struct {
	mu sync.RWMutex
	m  map[uintptr]T
}

func (t *handleTable[T]) add(v T) uintptr {
	h := uintptr(nextHandle.Add(1))
	t.mu.Lock()
	if t.m == nil {
		t.m = make(map[uintptr]T)
	}
	t.m[h] = v
	t.mu.Unlock()
	return h
}

func (t *handleTable[T]) get(h uintptr) (T, bool) {
	t.mu.RLock()
	v, ok := t.m[h]
	t.mu.RUnlock()
	return v, ok
}

// remove deletes h and returns its value. Exactly one of several concurrent
// removes of the same handle succeeds, so a double destroy is detected.
func (t *handleTable[T]) remove(h uintptr) (T, bool) {
	t.mu.Lock()
	v, ok := t.m[h]
	delete(t.m, h)
	t.mu.Unlock()
	return v, ok
}

// request is what a nexar_request_t stands for.
type request struct {
	r      *core.Request // nil for an RPC call
	call   *rpcCall      // an RPC call (nexar_rpc_icall), else nil
	esize  int           // element size of the receive buffer, for nexar_status_t.count
	isRecv bool          // only receives have a status
}

// wait waits for the operation (or call) and returns its result.
func (q *request) wait(ctx context.Context) error {
	if q.call != nil {
		return q.call.wait(ctx)
	}
	return q.r.Wait(ctx)
}

// test reports, without waiting, whether the operation is done, and then
// its result.
func (q *request) test() (bool, error) {
	if q.call != nil {
		return q.call.test()
	}
	return q.r.Test()
}

var (
	comms    handleTable[*core.Comm]
	requests handleTable[*request]
	seeds    handleTable[*core.Seed]
)
