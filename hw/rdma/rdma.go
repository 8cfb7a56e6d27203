// Package rdma is nexar's binding to libibverbs, for the RDMA data path
// (transport/rdma) and `nexar info`.
//
// The library is loaded at run time with dlopen (the configured one, NEXAR_IBVERBS, else
// libibverbs.so.1), so libnexar.so loads and runs on machines without it;
// the package is compiled against the libibverbs-dev headers in every cgo
// build. Only exported entry points are looked up: ibv_post_send,
// ibv_post_recv, ibv_poll_cq and ibv_req_notify_cq are inline functions of
// verbs.h that call through the context's ops, so they work with whatever
// library made the context (the real one, or the fake of
// tests/fakes/ibverbs). Without cgo the package builds as a stub whose
// entry points return ErrNoLibrary.
//
// The API is a small slice of verbs: device and port enumeration (with GID
// tables and their RoCE types), a protection domain, memory registration
// (host memory, dma-buf, and a bounded RegCache), completion queues with
// completion channels whose events a goroutine waits for in the Go poller,
// and RC queue pairs driven through RESET→INIT→RTR→RTS with SEND, RDMA
// WRITE and WRITE with immediate. Memory handed to Register must not move
// while registered: C memory, or Go memory pinned with runtime.Pinner for
// as long as the registration lives.
package rdma

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultLibrary is the library loaded when NEXAR_IBVERBS is not set.
const DefaultLibrary = "libibverbs.so.1"

// ErrNoLibrary is returned (wrapped) when libibverbs cannot be loaded.
var ErrNoLibrary = errors.New("hw/rdma: libibverbs not loaded")

// ErrNoDevice is returned (wrapped) when the library lists no RDMA device.
var ErrNoDevice = errors.New("hw/rdma: no RDMA device found")

// ErrNoDmaBuf is returned (wrapped) by RegisterDmaBuf when the library has
// no ibv_reg_dmabuf_mr.
var ErrNoDmaBuf = errors.New("hw/rdma: libibverbs has no ibv_reg_dmabuf_mr")

// sysfsDir is where the kernel lists RDMA devices; a variable for tests.
var sysfsDir = "/sys/class/infiniband"

// maxGIDs bounds how much of a port's GID table is read.
const maxGIDs = 256

// Device describes one RDMA device.
type Device struct {
	Name     string // kernel name, e.g. "mlx5_0"
	GUID     uint64 // node GUID in host byte order
	NodeType string // "ca", "switch", "router", "rnic", ...
	Ports    []Port
}

// Port is the state of one port of a Device (ibv_query_port) and its GID
// table.
type Port struct {
	Num       int
	State     string // "active", "down", ...
	LinkLayer string // "infiniband" or "ethernet"
	LID       uint16
	MTU       int // IBV_MTU_* enum value of the active MTU
	ActiveMTU int // bytes
	GIDs      []GID
}

// Active reports whether the port can carry traffic.
func (p Port) Active() bool { return p.State == "active" }

// GIDType is the type of a GID table entry (enum ibv_gid_type).
type GIDType int

// GID types; GIDUnknown when neither the library nor sysfs says.
const (
	GIDUnknown GIDType = -1
	GIDIB      GIDType = 0
	GIDRoCEv1  GIDType = 1
	GIDRoCEv2  GIDType = 2
)

func (t GIDType) String() string {
	switch t {
	case GIDIB:
		return "ib"
	case GIDRoCEv1:
		return "roce v1"
	case GIDRoCEv2:
		return "roce v2"
	}
	return "unknown"
}

// GID is one entry of a port's GID table.
type GID struct {
	Index int
	Raw   [16]byte
	Type  GIDType
}

// IPv4Mapped reports whether the GID is an IPv4-mapped IPv6 address, the
// form RoCE v2 gives the GID of an interface's IPv4 address.
func (g GID) IPv4Mapped() bool {
	for _, b := range g.Raw[:10] {
		if b != 0 {
			return false
		}
	}
	return g.Raw[10] == 0xff && g.Raw[11] == 0xff
}

func (d Device) String() string {
	var ps []string
	for _, p := range d.Ports {
		s := fmt.Sprintf("port %d %s %s", p.Num, p.State, p.LinkLayer)
		if p.LinkLayer == "infiniband" {
			s += fmt.Sprintf(" lid %#x", p.LID)
		} else {
			s += fmt.Sprintf(" %d gids", len(p.GIDs))
		}
		ps = append(ps, s+fmt.Sprintf(" mtu %d", p.ActiveMTU))
	}
	return fmt.Sprintf("%s (guid %016x, %s: %s)", d.Name, d.GUID, d.NodeType, strings.Join(ps, "; "))
}

// sysfsDevices lists device names the kernel exposes, for messages that
// say why libibverbs found none.
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

// sysfsGIDType reads a GID's type from sysfs, for libraries without
// _ibv_query_gid_ex.
func sysfsGIDType(dev string, port, index int, linkLayer string) GIDType {
	if linkLayer == "infiniband" {
		return GIDIB
	}
	b, _ := os.ReadFile(filepath.Join(sysfsDir, dev, "ports", fmt.Sprint(port), "gid_attrs", "types", fmt.Sprint(index)))
	switch strings.TrimSpace(string(b)) {
	case "RoCE v2":
		return GIDRoCEv2
	case "IB/RoCE v1":
		return GIDRoCEv1
	}
	return GIDUnknown
}

var portStates = map[int]string{0: "nop", 1: "down", 2: "init", 3: "armed", 4: "active", 5: "active_defer"}

func portStateName(s int) string {
	if n, ok := portStates[s]; ok {
		return n
	}
	return fmt.Sprintf("state(%d)", s)
}

func nodeTypeName(t int) string {
	switch t {
	case 1:
		return "ca"
	case 2:
		return "switch"
	case 3:
		return "router"
	case 4:
		return "rnic"
	}
	return fmt.Sprintf("node(%d)", t)
}

func mtuBytes(m int) int {
	if m < 1 || m > 5 {
		return 0
	}
	return 128 << m // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5
}

// Available returns nil when the default library loads and lists at least
// one device, and otherwise says why not.
func Available() error {
	_, err := Devices()
	return err
}

// Devices enumerates the devices of the default library (an error wrapping
// ErrNoLibrary or ErrNoDevice when there are none).
func Devices() ([]Device, error) {
	l, err := Default()
	if err != nil {
		return nil, err
	}
	devs, err := l.Devices()
	if err != nil {
		return nil, err
	}
	if len(devs) == 0 {
		why := "the kernel lists none"
		if names, serr := sysfsDevices(); serr == nil {
			why = fmt.Sprintf("%s lists %s, but %s opens none", sysfsDir, strings.Join(names, ", "), l.Path())
		} else {
			why = serr.Error()
		}
		return nil, fmt.Errorf("%w: %s", ErrNoDevice, strings.TrimPrefix(why, ErrNoDevice.Error()+" "))
	}
	return devs, nil
}

// wcStatus names the ibv_wc_status values, as ibv_wc_status_str does.
var wcStatus = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "work request flushed", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error", "remote access error",
	"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error",
}

// StatusString names a work completion status.
func StatusString(s int) string {
	if s >= 0 && s < len(wcStatus) {
		return wcStatus[s]
	}
	return fmt.Sprintf("status %d", s)
}

// WCError is a work completion that failed.
type WCError struct {
	Status int // ibv_wc_status
	Opcode int // ibv_wc_opcode
	WRID   uint64
}

func (e *WCError) Error() string {
	return fmt.Sprintf("hw/rdma: work request %#x failed: %s (status %d)", e.WRID, StatusString(e.Status), e.Status)
}
