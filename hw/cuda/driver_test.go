//go:build cgo

package cuda

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	fakecuda "github.com/nexar-go/nexar/tests/fakes/cuda"
	"github.com/nexar-go/nexar/tests/fakes/cudart"
)

// TestDriver: the CUDA driver's pointer query (cuPointerGetAttribute of the
// libcuda.so.1 the process has loaded), against the fake driver of
// tests/fakes/cuda: device memory of the fake runtime is Device (device 0),
// at its start and inside it; page-locked and managed memory the driver
// allocated are Host and Managed; memory the driver does not know (the Go
// heap, a PROT_NONE mapping, a freed device address) is Unregistered, with
// no error and no fault; a driver that fails the query (before cuInit) is
// an error wrapping ErrDriver that names the call and the CUresult. In a
// child process, which has no driver loaded before the test loads it.
func TestDriver(t *testing.T) {
	if os.Getenv("NEXAR_TEST_DRIVER_CHILD") != "" {
		driverChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDriver$", "-test.v")
	cmd.Env = append(os.Environ(), "NEXAR_TEST_DRIVER_CHILD=1", "NEXAR_CUDART=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "driver classified") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func driverChild(t *testing.T) {
	if d := LoadedDriver(); d != nil {
		t.Fatal("LoadedDriver before loading one: not nil")
	}
	rtPath, err := cudart.Cached()
	if err != nil {
		t.Fatal(err)
	}
	rt, err := Open(rtPath)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3*4096 + 5
	dev, err := rt.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	if LoadedDriver() != nil {
		t.Fatal("LoadedDriver with only the fake runtime loaded: not nil")
	}

	path, err := fakecuda.Cached()
	if err != nil {
		t.Fatal(err)
	}
	fake, err := fakecuda.Load(path) // RTLD_LOCAL, under a file name of its own
	if err != nil {
		t.Fatal(err)
	}
	d := LoadedDriver()
	if d == nil {
		t.Fatalf("LoadedDriver after loading %s (soname %s): nil", path, fakecuda.Soname)
	}

	// Before cuInit every call fails: an error, not an answer.
	_, _, err = d.PointerType(uintptr(dev))
	if !errors.Is(err, ErrDriver) || !strings.Contains(err.Error(), "cuPointerGetAttribute") || !strings.Contains(err.Error(), "CUresult 3") {
		t.Fatalf("PointerType before cuInit: %v; want ErrDriver naming cuPointerGetAttribute and CUresult 3", err)
	}
	if err := fake.Init(); err != nil {
		t.Fatal(err)
	}
	asked := fake.Queries()

	type want struct {
		typ MemoryType
		dev int
	}
	check := func(what string, p uintptr, w want) {
		t.Helper()
		typ, devno, err := d.PointerType(p)
		if err != nil || typ != w.typ || devno != w.dev {
			t.Fatalf("PointerType(%s %#x) = %v, %d, %v; want %v, %d", what, p, typ, devno, err, w.typ, w.dev)
		}
	}
	check("device memory", uintptr(dev), want{Device, 0})
	check("inside device memory", uintptr(dev)+n-1, want{Device, 0})
	if Readable(uintptr(dev)) {
		t.Fatal("Readable(fake device memory) = true")
	}
	heap := make([]byte, 64)
	check("Go heap", uintptr(unsafe.Pointer(&heap[0])), want{Unregistered, -1})
	pin, err := fake.AllocHost(100)
	if err != nil {
		t.Fatal(err)
	}
	check("cuMemAllocHost memory", pin, want{Host, -1})
	man, err := fake.AllocManaged(100)
	if err != nil {
		t.Fatal(err)
	}
	check("managed memory", man, want{Managed, -1})
	m, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	check("PROT_NONE memory", uintptr(unsafe.Pointer(&m[0])), want{Unregistered, -1})
	check("address 8", 8, want{Unregistered, -1})
	if err := fake.FreeHost(pin); err != nil {
		t.Fatal(err)
	}
	check("freed cuMemAllocHost memory", pin, want{Unregistered, -1})
	if err := fake.FreeManaged(man); err != nil {
		t.Fatal(err)
	}
	if err := rt.Free(dev); err != nil {
		t.Fatal(err)
	}
	check("freed device memory", uintptr(dev), want{Unregistered, -1})
	if fake.Queries() == asked {
		t.Fatal("the driver's cuPointerGetAttribute was never called")
	}
	t.Logf("driver classified device, host, managed and unknown memory (%d queries)", fake.Queries()-asked)
}
