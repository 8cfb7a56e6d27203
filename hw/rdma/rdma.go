// Package rdma is nexar's optional InfiniBand/RoCE data path over libibverbs.
//
// The real bindings live behind the build tag "rdma" (they need cgo and
// libibverbs-dev at build time and link -libverbs). Without the tag the
// package builds as a stub whose Available and Devices return
// ErrUnavailable, so the rest of nexar builds and tests on machines with no
// RDMA stack at all. Even with the tag, Available reports "no RDMA device
// found" when the kernel exposes no device under /sys/class/infiniband.
//
// The API is a deliberately small slice of verbs: device enumeration, a
// protection domain, memory registration (with a bounded RegCache), RC queue
// pairs driven through RESET→INIT→RTR→RTS, post send/recv and CQ polling.
// Memory handed to Register must not move while registered: use C memory or
// Go memory pinned with runtime.Pinner for as long as the registration lives.
package rdma

import (
	"errors"
	"fmt"
	"os"
)

// ErrUnavailable is returned (wrapped) by every entry point of a build
// without the rdma tag.
var ErrUnavailable = errors.New("hw/rdma: unavailable: built without the rdma tag")

// ErrNoDevice is returned (wrapped) when the kernel exposes no RDMA device.
var ErrNoDevice = errors.New("hw/rdma: no RDMA device found")

// sysfsDir is where the kernel lists RDMA devices; a variable for tests.
var sysfsDir = "/sys/class/infiniband"

// Device describes one RDMA device as enumerated by ibv_get_device_list.
type Device struct {
	Name     string // kernel name, e.g. "mlx5_0"
	GUID     uint64 // node GUID in host byte order
	NodeType string // "ca", "switch", "router", "rnic", ...
	Ports    []Port
}

// Port is the state of one port of a Device (ibv_query_port).
type Port struct {
	Num       int
	State     string // "active", "down", ...
	LinkLayer string // "infiniband" or "ethernet"
	LID       uint16
	ActiveMTU int // bytes
}

func (d Device) String() string {
	return fmt.Sprintf("%s (guid %016x, %s, %d ports)", d.Name, d.GUID, d.NodeType, len(d.Ports))
}

// sysfsDevices lists device names the kernel exposes, without libibverbs.
func sysfsDevices() ([]string, error) {
	ents, err := os.ReadDir(sysfsDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w (%s does not exist)", ErrNoDevice, sysfsDir)
		}
		return nil, fmt.Errorf("hw/rdma: reading %s: %w", sysfsDir, err)
	}
	if len(ents) == 0 {
		return nil, fmt.Errorf("%w (%s is empty)", ErrNoDevice, sysfsDir)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}

var portStates = map[int]string{0: "nop", 1: "down", 2: "init", 3: "armed", 4: "active", 5: "active_defer"}

func portStateName(s int) string {
	if n, ok := portStates[s]; ok {
		return n
	}
	return fmt.Sprintf("state(%d)", s)
}

func mtuBytes(m int) int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << m // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5
}
