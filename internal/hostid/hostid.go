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
	read := func(p string) string {
		b, _ := os.ReadFile(p)
		return strings.TrimSpace(string(b))
	}
	hn, _ := os.Hostname()
	ns, _ := os.Readlink("/proc/self/ns/net") // "net:[inode]"; empty off Linux
	return read("/etc/machine-id") + "/" + read("/proc/sys/kernel/random/boot_id") + "/" + hn + "/" + ns
}
