//go:build cgo

package rdma

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/nexar-go/nexar/hw/cuda"
	hw "github.com/nexar-go/nexar/hw/rdma"
)

// gpuPath registers device buffers with the NIC: a dma-buf first, then
// the device address itself (peer memory: only where nvidia-peermem is
// loaded), else a host buffer staged to and from the device. A way that
// the driver, kernel or library cannot do at all is not tried again; one
// that fails for one buffer is tried for the next. Safe for concurrent
// use; a nil *gpuPath knows no device memory.
type gpuPath struct {
	d *Device
	m GPUMemory

	mu      sync.Mutex
	noDma   error // why dma-buf registration cannot work here
	noPeer  error // why peer-memory registration cannot work here
	counts  map[string]int
	lastWay string
}

func newGPUPath(d *Device, m GPUMemory) *gpuPath {
	return &gpuPath{d: d, m: m, counts: map[string]int{}}
}

func (g *gpuPath) isDevice(b []byte) bool {
	return g != nil && len(b) > 0 && g.m.IsDevice(uintptr(unsafe.Pointer(&b[0])))
}

// copyOut copies src into p, which may be device memory.
func (g *gpuPath) copyOut(p, src []byte) (int, error) {
	n := min(len(p), len(src))
	if !g.isDevice(p) {
		return copy(p, src), nil
	}
	if err := g.m.CopyToDevice(uintptr(unsafe.Pointer(&p[0])), src[:n]); err != nil {
		return 0, fmt.Errorf("transport/rdma: copying %d bytes to device memory: %w", n, err)
	}
	return n, nil
}

const gpuAccess = hw.AccessLocalWrite | hw.AccessRemoteWrite | hw.AccessRemoteRead

// register reaches device buffer b; ok is false for host memory.
func (g *gpuPath) register(b []byte, recv bool) (*region, bool, error) {
	if !g.isDevice(b) {
		return nil, false, nil
	}
	a, n := uintptr(unsafe.Pointer(&b[0])), uintptr(len(b))
	g.mu.Lock()
	noDma, noPeer := g.noDma, g.noPeer
	g.mu.Unlock()
	if noDma == nil {
		r, err := g.dmaBuf(a, n)
		if err == nil {
			g.used(WayDmaBuf, a, n, nil)
			return r, true, nil
		}
		g.settle(&g.noDma, err, errors.Is(err, ErrGPUNotSupported) || errors.Is(err, hw.ErrNoDmaBuf) ||
			hw.Errno(err) == syscall.EOPNOTSUPP || hw.Errno(err) == syscall.ENOSYS)
		noDma = err
	}
	if noPeer == nil {
		mr, err := g.d.pd.Register(a, n, gpuAccess)
		if err == nil {
			g.used(WayPeer, a, n, noDma)
			return &region{addr: uint64(a), lkey: mr.LKey, rkey: mr.RKey, finish: func() error { return nil },
				release: func() { mr.Deregister() }}, true, nil
		}
		// Without a peer-memory client the kernel cannot pin device pages
		// for any buffer (EFAULT).
		e := hw.Errno(err)
		g.settle(&g.noPeer, err, e == syscall.EFAULT || e == syscall.EOPNOTSUPP || e == syscall.EINVAL)
		noPeer = err
	}
	host := make([]byte, n)
	if !recv {
		if err := g.m.CopyToHost(host, a); err != nil {
			return nil, true, fmt.Errorf("staging %d bytes of device memory: %w", n, err)
		}
	}
	r, err := g.d.registerHost(host, false)
	if err != nil {
		return nil, true, err
	}
	if recv {
		r.finish = func() error { return g.m.CopyToDevice(a, host) }
	}
	g.used(WayStaged, a, n, errors.Join(noDma, noPeer))
	return r, true, nil
}

// dmaBuf registers [a, a+n) through a dma-buf of its pages.
func (g *gpuPath) dmaBuf(a, n uintptr) (*region, error) {
	page := uintptr(os.Getpagesize())
	lo, hi := a&^(page-1), (a+n+page-1)&^(page-1)
	fd, off, err := g.m.DmaBuf(lo, hi-lo)
	if err != nil {
		return nil, err
	}
	mr, err := g.d.pd.RegisterDmaBuf(fd, off, hi-lo, lo, gpuAccess)
	syscall.Close(fd) // the registration holds the dma-buf
	if err != nil {
		return nil, err
	}
	return &region{addr: uint64(a), lkey: mr.LKey, rkey: mr.RKey, finish: func() error { return nil },
		release: func() { mr.Deregister() }}, nil
}

// settle records that a way cannot work here (final), or logs why it did
// not work for one buffer.
func (g *gpuPath) settle(why *error, err error, final bool) {
	if !final {
		g.d.log.Debug("nexar: rdma: GPU memory registration failed for one buffer", "dev", g.d.desc, "err", err)
		return
	}
	g.mu.Lock()
	first := *why == nil
	*why = err
	g.mu.Unlock()
	if first {
		g.d.log.Debug("nexar: rdma: GPU memory registration way unavailable", "dev", g.d.desc, "err", err)
	}
}

func (g *gpuPath) used(way string, a, n uintptr, skipped error) {
	g.mu.Lock()
	g.counts[way]++
	g.lastWay = way
	g.mu.Unlock()
	g.d.log.Debug("nexar: rdma: device buffer", "dev", g.d.desc, "way", way, "addr", fmt.Sprintf("%#x", a), "bytes", n, "skipped", skipped)
}

// summary says how device buffers reached the NIC so far, e.g.
// "gpu: dma-buf 3, staged 1", or, before the first, how they will:
// "gpu: direct, untried" (GPUDirect RDMA, not ruled out) or "gpu: staged"
// (ruled out); "" without a GPU runtime.
func (g *gpuPath) summary() string {
	if g == nil {
		return ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.counts) == 0 {
		if g.noDma != nil && g.noPeer != nil {
			return "gpu: staged"
		}
		return "gpu: direct, untried"
	}
	var ws []string
	for w, c := range g.counts {
		ws = append(ws, fmt.Sprintf("%s %d", w, c))
	}
	sort.Strings(ws)
	return "gpu: " + strings.Join(ws, ", ")
}

// GPUWays says how device buffers reached the NIC so far (for Paths and
// tests): counts by way, e.g. {"dma-buf": 3}.
func (d *Device) GPUWays() map[string]int {
	out := map[string]int{}
	if d.gpu == nil {
		return out
	}
	d.gpu.mu.Lock()
	defer d.gpu.mu.Unlock()
	for w, c := range d.gpu.counts {
		out[w] = c
	}
	return out
}

// GPU reports whether the channels on d move device memory (Options.GPU
// is set), and whether the NIC may reach it directly: false once dma-buf
// and peer memory both failed for good, after which every device buffer
// would be staged through host memory by the channel. Safe for concurrent
// use.
func (d *Device) GPU() (moves, direct bool) {
	if d.gpu == nil {
		return false, false
	}
	d.gpu.mu.Lock()
	defer d.gpu.mu.Unlock()
	return true, d.gpu.noDma == nil || d.gpu.noPeer == nil
}

// Detail adds to the channel's description how device buffers reached the
// NIC on its device, or will (gpuPath.summary; "" without a GPU runtime):
// what Paths and `nexar bench` show per path.
func (e *End) Detail() string { return e.d.gpu.summary() }

// CUDA adapts a CUDA runtime (hw/cuda) for Options.GPU.
func CUDA(rt *cuda.Runtime) GPUMemory { return cudaMemory{rt} }

type cudaMemory struct{ rt *cuda.Runtime }

func (c cudaMemory) IsDevice(addr uintptr) bool {
	t, _, err := c.rt.PointerType(addr)
	return err == nil && t.OnDevice()
}

func (c cudaMemory) DmaBuf(addr, n uintptr) (int, uint64, error) {
	fd, err := c.rt.DmaBuf(cuda.DevicePtr(addr), int(n))
	if errors.Is(err, cuda.ErrNotSupported) {
		return -1, 0, fmt.Errorf("%w: %w", ErrGPUNotSupported, err)
	}
	return fd, 0, err
}

func (c cudaMemory) CopyToHost(dst []byte, src uintptr) error {
	return c.rt.CopyFromDevice(dst, cuda.DevicePtr(src))
}

func (c cudaMemory) CopyToDevice(dst uintptr, src []byte) error {
	return c.rt.CopyToDevice(cuda.DevicePtr(dst), src)
}
