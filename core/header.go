package core

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/membership"
	"github.com/nexar-go/nexar/transport"
)

// Header layout (transport.Header, 56 bytes, little-endian; see
// docs/wire-format.md):
//
//	off len field
//	  0   1 version (wireVersion)
//	  1   1 kind: 1 p2p, 2 collective, 3 control, 4 heartbeat, 5 rpc
//	  2   1 control subtype (kind 3), else 0
//	  3   1 signature: collective kind (collKind)
//	  4   1 signature: dtype (collective.DType)
//	  5   1 signature: op (collective.Op)
//	  6   2 signature: tuning digest (collective.Tuning.Digest)
//	  8   8 communicator id
//	 16   8 collective: operation sequence number; p2p: tag
//	 24   4 collective: step
//	 28   4 signature: root (int32, -1 = none)
//	 32   8 signature: count in elements (all ones = not compared)
//	 40   8 total length of the message in bytes
//	 48   4 membership generation of the sender's view (membership.Generation)
//	 52   4 reserved, zero
//
// A message longer than transport.MaxPayload travels as consecutive chunks
// with identical headers on the same lane; the receiver knows the offset of
// each chunk from the bytes it has already received for that message.
const wireVersion = 2

// Byte 0 of a header belongs to the layer above only below
// transport.OwnerTransport (transports mark their own messages there):
// this fails to compile should the version ever reach it.
const _ = uint8(transport.OwnerTransport - 1 - wireVersion)

type msgKind uint8

const (
	kindP2P       msgKind = 1
	kindColl      msgKind = 2
	kindControl   msgKind = 3
	kindHeartbeat msgKind = 4
	kindRPC       msgKind = 5 // sub: rpcRequest, rpcReply, rpcErrReply (core/rpc.go)
)

// Control subtypes.
const (
	ctlSigCheck uint8 = 1 // the sender's signature for seq, to its ring successor
	ctlAbort    uint8 = 2 // payload: encodeCause of the failure; fail the comm
	// ctlBye travels on LaneData, behind every data message of the sender
	// (on LaneControl to a peer no data ever went to, see sayBye): it
	// destroyed the communicator; seqOrTag is the first collective
	// sequence number it did not complete. Its payload is empty after a
	// clean close, else the sender's failure (byeCause).
	ctlBye uint8 = 3
	// ctlDeclaredDown (node level, comm 0, LaneControl): the sender declared
	// the receiver unreachable; payload: UTF-8 reason.
	ctlDeclaredDown uint8 = 4
	// ctlRevoke (LaneControl): the sender revoked the communicator, or
	// learned that a member did and passes it on; payload: the revoking
	// rank (int32, little-endian).
	ctlRevoke uint8 = 5
	// ctlAgree (LaneControl): a message of agreement seqOrTag; payload: a
	// CBOR membership.AgreeMsg (core/recover.go).
	ctlAgree uint8 = 6
	// ctlGrow (LaneControl): the leader of the grow decided by agreement
	// seqOrTag tells the other members its seed's host:port (UTF-8; empty
	// when it could not start one) (core/grow.go).
	ctlGrow uint8 = 7
	// ctlGrowAbort (LaneControl): a member of the grow decided by
	// agreement seqOrTag could not admit a joiner that the agreement named
	// (it had left the member's lobby); every member abandons that grow.
	// Payload: the joiner's rank in the grown world (uint32,
	// little-endian) (core/grow.go).
	ctlGrowAbort uint8 = 8
)

type header struct {
	kind     msgKind
	sub      uint8
	comm     uint64
	seqOrTag uint64
	step     uint32
	sig      signature
	total    uint64
	gen      membership.Generation // decoded, for the receiver's check; encode takes the sender's as an argument
}

// encode writes h into dst as sent in membership generation gen.
func (h *header) encode(dst *transport.Header, gen membership.Generation) {
	*dst = transport.Header{}
	dst[0] = wireVersion
	dst[1] = byte(h.kind)
	dst[2] = h.sub
	dst[3] = byte(h.sig.kind)
	dst[4] = byte(h.sig.dt)
	dst[5] = byte(h.sig.op)
	binary.LittleEndian.PutUint16(dst[6:], h.sig.tuning)
	binary.LittleEndian.PutUint64(dst[8:], h.comm)
	binary.LittleEndian.PutUint64(dst[16:], h.seqOrTag)
	binary.LittleEndian.PutUint32(dst[24:], h.step)
	binary.LittleEndian.PutUint32(dst[28:], uint32(int32(h.sig.root)))
	binary.LittleEndian.PutUint64(dst[32:], h.sig.count)
	binary.LittleEndian.PutUint64(dst[40:], h.total)
	binary.LittleEndian.PutUint32(dst[48:], uint32(gen))
}

func decodeHeader(src *transport.Header) (header, error) {
	var h header
	if src[0] != wireVersion {
		return h, fmt.Errorf("unknown header version %d", src[0])
	}
	h.kind = msgKind(src[1])
	if h.kind < kindP2P || h.kind > kindRPC {
		return h, fmt.Errorf("unknown message kind %d", src[1])
	}
	h.sub = src[2]
	h.sig.kind = collKind(src[3])
	h.sig.dt = collective.DType(src[4])
	h.sig.op = collective.Op(src[5])
	h.sig.tuning = binary.LittleEndian.Uint16(src[6:])
	h.comm = binary.LittleEndian.Uint64(src[8:])
	h.seqOrTag = binary.LittleEndian.Uint64(src[16:])
	h.step = binary.LittleEndian.Uint32(src[24:])
	h.sig.root = int(int32(binary.LittleEndian.Uint32(src[28:])))
	h.sig.count = binary.LittleEndian.Uint64(src[32:])
	h.total = binary.LittleEndian.Uint64(src[40:])
	h.gen = membership.Generation(binary.LittleEndian.Uint32(src[48:]))
	return h, nil
}

// collKind names a collective in signatures. Values are on the wire.
type collKind uint8

const (
	collNone collKind = iota
	collAllreduce
	collBroadcast
	collReduce
	collAllgather
	collAllgatherv
	collReduceScatter
	collAlltoall
	collAlltoallv
	collGather
	collGatherv
	collScatter
	collScatterv
	collScan
	collExscan
	collBarrier
	collSplit
	numCollKinds
)

var collNames = [numCollKinds]string{
	"none", "allreduce", "broadcast", "reduce", "allgather", "allgatherv",
	"reduce_scatter", "alltoall", "alltoallv", "gather", "gatherv", "scatter",
	"scatterv", "scan", "exscan", "barrier", "split",
}

func (k collKind) String() string {
	if k >= numCollKinds {
		return fmt.Sprintf("collective(%d)", uint8(k))
	}
	return collNames[k]
}

// noCount marks a signature count that is not compared (v-forms whose
// counts legitimately differ between ranks).
const noCount = ^uint64(0)

// signature is what ranks compare to detect mismatched collective calls.
type signature struct {
	kind  collKind
	dt    collective.DType
	op    collective.Op
	root  int // -1 when the collective has no root
	count uint64
	// tuning is the communicator's collective.Tuning digest: ranks with
	// different chunk sizes or algorithm choices would number steps
	// differently and hang, so they must fail as mismatched instead.
	tuning uint16
}

func (k collKind) hasOp() bool {
	switch k {
	case collAllreduce, collReduce, collReduceScatter, collScan, collExscan:
		return true
	}
	return false
}

func (k collKind) hasDType() bool { return k != collBarrier && k != collSplit }

// String renders a call as users wrote it: "allreduce(float32, count=10, sum)".
func (s signature) String() string {
	var args []string
	if s.kind.hasDType() {
		args = append(args, s.dt.String())
	}
	if s.count != noCount && s.kind != collBarrier {
		args = append(args, fmt.Sprintf("count=%d", s.count))
	}
	if s.kind.hasOp() {
		args = append(args, s.op.String())
	}
	if s.root >= 0 {
		args = append(args, fmt.Sprintf("root=%d", s.root))
	}
	return s.kind.String() + "(" + strings.Join(args, ", ") + ")"
}

func (s signature) matches(o signature) bool {
	if s.kind != o.kind || s.root != o.root {
		return false
	}
	if s.kind.hasDType() && s.dt != o.dt {
		return false
	}
	if s.kind.hasOp() && s.op != o.op {
		return false
	}
	if s.count != noCount && o.count != noCount && s.count != o.count {
		return false
	}
	return s.tuning == o.tuning
}

// describePair renders two signatures that do not match, naming the tuning
// digests when nothing else tells them apart.
func describePair(a, b signature) (string, string) {
	as, bs := a.String(), b.String()
	if a.tuning != b.tuning && as == bs {
		as += fmt.Sprintf(" with tuning %04x", a.tuning)
		bs += fmt.Sprintf(" with tuning %04x (chunk size and algorithm choices must be equal on every rank)", b.tuning)
	}
	return as, bs
}

// sigBytes is the fixed encoding of a signature used as the payload of the
// signature exchange of zero-byte collectives.
const sigBytes = 18

func (s signature) put(b []byte) {
	b[0], b[1], b[2], b[3] = byte(s.kind), byte(s.dt), byte(s.op), 0
	binary.LittleEndian.PutUint32(b[4:], uint32(int32(s.root)))
	binary.LittleEndian.PutUint64(b[8:], s.count)
	binary.LittleEndian.PutUint16(b[16:], s.tuning)
}

func getSignature(b []byte) signature {
	return signature{
		kind:   collKind(b[0]),
		dt:     collective.DType(b[1]),
		op:     collective.Op(b[2]),
		root:   int(int32(binary.LittleEndian.Uint32(b[4:]))),
		count:  binary.LittleEndian.Uint64(b[8:]),
		tuning: binary.LittleEndian.Uint16(b[16:]),
	}
}
