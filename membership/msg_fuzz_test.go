package membership

import (
	"bytes"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// fuzzMsgs are the messages a peer sends to the seed, the lobby and the
// members, each with the frame limit its reader applies (0: an agreement
// message, a payload of core's ctlAgree, not a frame); the first input byte
// picks one.
var fuzzMsgs = []struct {
	name string
	max  int
	new  func() any
}{
	{"join", maxJoinFrame, func() any { return new(joinMsg) }},
	{"welcome", maxWelcome, func() any { return new(welcomeMsg) }},
	{"report", maxJoinFrame, func() any { return new(reportMsg) }},
	{"notice", maxJoinFrame, func() any { return new(noticeMsg) }},
	{"lobbyHello", maxJoinFrame, func() any { return new(lobbyHello) }},
	{"admit", maxJoinFrame, func() any { return new(admitMsg) }},
	{"agree", 0, func() any { return new(AgreeMsg) }},
}

// fuzzAgreeN is the membership agreement messages are checked against.
const fuzzAgreeN = 8

func fuzzMsgSeed(f *testing.F, kind int, v any) {
	var b bytes.Buffer
	if fuzzMsgs[kind].max == 0 {
		p, err := cbor.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		b.Write(p)
	} else if err := writeFrame(&b, v); err != nil {
		f.Fatal(err)
	}
	f.Add(append([]byte{byte(kind)}, b.Bytes()...))
}

// decodeFuzzMsg decodes p as the message kind names, as its reader does.
func decodeFuzzMsg(kind int, p []byte) (any, error) {
	m := fuzzMsgs[kind]
	v := m.new()
	if m.max == 0 {
		if err := cbor.Unmarshal(p, v); err != nil {
			return nil, err
		}
		return v, v.(*AgreeMsg).Validate(fuzzAgreeN)
	}
	return v, readFrame(bytes.NewReader(p), m.max, v)
}

// FuzzMessages feeds the seed's, the lobby's and the agreement's decoders
// what a peer could send: none may panic, a frame over its reader's limit
// is refused before its body is read, and a message accepted encodes to
// bytes that decode to the same message (a fixed point after one round).
func FuzzMessages(f *testing.F) {
	fp := bytes.Repeat([]byte{0xab}, 32)
	fuzzMsgSeed(f, 0, &joinMsg{V: 1, Rank: -1, Addr: "10.0.0.1:4000", FP: fp, Proof: fp, Lobby: "10.0.0.1:4001", Topo: "kregular:2", Idle: 5000})
	fuzzMsgSeed(f, 1, &welcomeMsg{V: 1, Rank: 1, Size: 2, Proof: fp, Peers: []peerMsg{{Rank: 0, Addr: "10.0.0.1:4000", FP: fp}, {Rank: 1, Addr: "10.0.0.2:4000", FP: fp, Lobby: "10.0.0.2:4001"}}})
	fuzzMsgSeed(f, 1, &welcomeMsg{V: 1, Code: 3, Err: "token mismatch", Formed: true})
	fuzzMsgSeed(f, 0, &joinMsg{V: 1, Rank: 3, Addr: strings.Repeat("a", maxJoinFrame), FP: fp, Proof: fp}) // over the limit
	fuzzMsgSeed(f, 2, &reportMsg{OK: true})
	fuzzMsgSeed(f, 3, &noticeMsg{Lost: 3, Why: "connection closed"})
	fuzzMsgSeed(f, 4, &lobbyHello{V: 1, ID: fp[:16], Proof: fp})
	fuzzMsgSeed(f, 5, &admitMsg{V: 1, Admission: Admission{Seed: "10.0.0.1:5000", Rank: 4, Size: 6, Gen: 2, Max: 16}, Proof: fp})
	fuzzMsgSeed(f, 6, &AgreeMsg{Kind: AgreePropose, Ballot: 0, Flag: 1, Suspects: []int{3}, VBallot: -1, Extra: [][]byte{fp}})
	fuzzMsgSeed(f, 6, &AgreeMsg{Kind: AgreeCommit, Ballot: 2, Value: &Decision{Flag: 1, Failed: []int{3, 5}, Extra: [][]byte{fp[:8]}}, VBallot: 2})
	f.Add([]byte{0, 0xff, 0xff, 0xff, 0xff})                   // a length past every limit
	f.Add([]byte{1, 0, 0, 0, 5, 0x9a, 0x00, 0x10, 0x00, 0x00}) // an array claiming 2^20 peers in 5 bytes

	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		kind := int(data[0]) % len(fuzzMsgs)
		p := data[1:]
		v, err := decodeFuzzMsg(kind, p)
		if m := fuzzMsgs[kind].max; m > 0 && len(p) >= 4 {
			if n := uint32(p[0])<<24 | uint32(p[1])<<16 | uint32(p[2])<<8 | uint32(p[3]); n > uint32(m) && err == nil {
				t.Fatalf("%s: accepted a frame of %d bytes (limit %d)", fuzzMsgs[kind].name, n, m)
			}
		}
		if err != nil {
			return
		}
		b1, err := cbor.Marshal(v)
		if err != nil {
			t.Fatalf("%s: re-encoding an accepted message: %v", fuzzMsgs[kind].name, err)
		}
		in := b1
		if fuzzMsgs[kind].max > 0 {
			var fr bytes.Buffer
			if err := writeFrame(&fr, v); err != nil {
				t.Fatal(err)
			}
			in = fr.Bytes()
		}
		v2, err := decodeFuzzMsg(kind, in)
		if err != nil {
			if fuzzMsgs[kind].max > 0 && len(b1) > fuzzMsgs[kind].max {
				return // over the limit once re-encoded: fields the input left out are written
			}
			t.Fatalf("%s: an accepted message re-encoded is refused: %v (%x)", fuzzMsgs[kind].name, err, b1)
		}
		b2, err := cbor.Marshal(v2)
		if err != nil || !bytes.Equal(b1, b2) {
			t.Fatalf("%s: round trip changed the message:\n%x\n%x (%v)", fuzzMsgs[kind].name, b1, b2, err)
		}
	})
}
