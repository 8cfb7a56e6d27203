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

// Libraries names the libraries a configuration chose (core.Config:
// NEXAR_IBVERBS, NEXAR_CUDART, NEXAR_NCCL); "" takes each package's default.
type Libraries struct {
	IBVerbs, CUDA, NCCL string
}

// Probe checks every backend once, loading the libraries libs names (or
// the defaults), and says, for each, whether it can be used and why not.
// It loads the CUDA and NCCL libraries when present but allocates nothing.
func Probe(libs Libraries) []Status {
	rt, rterr := cudaRuntime(libs.CUDA)
	return []Status{probeRDMA(libs.IBVerbs), probeCUDA(rt, rterr), probeNCCL(libs.NCCL, rt, rterr)}
}

func probeRDMA(path string) Status {
	lib, err := rdma.Default()
	if path != "" {
		lib, err = rdma.Open(path)
	}
	if err != nil {
		return Status{Name: "rdma", Detail: err.Error()}
	}
	devs, err := lib.Devices()
	if err == nil && len(devs) == 0 {
		err = fmt.Errorf("hw/rdma: %s lists no RDMA device", lib.Path())
	}
	if err != nil {
		return Status{Name: "rdma", Detail: err.Error()}
	}
	d := fmt.Sprintf("%d device(s) through %s", len(devs), lib.Path())
	for _, dev := range devs {
		d += "; " + dev.String()
	}
	return Status{Name: "rdma", OK: true, Detail: d}
}

func cudaRuntime(path string) (*cuda.Runtime, error) {
	if path != "" {
		return cuda.Open(path)
	}
	return cuda.Default()
}

// cudaDevices is the number of devices rt sees, or why none is usable.
func cudaDevices(rt *cuda.Runtime, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	n, err := rt.DeviceCount()
	if err == nil && n == 0 {
		err = fmt.Errorf("%w (cudaGetDeviceCount returned 0)", cuda.ErrNoDevice)
	}
	return n, err
}

func probeCUDA(rt *cuda.Runtime, rterr error) Status {
	n, err := cudaDevices(rt, rterr)
	if err != nil {
		return Status{Name: "cuda", Detail: err.Error() + "; " + stage.Verified}
	}
	return Status{Name: "cuda", OK: true, Detail: fmt.Sprintf("%d device(s), %s; %s", n, rt.Path(), stage.Verified)}
}

func probeNCCL(path string, rt *cuda.Runtime, rterr error) Status {
	l, err := nccl.Default()
	if path != "" {
		l, err = nccl.Open(path)
	}
	if err != nil {
		return Status{Name: "nccl", Detail: err.Error() + "; " + nccl.Verified}
	}
	v, verr := l.Version()
	if _, err := cudaDevices(rt, rterr); err != nil {
		if verr == nil {
			ma, mi, pa := nccl.Version(v)
			return Status{Name: "nccl", Detail: fmt.Sprintf("NCCL %d.%d.%d loaded, but hw/nccl: %v; %s", ma, mi, pa, err, nccl.Verified)}
		}
		return Status{Name: "nccl", Detail: err.Error() + "; " + nccl.Verified}
	}
	ma, mi, pa := nccl.Version(v)
	return Status{Name: "nccl", OK: true, Detail: fmt.Sprintf("NCCL %d.%d.%d, %s; %s", ma, mi, pa, l.Path(), nccl.Verified)}
}
