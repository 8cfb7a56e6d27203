//go:build race

package transporttest

// raceEnabled shrinks the largest transfers: the race detector slows a
// userspace transport such as QUIC by an order of magnitude.
const raceEnabled = true
