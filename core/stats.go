package core

import "sync/atomic"

// Stats is a snapshot of a communicator's memory and traffic (Comm.Stats).
// Figures marked per process are the node's, shared by a world
// communicator and every communicator split or shrunk from it.
type Stats struct {
	// BytesBuffered is the payload of messages that arrived before their
	// receive was posted, held until it is (bounded by
	// Config.MaxBufferedBytes). Per process.
	BytesBuffered int64
	// ScratchBytes is the collectives' scratch this communicator holds:
	// buffers in use by running calls plus idle ones kept for the next
	// (bounded by Config.ScratchIdleBytes). Per communicator.
	ScratchBytes int64
	// RingBytes is the capacity of the shared-memory rings this process
	// created (bounded by Config.RingBudget); 0 without shared memory.
	// Per process.
	RingBytes int64
	// RelayedBytes is the payload this process forwarded for other ranks
	// under a sparse Config.Topology (0 under the full mesh). Per process.
	RelayedBytes int64
	// Connections is how many other ranks this process talks to directly
	// now (docs/scale.md): every other rank in the full mesh, the
	// neighbours under a sparse Config.Topology, the connections open at
	// this moment on demand. Per process.
	Connections int
	// HeartbeatsSent counts the heartbeats this process sent (one per
	// watched peer and Config.HeartbeatInterval). Per process.
	HeartbeatsSent int64
	// MessagesSent, BytesSent and BytesReceived count the data messages
	// (collective steps and point-to-point sends, not control or RPC
	// traffic) this communicator sent, and their payload bytes sent and
	// received. Per communicator.
	MessagesSent  int64
	BytesSent     int64
	BytesReceived int64
}

// traffic is a communicator's counters: atomic adds on the data path.
type traffic struct {
	msgsSent, bytesSent, bytesRecv atomic.Int64
}

func (t *traffic) sent(n int) {
	t.msgsSent.Add(1)
	t.bytesSent.Add(int64(n))
}

// Stats returns c's statistics. It takes no lock of c; each figure is read
// atomically, not all at one instant. Valid after Close (the traffic
// stays, the scratch is 0).
func (c *Comm) Stats() Stats {
	s := Stats{
		BytesBuffered: c.n.buffered.Load(),
		ScratchBytes:  c.scratch.Held(),
		MessagesSent:  c.traffic.msgsSent.Load(),
		BytesSent:     c.traffic.bytesSent.Load(),
		BytesReceived: c.traffic.bytesRecv.Load(),
	}
	s.RelayedBytes = c.n.relayedBytes()
	s.Connections = c.n.connections()
	s.HeartbeatsSent = c.n.heartbeats.Load()
	if f := c.n.ringBytes; f != nil {
		s.RingBytes = f()
	}
	return s
}
