//go:build cgo

package hier

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/nexar-go/nexar/hw/cuda"
	fakecuda "github.com/nexar-go/nexar/tests/fakes/cuda"
	"github.com/nexar-go/nexar/tests/fakes/cudart"
)

// TestNoRuntimeDriver: where no CUDA runtime was found but the CUDA driver
// is loaded, buffers are classified by the driver (noRuntime, what Probe
// installs then), here the fake driver of tests/fakes/cuda over the fake
// runtime's memory: device memory is an *UnknownPointerError saying the
// driver calls it device memory (device 0), the driver's page-locked and
// managed memory and the Go heap are host memory, memory nobody knows is
// the generic *UnknownPointerError, and a driver that fails the query
// (before cuInit) is an error naming it. No fault. In a child process, so
// that no other test of this binary sees a driver loaded.
func TestNoRuntimeDriver(t *testing.T) {
	if os.Getenv("NEXAR_TEST_NORUNTIME_DRIVER") != "" {
		noRuntimeDriverChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoRuntimeDriver$", "-test.v")
	cmd.Env = append(os.Environ(), "NEXAR_TEST_NORUNTIME_DRIVER=1", "NEXAR_CUDART=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "classified through the driver") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func noRuntimeDriverChild(t *testing.T) {
	rtPath, err := cudart.Cached()
	if err != nil {
		t.Fatal(err)
	}
	rt, err := cuda.Open(rtPath) // only to allocate the device memory
	if err != nil {
		t.Fatal(err)
	}
	dev, err := rt.Malloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	path, err := fakecuda.Cached()
	if err != nil {
		t.Fatal(err)
	}
	fake, err := fakecuda.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	drv := cuda.LoadedDriver()
	if drv == nil {
		t.Fatal("LoadedDriver: nil after loading the fake driver")
	}
	k := NewKinds(noRuntime{drv: drv})

	// Before cuInit the driver fails the query: an error, not an answer
	// (and nothing remembered).
	if _, err := k.Of(uintptr(dev)); !errors.Is(err, cuda.ErrDriver) || !strings.Contains(err.Error(), "CUresult 3") {
		t.Fatalf("Of(device) before cuInit: %v; want the driver's error", err)
	}
	if err := fake.Init(); err != nil {
		t.Fatal(err)
	}

	var u *UnknownPointerError
	_, err = k.Of(uintptr(dev))
	if !errors.As(err, &u) || !u.Driver || u.Device != 0 || !strings.Contains(err.Error(), "says the CUDA driver") ||
		!strings.Contains(err.Error(), "NEXAR_CUDART") {
		t.Fatalf("Of(device memory) = %v; want an UnknownPointerError from the driver, device 0", err)
	}
	pin, err := fake.AllocHost(64)
	if err != nil {
		t.Fatal(err)
	}
	man, err := fake.AllocManaged(64)
	if err != nil {
		t.Fatal(err)
	}
	heap := make([]byte, 64)
	for what, p := range map[string]uintptr{"cuMemAllocHost": pin, "managed": man, "Go heap": uintptr(unsafe.Pointer(&heap[0]))} {
		if pl, err := k.Of(p); err != nil || pl != Host {
			t.Fatalf("Of(%s memory) = %+v, %v; want host", what, pl, err)
		}
	}
	m, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	u = nil
	if _, err := k.Of(uintptr(unsafe.Pointer(&m[0]))); !errors.As(err, &u) || u.Driver {
		t.Fatalf("Of(PROT_NONE memory) = %v; want the generic UnknownPointerError", err)
	}
	t.Logf("device, host, managed and unknown memory classified through the driver")
}
