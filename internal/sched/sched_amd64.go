package sched

// hasRDPID is fixed at start-up (CPUID), never written again.
var hasRDPID = cpuidRDPID()

// cpuidRDPID reports whether the processor has RDPID (CPUID leaf 7, ECX
// bit 22), which reads IA32_TSC_AUX: Linux keeps the CPU number there
// (bits 0-11) for every CPU, as it does for RDTSCP and the vDSO.
func cpuidRDPID() bool

func rdpid() uint64

func cpu() int {
	if !hasRDPID {
		return -1
	}
	return int(rdpid() & 0xfff)
}
