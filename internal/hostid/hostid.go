// Package hostid names this host and boot, for the packages that decide
// whether two ranks share a machine (transport/bulk's shared memory, hier's
// split per host). It is a leaf, so hier need not import a transport.
package hostid

import (
	"os"
	"strings"
)

// Local returns an identifier of this host and boot: machine id, boot id,
// host name and network namespace. Ranks with equal ids try shared memory;
// the attempt to open the segment decides. The namespace makes ranks in two
// network namespaces of one machine (containers, the two-host tests) talk
// as different hosts do, over the network, although they share /dev/shm.
func Local() string {
	hn, _ := os.Hostname()
	ns, _ := os.Readlink("/proc/self/ns/net") // "net:[inode]"; empty off Linux
	return read("/etc/machine-id") + "/" + read("/proc/sys/kernel/random/boot_id") + "/" + hn + "/" + ns
}

// Kernel returns an identifier of this machine's running kernel (machine
// id and boot id), without the host name and network namespace: ranks
// with equal ones share its CPUs, whether or not they share memory or
// talk as hosts (containers, the two-host tests). Empty where neither can
// be read.
func Kernel() string {
	m, b := read("/etc/machine-id"), read("/proc/sys/kernel/random/boot_id")
	if m == "" && b == "" {
		return ""
	}
	return m + "/" + b
}

// read returns the file's content without surrounding space; empty when
// it cannot be read.
func read(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}
