//go:build cgo

package rdma

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/fxamacker/cbor/v2"

	hw "github.com/nexar-go/nexar/hw/rdma"
)

// Device is an opened RDMA device port on which channels are made. Safe
// for concurrent use; Close once every End made on it is closed.
type Device struct {
	opt  Options
	log  *slog.Logger
	lib  *hw.Lib
	ctx  *hw.Context
	pd   *hw.PD
	port hw.Port
	gid  hw.GID // the source GID (RoCE)
	desc string
	reg  *hw.RegCache[*hw.MR] // host memory; lasting as hw.Pages allows
	gpu  *gpuPath             // nil without Options.GPU
	// stage, when set (tests), is called by a receiving end's Read without
	// its lock: "rts" once it took an announced buffer, "cts" once it
	// answered with the buffer's address.
	stage func(string)

	mu    sync.Mutex
	live  map[*End]struct{} // ends not closed yet
	ends  sync.WaitGroup    // ends not torn down yet
	close sync.Once
}

// Open opens the device and port opt names (by default the first active
// port of the first device that has one) and picks its GID.
func Open(opt Options) (*Device, error) {
	opt = withDefaults(opt)
	lib, err := hw.Default()
	if opt.Library != "" {
		lib, err = hw.Open(opt.Library)
	}
	if err != nil {
		return nil, err
	}
	devs, err := lib.Devices()
	if err != nil {
		return nil, err
	}
	name, port, err := pickPort(devs, opt.Device, opt.Port)
	if err != nil {
		return nil, err
	}
	d := &Device{opt: opt, log: opt.Logger, lib: lib, port: port, live: map[*End]struct{}{}}
	if port.LinkLayer == "ethernet" {
		if d.gid, err = pickGID(port, opt.SetGIDIndex, opt.GIDIndex); err != nil {
			return nil, fmt.Errorf("%w (device %s port %d)", err, name, port.Num)
		}
		d.desc = fmt.Sprintf("%s:%d %s", name, port.Num, d.gid.Type)
		if opt.SetGIDIndex {
			d.desc += fmt.Sprintf(" gid %d", d.gid.Index)
		}
	} else {
		d.desc = fmt.Sprintf("%s:%d ib lid %#x", name, port.Num, port.LID)
	}
	if d.ctx, err = lib.OpenDevice(name); err != nil {
		return nil, err
	}
	if d.pd, err = d.ctx.AllocPD(); err != nil {
		d.ctx.Close()
		return nil, err
	}
	// Host registrations last across operations where Pages can vouch
	// for their memory before each reuse, else one operation.
	pages := hw.ProcessPages()
	if err := pages.Usable(); err != nil {
		d.log.Debug("nexar: rdma: registrations last one operation", "dev", d.desc, "why", err)
	}
	if d.reg, err = d.pd.NewRegCache(opt.RegCacheSize, pages); err != nil {
		d.pd.Close()
		d.ctx.Close()
		return nil, err
	}
	if opt.GPU != nil {
		d.gpu = newGPUPath(d, opt.GPU)
	}
	return d, nil
}

// pickPort finds the port: the named device (all of them when "") and port
// (any when 0), the first one active.
func pickPort(devs []hw.Device, dev string, port int) (string, hw.Port, error) {
	var seen []string
	for _, d := range devs {
		if dev != "" && d.Name != dev {
			continue
		}
		for _, p := range d.Ports {
			if port != 0 && p.Num != port {
				continue
			}
			if p.Active() {
				return d.Name, p, nil
			}
			seen = append(seen, fmt.Sprintf("%s:%d %s", d.Name, p.Num, p.State))
		}
	}
	switch {
	case len(seen) > 0:
		return "", hw.Port{}, fmt.Errorf("%w: no active port (%v)", hw.ErrNoDevice, seen)
	case dev != "":
		return "", hw.Port{}, fmt.Errorf("%w: no device %q with port %d", hw.ErrNoDevice, dev, port)
	}
	return "", hw.Port{}, fmt.Errorf("%w: the library lists none", hw.ErrNoDevice)
}

// pickGID chooses the source GID of a RoCE port: index want when it is
// set (NEXAR_IB_GID_INDEX), else the first RoCE v2 GID of an IPv4 address
// (routable, and what the switches of a RoCE fabric are set up for), else
// the first RoCE v2 GID, else the first GID.
func pickGID(p hw.Port, set bool, want int) (hw.GID, error) {
	if len(p.GIDs) == 0 {
		return hw.GID{}, errors.New("transport/rdma: the RoCE port has no GID")
	}
	if set {
		for _, g := range p.GIDs {
			if g.Index == want {
				return g, nil
			}
		}
		return hw.GID{}, fmt.Errorf("transport/rdma: GID index %d is not in the port's table", want)
	}
	for _, g := range p.GIDs {
		if g.Type == hw.GIDRoCEv2 && g.IPv4Mapped() {
			return g, nil
		}
	}
	for _, g := range p.GIDs {
		if g.Type == hw.GIDRoCEv2 {
			return g, nil
		}
	}
	return p.GIDs[0], nil
}

// Describe names the device, port and addressing, e.g.
// "mlx5_0:1 roce v2" or "mlx5_1:1 ib lid 0x11".
func (d *Device) Describe() string { return d.desc }

// Close closes every End made on the device that is still open, waits for
// their teardown (bounded by closeDrain each, in parallel) and releases
// the device.
func (d *Device) Close() error {
	var err error
	d.close.Do(func() {
		d.mu.Lock()
		live := make([]*End, 0, len(d.live))
		for e := range d.live {
			live = append(live, e)
		}
		d.mu.Unlock()
		for _, e := range live {
			e.Close()
		}
		d.ends.Wait()
		err = errors.Join(d.reg.Close(), d.pd.Close(), d.ctx.Close())
	})
	return err
}

// params is what one end tells the other over the QUIC control lane (CBOR;
// docs/wire-format.md).
type params struct {
	V        int    `cbor:"v"`
	QPN      uint32 `cbor:"qpn"`
	PSN      uint32 `cbor:"psn"`
	Link     string `cbor:"link"` // "ib" or "roce"
	LID      uint16 `cbor:"lid,omitempty"`
	GID      []byte `cbor:"gid,omitempty"`   // 16 bytes on RoCE
	MTU      int    `cbor:"mtu"`             // IBV_MTU_* of the port
	Slots    int    `cbor:"slots,omitempty"` // receiving end: receive buffers, the sender's credits
	SlotSize int    `cbor:"slot,omitempty"`  // receiving end: bytes per receive buffer
}

var paramDec, _ = cbor.DecOptions{MaxArrayElements: 16, MaxMapPairs: 16, MaxNestedLevels: 4}.DecMode()

// decodeParams reads and bounds a peer's parameters.
func decodeParams(b []byte, recvEnd bool) (params, error) {
	var p params
	if len(b) > 512 {
		return p, fmt.Errorf("transport/rdma: %d bytes of parameters", len(b))
	}
	if err := paramDec.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("transport/rdma: parameters: %w", err)
	}
	switch {
	case p.V != 1:
		return p, fmt.Errorf("transport/rdma: parameters version %d, want 1", p.V)
	case p.QPN == 0 || p.QPN > 0xffffff:
		return p, fmt.Errorf("transport/rdma: QPN %#x out of range", p.QPN)
	case p.Link != "ib" && p.Link != "roce":
		return p, fmt.Errorf("transport/rdma: link %q", p.Link)
	case p.Link == "roce" && len(p.GID) != 16:
		return p, fmt.Errorf("transport/rdma: RoCE GID of %d bytes", len(p.GID))
	case p.Link == "ib" && p.LID == 0:
		return p, errors.New("transport/rdma: InfiniBand LID 0")
	case p.MTU < 1 || p.MTU > 5:
		return p, fmt.Errorf("transport/rdma: MTU enum %d", p.MTU)
	case recvEnd && (p.Slots < 1 || p.Slots > maxSlots || p.SlotSize < minSlotSize || p.SlotSize > maxSlotSize):
		return p, fmt.Errorf("transport/rdma: %d receive buffers of %d bytes", p.Slots, p.SlotSize)
	}
	return p, nil
}

func (p params) info() hw.QPInfo {
	i := hw.QPInfo{QPN: p.QPN, PSN: p.PSN, LID: p.LID, MTU: p.MTU, RoCE: p.Link == "roce"}
	copy(i.GID[:], p.GID)
	return i
}

func (d *Device) localParams(qpn uint32) params {
	var b [4]byte
	rand.Read(b[:])
	p := params{V: 1, QPN: qpn, PSN: binary.LittleEndian.Uint32(b[:]) & 0xffffff, MTU: d.port.MTU, Link: "ib", LID: d.port.LID}
	if d.port.LinkLayer == "ethernet" {
		p.Link, p.LID, p.GID = "roce", 0, append([]byte(nil), d.gid.Raw[:]...)
	}
	return p
}

var _ Channel = (*End)(nil)

// Listen makes the receiving end of a channel from peer: its queue pair,
// with every receive buffer posted. The parameters go to the peer in the
// offer; Accept completes the end with the peer's answer.
func (d *Device) Listen(peer int) (Channel, []byte, error) {
	e, b, err := d.listen(peer)
	if err != nil {
		return nil, nil, err
	}
	return e, b, nil
}

// Dial makes the sending end of a channel to peer from the parameters the
// peer offered, connected to it; its own parameters go back to the peer.
// Data flows once the peer has accepted (Write waits for its credits).
func (d *Device) Dial(peer int, offer []byte) (Channel, []byte, error) {
	e, b, err := d.dial(peer, offer)
	if err != nil {
		return nil, nil, err
	}
	return e, b, nil
}

func (d *Device) listen(peer int) (*End, []byte, error) {
	e, err := d.newEnd(peer, true, d.opt.Slots, d.opt.SlotSize)
	if err != nil {
		return nil, nil, err
	}
	e.local.Slots, e.local.SlotSize = d.opt.Slots, d.opt.SlotSize
	b, err := cbor.Marshal(e.local)
	if err != nil {
		e.Close()
		return nil, nil, err
	}
	return e, b, nil
}

func (d *Device) dial(peer int, offer []byte) (*End, []byte, error) {
	rp, err := decodeParams(offer, true)
	if err != nil {
		return nil, nil, err
	}
	e, err := d.newEnd(peer, false, rp.Slots, rp.SlotSize)
	if err != nil {
		return nil, nil, err
	}
	if err := e.connect(rp); err != nil {
		e.Close()
		return nil, nil, err
	}
	b, err := cbor.Marshal(e.local)
	if err != nil {
		e.Close()
		return nil, nil, err
	}
	return e, b, nil
}

// Accept connects a receiving end to the sending end's parameters and
// grants it its credits.
func (e *End) Accept(answer []byte) error {
	rp, err := decodeParams(answer, false)
	if err != nil {
		return err
	}
	if err := e.connect(rp); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.toReturn = e.d.opt.Slots
	return e.returnCreditsLocked(true)
}
