// Package bulk is the bulk data path: a composite transport.Endpoint that
// keeps control, heartbeat and RPC lanes on an inner endpoint (QUIC) and
// moves every LaneData message to a peer over that peer's bulk channel when
// one exists, so large payloads are not bound by one quic-go connection.
// LaneRPC gets channels of its own, made with a pair's first call
// (rpcchan.go).
//
// Channels are per direction, and the receiving side of each direction
// offers it. At Start each rank says hello to each peer and each peer
// answers with an offer; a pair's data waits until its channel exists, so
// no message overtakes another of its (peer, lane) by changing channel:
//
//   - same host (equal host ids, and the producer can actually open the
//     consumer's segment): a single-producer single-consumer ring in a 0600
//     file under /dev/shm, mapped by both sides and unlinked once both have
//     it; waiting spins briefly and then sleeps on a futex. Start only
//     learns that the peer is local: the ring is made when the first
//     message to the peer is sent (the send waits for it), sized so that
//     the rings one process creates stay within Options.RingBudget;
//   - other hosts where both ranks have an active RDMA device
//     (Options.RDMA): a queue pair per direction (rdmachan.go,
//     transport/rdma);
//   - otherwise: N parallel TCP connections, TLS 1.3 pinned to the same
//     certificates as QUIC by default (plaintext on request), authorised by
//     an HMAC of a one-time nonce the receiver sent over the authenticated
//     QUIC control lane; large messages are striped across them;
//   - else the inner endpoint.
//
// The negotiation travels on LaneControl with owner byte (header byte 0)
// 0xB5, a transport-owned value (transport.OwnerTransport), and is
// consumed here; docs/bulk-path.md and docs/wire-format.md describe it.
// Its messages are CBOR maps with string keys, version 1; both ends of a
// job are the same build, so the encoding may change from one release to
// the next without a version negotiation.
//
// The files, by concern:
//
//   - negotiate.go: the negotiator, both negotiations (data and RPC
//     channels) as one IO-free state machine: events in, actions out;
//     ctlmsg.go its typed messages and their wire form; control.go the
//     endpoint's side: the control lane, and the IO each action asks for;
//   - route.go: which path a message takes, and polling a peer's ring;
//   - down.go, procdeath.go: departures and deaths, a departure held back
//     until the peer's inbound channels drained;
//   - info.go: paths and memory, for diagnostics;
//   - channel.go, ring_*.go, tcp.go, rdmachan.go, rpcchan.go: the channels;
//   - bulk.go: Options, New, Start, Close.
package bulk
