package sched

import "golang.org/x/sys/unix"

// Allowed returns the CPUs this process may run on (sched_getaffinity of
// the calling thread, which Go's threads share unless a caller changed
// one), as a bit set: bit i of word i/64 is CPU i. Nil where it cannot be
// read.
func Allowed() []uint64 {
	var set unix.CPUSet
	if unix.SchedGetaffinity(0, &set) != nil {
		return nil
	}
	out := make([]uint64, 0, len(set))
	for _, w := range set {
		out = append(out, uint64(w))
	}
	for len(out) > 0 && out[len(out)-1] == 0 {
		out = out[:len(out)-1]
	}
	return out
}
