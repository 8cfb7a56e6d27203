//go:build !linux

package bulk

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

// ring is unavailable off Linux: the composite endpoint then uses TCP or
// QUIC between ranks of one host.
type ring struct {
	path  string
	yield atomic.Bool
	pres  *presence
	polls uint32
	sync  *raceSync
}

var errNoShm = errors.New("bulk: shared memory rings need Linux")

var shmDir = "/dev/shm"

func createRing(int) (*ring, string, []byte, error)                     { return nil, "", nil, errNoShm }
func openRing(string, int, []byte) (*ring, error)                       { return nil, errNoShm }
func (r *ring) unlink()                                                 {}
func (r *ring) Write(context.Context, []byte, func() bool) (int, error) { return 0, errNoShm }
func (r *ring) TryRead([]byte) int                                      { return 0 }
func (r *ring) closedErr() error                                        { return errNoShm }
func (r *ring) Read([]byte) (int, error)                                { return 0, errNoShm }
func (r *ring) Close() error                                            { return nil }
func (r *ring) release()                                                {}
func (r *ring) producerGone()                                           {}
func shmSupported() bool                                                { return false }
func sweepStaleRings() []string                                         { return nil }
func (r *ring) available() uint64                                       { return 0 }
func (r *ring) waitData(time.Duration) (bool, error)                    { return false, errNoShm }
func (r *ring) setWaiting(int)                                          {}
func (r *ring) sleepData(func() bool, time.Duration) bool               { return false }
func (r *ring) setPresence(uint64)                                      {}
func (r *ring) presence() uint64                                        { return 0 }
func (r *ring) nudge()                                                  {}
func (r *ring) remoteOK() bool                                          { return false }
func (r *ring) setRemoteOK()                                            {}
func (r *ring) sentRemote() uint32                                      { return 0 }
func (r *ring) ack()                                                    {}
func (r *ring) waitAck(context.Context, uint32, int, func() bool) error { return errNoShm }
