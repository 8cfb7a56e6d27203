// Package hw gathers nexar's optional hardware backends and reports which of
// them this process can use.
//
// hw/ is the only place besides capi/ (and the test helpers under
// tests/fakes) that imports "C". Every backend is loaded at run time, so the
// module builds and its tests pass with no GPU, no RDMA NIC and no CUDA
// installed:
//
//   - hw/rdma: libibverbs, loaded at run time with dlopen (compiled against
//     the libibverbs-dev headers);
//   - hw/cuda: the CUDA runtime, loaded at run time with dlopen;
//   - hw/nccl: NCCL, loaded at run time with dlopen.
//
// Probe is what `nexar info` prints. It is safe for concurrent use.
package hw

import (
	"fmt"

	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/cuda/stage"
	"github.com/nexar-go/nexar/hw/nccl"
	"github.com/nexar-go/nexar/hw/rdma"
)

// Status is the availability of one backend.
type Status struct {
	Name   string // "rdma", "cuda", "nccl"
	OK     bool   // usable by this process
	Detail string // what was found when OK, why not otherwise
}

func (s Status) String() string {
	state := "unavailable"
	if s.OK {
		state = "available"
	}
	return fmt.Sprintf("%-5s %s: %s", s.Name, state, s.Detail)
}

// Probe checks every backend once and says, for each, whether it can be
// used and why not. It loads the CUDA and NCCL libraries when present but
// allocates nothing.
func Probe() []Status {
	return []Status{probeRDMA(), probeCUDA(), probeNCCL()}
}

func probeRDMA() Status {
	devs, err := rdma.Devices()
	if err != nil {
		return Status{Name: "rdma", Detail: err.Error()}
	}
	lib, _ := rdma.Default()
	d := fmt.Sprintf("%d device(s) through %s", len(devs), lib.Path())
	for _, dev := range devs {
		d += "; " + dev.String()
	}
	return Status{Name: "rdma", OK: true, Detail: d}
}

func probeCUDA() Status {
	if err := cuda.Available(); err != nil {
		return Status{Name: "cuda", Detail: err.Error() + "; " + stage.Verified}
	}
	n, _ := cuda.DeviceCount()
	path, _ := cuda.LibraryPath()
	return Status{Name: "cuda", OK: true, Detail: fmt.Sprintf("%d device(s), %s; %s", n, path, stage.Verified)}
}

func probeNCCL() Status {
	v, verr := nccl.LibraryVersion()
	if err := nccl.Available(); err != nil {
		if verr == nil {
			ma, mi, pa := nccl.Version(v)
			return Status{Name: "nccl", Detail: fmt.Sprintf("NCCL %d.%d.%d loaded, but %v; %s", ma, mi, pa, err, nccl.Verified)}
		}
		return Status{Name: "nccl", Detail: err.Error() + "; " + nccl.Verified}
	}
	ma, mi, pa := nccl.Version(v)
	path := ""
	if l, err := nccl.Default(); err == nil {
		path = ", " + l.Path()
	}
	return Status{Name: "nccl", OK: true, Detail: fmt.Sprintf("NCCL %d.%d.%d%s; %s", ma, mi, pa, path, nccl.Verified)}
}
