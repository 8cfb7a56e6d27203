package quictransport

import (
	"encoding/binary"
	"fmt"
)

// The hello is the first thing on a connection, after TLS: the dialer names
// its rank on a bidirectional stream and the listener answers in the same
// format with status 0 once it has checked the rank against the pinned
// certificate. A pair's first connection (stripe 0) carries every lane and
// says how many connections carry LaneData (stripes, 1 to maxStripes); the
// dialer then opens stripes 1.. (see Options.DataConns).
//
//	offset size field
//	0      2    magic 'N' 'H'
//	2      1    version (3)
//	3      1    status (0 = ok; dialer sends 0)
//	4      4    rank, u32 LE
//	8      4    world size, u32 LE
//	12     1    stripe: which connection of the pair this is (0 first)
//	13     1    stripes: connections that carry LaneData
const (
	helloSize    = 14
	helloVersion = 3
)

type hello struct {
	status  uint8
	rank    uint32
	size    uint32
	stripe  uint8
	stripes uint8
}

func (h hello) marshal() []byte {
	b := make([]byte, helloSize)
	b[0], b[1], b[2], b[3] = 'N', 'H', helloVersion, h.status
	binary.LittleEndian.PutUint32(b[4:], h.rank)
	binary.LittleEndian.PutUint32(b[8:], h.size)
	b[12], b[13] = h.stripe, h.stripes
	return b
}

func parseHello(b []byte) (hello, error) {
	if len(b) != helloSize {
		return hello{}, fmt.Errorf("hello of %d bytes, want %d", len(b), helloSize)
	}
	if b[0] != 'N' || b[1] != 'H' {
		return hello{}, fmt.Errorf("hello: bad magic %#02x%02x", b[0], b[1])
	}
	if b[2] != helloVersion {
		return hello{}, fmt.Errorf("hello: unknown version %d", b[2])
	}
	return hello{status: b[3], rank: binary.LittleEndian.Uint32(b[4:]), size: binary.LittleEndian.Uint32(b[8:]),
		stripe: b[12], stripes: b[13]}, nil
}
