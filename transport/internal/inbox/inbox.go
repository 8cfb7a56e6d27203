// Package inbox is a bounded, ordered delivery queue with one goroutine that
// calls a transport.Handler. Transports use it for loopback and for the
// in-memory mesh: one inbox per (sender, lane) gives per-lane ordering and
// per-lane back-pressure.
package inbox

import (
	"context"
	"sync"

	"github.com/nexar-go/nexar/transport"
)

type msg struct {
	lane transport.Lane
	h    *transport.Header
	p    []byte
}

// Inbox delivers messages from one sender on one lane, in order. Put is safe
// for concurrent use.
type Inbox struct {
	ch       chan msg
	done     <-chan struct{}
	sealed   chan struct{}
	sealOnce sync.Once
	drained  func()
}

// Start starts the delivery goroutine, counted in wg. It stops, dropping
// what is still queued, when done is closed.
func Start(wg *sync.WaitGroup, depth int, done <-chan struct{}, from int, h transport.Handler) *Inbox {
	q := &Inbox{ch: make(chan msg, depth), done: done, sealed: make(chan struct{})}
	deliver := func(m msg) bool {
		// Prefer stopping over delivering once done is closed.
		select {
		case <-done:
			return false
		default:
		}
		if h != nil {
			h(from, m.lane, m.h, m.p)
		}
		return true
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case m := <-q.ch:
				if !deliver(m) {
					return
				}
			case <-q.sealed:
				for {
					select {
					case m := <-q.ch:
						if !deliver(m) {
							return
						}
						continue
					default:
					}
					break
				}
				q.drained()
				return
			}
		}
	}()
	return q
}

// Seal says that no Put will follow: the delivery goroutine delivers what
// is queued, calls drained (unless done closes first) and exits. The caller
// must make sure that every Put has returned before it seals.
func (q *Inbox) Seal(drained func()) {
	q.sealOnce.Do(func() {
		q.drained = drained
		close(q.sealed)
	})
}

// Put copies header and payload and queues them, blocking while the queue is
// full. It returns ctx's error if ctx ends first, and errStop if stop (or the
// inbox's done channel) is closed first.
func (q *Inbox) Put(ctx context.Context, lane transport.Lane, h *transport.Header, p []byte, stop <-chan struct{}, errStop func() error) error {
	m := msg{lane: lane, h: new(transport.Header), p: make([]byte, len(p))}
	if h != nil {
		*m.h = *h
	}
	copy(m.p, p)
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case q.ch <- m:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return errStop()
	case <-q.done:
		return errStop()
	}
}
