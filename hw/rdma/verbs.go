//go:build cgo

package rdma

/*
#cgo LDFLAGS: -ldl
#include "nx_verbs.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"unsafe"
)

// Lib is one loaded libibverbs (or a stand-in with the same entry points).
// Safe for concurrent use.
type Lib struct {
	path string
	f    *C.nx_ibv // C memory: cgo calls take it without copying
}

var (
	loadOnce sync.Once
	deflib   *Lib
	loadErr  error
)

// Default returns the process-wide library, libibverbs.so.1, loaded once.
// A library the configuration names (NEXAR_IBVERBS, core.Config.RDMA) is
// loaded with Open (transport/rdma.Options.Library).
func Default() (*Lib, error) {
	loadOnce.Do(func() {
		deflib, loadErr = Open(DefaultLibrary)
	})
	return deflib, loadErr
}

// Open loads the library at path (a file name, looked up on the dynamic
// linker's path, or a path). Opening it twice gives the same library; a
// Lib holds it for the life of the process.
func Open(path string) (*Lib, error) {
	cp := C.CString(path)
	h := C.nx_open(cp)
	C.free(unsafe.Pointer(cp))
	if h == nil {
		return nil, fmt.Errorf("%w: %s: %s (install libibverbs1, or set NEXAR_IBVERBS to its path)", ErrNoLibrary, path, dlerror())
	}
	f := (*C.nx_ibv)(C.calloc(1, C.size_t(unsafe.Sizeof(C.nx_ibv{}))))
	if missing := C.nx_bind(h, f); missing != nil {
		C.free(unsafe.Pointer(f))
		return nil, fmt.Errorf("%w: %s lacks %s", ErrNoLibrary, path, C.GoString(missing))
	}
	return &Lib{path: path, f: f}, nil
}

func dlerror() string {
	if e := C.dlerror(); e != nil {
		return C.GoString(e)
	}
	return "unknown dlopen error"
}

// Path is the name the library was loaded under.
func (l *Lib) Path() string { return l.path }

// DmaBuf reports whether the library has ibv_reg_dmabuf_mr (rdma-core 34+).
func (l *Lib) DmaBuf() bool { return l.f.reg_dmabuf_mr != nil }

func errnoErr(what string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return fmt.Errorf("hw/rdma: %s: %w", what, syscall.Errno(rc))
}

// deviceList wraps ibv_get_device_list; ENOSYS means the kernel has no
// RDMA support at all, which is "no device", not a failure.
func (l *Lib) deviceList() ([]*C.struct_ibv_device, func(), error) {
	var n, e C.int
	list := C.nx_devices(l.f, &n, &e)
	if list == nil {
		if syscall.Errno(e) == syscall.ENOSYS {
			return nil, nil, fmt.Errorf("%w (ibv_get_device_list: %v)", ErrNoDevice, syscall.Errno(e))
		}
		return nil, nil, errnoErr("ibv_get_device_list", e)
	}
	free := func() { C.nx_ibv_free_list(l.f, list) }
	return unsafe.Slice(list, int(n)), free, nil
}

// Devices enumerates the devices, their ports and GID tables.
func (l *Lib) Devices() ([]Device, error) {
	devs, free, err := l.deviceList()
	if err != nil {
		return nil, err
	}
	defer free()
	out := make([]Device, 0, len(devs))
	for _, dev := range devs {
		d := Device{
			Name:     C.GoString(C.nx_ibv_device_name(l.f, dev)),
			GUID:     uint64(C.nx_guid(l.f, dev)),
			NodeType: nodeTypeName(int(dev.node_type)),
		}
		var e C.int
		ctx := C.nx_open_device(l.f, dev, &e)
		if ctx == nil {
			return nil, errnoErr("ibv_open_device "+d.Name, e)
		}
		c := &Context{lib: l, ctx: ctx, Name: d.Name}
		d.Ports, err = c.Ports()
		c.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// OpenDevice opens the device named name ("" for the first one).
func (l *Lib) OpenDevice(name string) (*Context, error) {
	devs, free, err := l.deviceList()
	if err != nil {
		return nil, err
	}
	defer free()
	for _, dev := range devs {
		dn := C.GoString(C.nx_ibv_device_name(l.f, dev))
		if name != "" && dn != name {
			continue
		}
		var e C.int
		ctx := C.nx_open_device(l.f, dev, &e)
		if ctx == nil {
			return nil, errnoErr("ibv_open_device "+dn, e)
		}
		return &Context{lib: l, ctx: ctx, Name: dn}, nil
	}
	if name == "" {
		return nil, fmt.Errorf("%w (%s lists none)", ErrNoDevice, l.path)
	}
	return nil, fmt.Errorf("%w (no device named %q)", ErrNoDevice, name)
}

// Context is an open device. Its methods are safe for concurrent use (verbs
// contexts are thread-safe); Close must not race with other calls.
type Context struct {
	lib  *Lib
	ctx  *C.struct_ibv_context
	Name string
}

// Lib is the library the context came from.
func (c *Context) Lib() *Lib { return c.lib }

// Close closes the device.
func (c *Context) Close() error {
	return errnoErr("ibv_close_device", C.nx_ibv_close_device(c.lib.f, c.ctx))
}

// Ports queries every port of the device.
func (c *Context) Ports() ([]Port, error) {
	var n C.int
	if rc := C.nx_phys_ports(c.lib.f, c.ctx, &n); rc != 0 {
		return nil, errnoErr("ibv_query_device "+c.Name, rc)
	}
	ports := make([]Port, 0, int(n))
	for p := 1; p <= int(n); p++ {
		pt, err := c.Port(p)
		if err != nil {
			return nil, err
		}
		ports = append(ports, pt)
	}
	return ports, nil
}

// Port queries port num and its GID table.
func (c *Context) Port(num int) (Port, error) {
	var pa C.struct_ibv_port_attr
	if rc := C.nx_query_port(c.lib.f, c.ctx, C.uint8_t(num), &pa); rc != 0 {
		return Port{}, errnoErr(fmt.Sprintf("ibv_query_port %s:%d", c.Name, num), rc)
	}
	pt := Port{
		Num: num, State: portStateName(int(pa.state)), LinkLayer: "infiniband",
		LID: uint16(pa.lid), MTU: int(pa.active_mtu), ActiveMTU: mtuBytes(int(pa.active_mtu)),
	}
	if pa.link_layer == C.IBV_LINK_LAYER_ETHERNET {
		pt.LinkLayer = "ethernet"
	}
	for i := 0; i < int(pa.gid_tbl_len) && i < maxGIDs; i++ {
		var g GID
		var typ C.int
		if rc := C.nx_gid(c.lib.f, c.ctx, C.uint8_t(num), C.int(i), (*C.uint8_t)(&g.Raw[0]), &typ); rc != 0 {
			continue // an unpopulated entry (RoCE tables have holes)
		}
		if g.Raw == ([16]byte{}) {
			continue
		}
		g.Index = i
		g.Type = GIDType(typ)
		if typ < 0 {
			g.Type = sysfsGIDType(c.Name, num, i, pt.LinkLayer)
		}
		pt.GIDs = append(pt.GIDs, g)
	}
	return pt, nil
}

// PD is a protection domain.
type PD struct {
	c  *Context
	pd *C.struct_ibv_pd
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	var e C.int
	pd := C.nx_alloc_pd(c.lib.f, c.ctx, &e)
	if pd == nil {
		return nil, errnoErr("ibv_alloc_pd", e)
	}
	return &PD{c: c, pd: pd}, nil
}

// Close deallocates the protection domain.
func (p *PD) Close() error {
	return errnoErr("ibv_dealloc_pd", C.nx_ibv_dealloc_pd(p.c.lib.f, p.pd))
}

// Access flags for Register and QP.Init.
const (
	AccessLocalWrite  = int(C.IBV_ACCESS_LOCAL_WRITE)
	AccessRemoteWrite = int(C.IBV_ACCESS_REMOTE_WRITE)
	AccessRemoteRead  = int(C.IBV_ACCESS_REMOTE_READ)
)

// MR is a registered memory region: Addr is the address work requests
// name it by (for a dma-buf region, the iova it was registered at).
type MR struct {
	p    *PD
	mr   *C.struct_ibv_mr
	Addr uintptr
	Len  uintptr
	LKey uint32
	RKey uint32
}

// Register registers [addr, addr+n). The memory must stay mapped and must
// not move until Deregister: C memory, or Go memory pinned by the caller.
// Device memory registers only where a peer-memory client (nvidia-peermem)
// is loaded; elsewhere this fails (EFAULT).
func (p *PD) Register(addr, n uintptr, access int) (*MR, error) {
	var e C.int
	mr := C.nx_reg_mr(p.c.lib.f, p.pd, C.uintptr_t(addr), C.size_t(n), C.int(access), &e)
	if mr == nil {
		return nil, errnoErr(fmt.Sprintf("ibv_reg_mr(%#x, %d)", addr, n), e)
	}
	return &MR{p: p, mr: mr, Addr: addr, Len: n, LKey: uint32(mr.lkey), RKey: uint32(mr.rkey)}, nil
}

// RegisterDmaBuf registers n bytes at offset of the dma-buf fd (exported by
// a GPU driver), addressed in work requests as [iova, iova+n). The fd may be
// closed once this returns. ErrNoDmaBuf when the library lacks the call.
func (p *PD) RegisterDmaBuf(fd int, offset uint64, n uintptr, iova uintptr, access int) (*MR, error) {
	var e C.int
	mr := C.nx_reg_dmabuf(p.c.lib.f, p.pd, C.uint64_t(offset), C.size_t(n), C.uint64_t(iova), C.int(fd), C.int(access), &e)
	if mr == nil {
		if !p.c.lib.DmaBuf() {
			return nil, fmt.Errorf("%w (%s)", ErrNoDmaBuf, p.c.lib.path)
		}
		return nil, errnoErr(fmt.Sprintf("ibv_reg_dmabuf_mr(fd %d, offset %d, %d bytes)", fd, offset, n), e)
	}
	return &MR{p: p, mr: mr, Addr: iova, Len: n, LKey: uint32(mr.lkey), RKey: uint32(mr.rkey)}, nil
}

// Deregister releases the registration.
func (m *MR) Deregister() error {
	return errnoErr("ibv_dereg_mr", C.nx_ibv_dereg_mr(m.p.c.lib.f, m.mr))
}

// NewRegCache returns a registration cache of at most size regions in p,
// registered with local write and remote read/write access, which outlive
// their uses as l allows (nil: every one until evicted or invalidated).
func (p *PD) NewRegCache(size int, l Lasting) (*RegCache[*MR], error) {
	reg := func(addr, n uintptr) (*MR, error) {
		return p.Register(addr, n, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
	}
	if l == nil {
		return NewRegCache(size, reg, (*MR).Deregister)
	}
	return NewLastingRegCache(size, reg, (*MR).Deregister, l)
}

// Contains reports whether [addr, addr+n) lies in the region.
func (m *MR) Contains(addr, n uintptr) bool {
	return addr >= m.Addr && n <= m.Len && addr-m.Addr <= m.Len-n
}

// Errno extracts the errno of a verbs error, 0 if there is none.
func Errno(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}
