// Package rdma is the RDMA channel of the bulk data path
// (transport/bulk): one direction of a pair's LaneData over an RC queue
// pair of libibverbs (hw/rdma), as an ordered byte stream that bulk frames
// as it frames a TCP connection.
//
// Each direction has its own queue pair. The receiving end (Listen) posts
// Slots receive buffers of SlotSize bytes before it offers its queue pair's
// address; the sending end (Dial) connects to it and answers with its own;
// the receiving end connects (Accept) and grants the sender Slots credits.
// A sender spends one credit per message it sends and the receiver returns
// each once the buffer is reposted (in batches, and whenever its reader is
// about to wait), so a SEND always finds a posted receive: no RNR in
// normal operation. Buffers shorter than WriteMin travel by SEND, in
// SlotSize pieces, and are copied out of the receive buffers; longer ones
// (a frame's payload) are announced (RTS), the receiver registers the
// buffer its reader asked to fill (the payload's final destination, from
// the layer above's PlaceFunc) and answers with its address and rkey
// (CTS), and the sender writes the payload there with one RDMA WRITE with
// immediate, whose completion tells the receiver it has landed; a reader
// whose buffer is used once (ReadOnce: a frame nobody placed) asks for a
// payload that fits in its receive buffers by SEND instead (a CTS without
// an address), which registers nothing. Memory is
// registered through hw/rdma's RegCache, whose registrations of the
// caller's buffers last across operations while hw/rdma's Pages vouches
// for their memory (docs/bulk-path.md, "Registrations that last"). Completions are polled briefly and
// then waited for on a completion channel, in the Go poller.
//
// Device memory (hw/cuda pointers) is registered with the NIC by dma-buf
// (cuMemGetHandleForAddressRange, ibv_reg_dmabuf_mr), else as peer memory
// (ibv_reg_mr on the device address, which needs nvidia-peermem), else
// staged through host memory, decided per buffer at run time (gpu.go).
//
// docs/bulk-path.md describes the protocol and docs/wire-format.md the
// parameters exchanged over the QUIC control lane.
package rdma
