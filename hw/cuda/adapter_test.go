//go:build cgo

package cuda

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/nexar-go/nexar/tests/fakes/cudart"
	"github.com/nexar-go/nexar/tests/fakes/hip"
)

// TestAdapterHIP drives a second runtime (the fake HIP of tests/fakes/hip)
// through its adapter table: every entry a Runtime has, and the errors
// named after the adapter's entries.
func TestAdapterHIP(t *testing.T) {
	path, err := hip.Cached()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NEXAR_FAKE_HIP_DELAY_US", "500")
	rt, err := LoadAdapter(path, hip.Fill)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Name() != "hip" || rt.IsCUDA() {
		t.Fatalf("Name %q IsCUDA %v, want hip, false", rt.Name(), rt.IsCUDA())
	}
	if n, err := rt.DeviceCount(); err != nil || n != 1 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	const n = 1<<16 + 3
	p, err := rt.Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Free(p)
	if typ, dev, err := rt.PointerType(uintptr(p)); err != nil || typ != Device || dev != 0 {
		t.Fatalf("PointerType(device) = %v, %d, %v", typ, dev, err)
	}
	host := make([]byte, 8)
	if typ, _, err := rt.PointerType(uintptr(unsafe.Pointer(&host[0]))); err != nil || typ != Unregistered {
		t.Fatalf("PointerType(Go heap) = %v, %v; want unregistered (the adapter's translation of hipErrorInvalidValue)", typ, err)
	}
	if Readable(uintptr(p)) {
		t.Fatal("Readable(fake HIP device memory) = true: the host would fault on it")
	}
	src := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, n/7+1)[:n]
	if err := rt.CopyToDevice(p, src); err != nil {
		t.Fatal(err)
	}
	// Stream order: a pinned buffer filled by an async copy after an event
	// wait; the event is not complete before the copy's delay has passed.
	pin, err := rt.MallocHost(n)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.FreeHost(pin)
	if typ, _, _ := rt.PointerType(uintptr(unsafe.Pointer(&pin[0]))); typ != Host {
		t.Fatalf("PointerType(pinned) = %v, want host", typ)
	}
	s, err := rt.StreamCreate()
	if err != nil {
		t.Fatal(err)
	}
	defer rt.StreamDestroy(s)
	ev, err := rt.EventCreate()
	if err != nil {
		t.Fatal(err)
	}
	defer rt.EventDestroy(ev)
	if err := rt.MemcpyAsync(uintptr(unsafe.Pointer(&pin[0])), uintptr(p), n, MemcpyDeviceToHost, s); err != nil {
		t.Fatal(err)
	}
	if err := rt.EventRecord(ev, s); err != nil {
		t.Fatal(err)
	}
	if done, err := rt.EventQuery(ev); err != nil || done {
		t.Fatalf("EventQuery right after a delayed copy = %v, %v; want not done", done, err)
	}
	if err := rt.StreamSynchronize(s); err != nil {
		t.Fatal(err)
	}
	if done, err := rt.EventQuery(ev); err != nil || !done {
		t.Fatalf("EventQuery after synchronize = %v, %v", done, err)
	}
	if !bytes.Equal(pin, src) {
		t.Fatal("async copy through the adapter changed the data")
	}
	if _, err := rt.DmaBuf(p, 4096); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("DmaBuf without dmabuf_export = %v, want ErrNotSupported", err)
	}
	err = rt.Free(p + 1) // not an allocation
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(err.Error(), "device_free") || !strings.Contains(err.Error(), "hip error 1") {
		t.Fatalf("Free(bad) = %v, want an error naming the adapter's entry and code", err)
	}
}

// TestFindLoaded: a CUDA runtime the program loaded itself under a name
// libnexar does not probe (torch's libcudart-<hash>.so, a renamed one) is
// found among the loaded objects. In a child process, which has no CUDA
// runtime before it loads the fake.
func TestFindLoaded(t *testing.T) {
	if p := os.Getenv("NEXAR_TEST_FIND_LOADED"); p != "" {
		findLoadedChild(t, p)
		return
	}
	built, err := cudart.Cached()
	if err != nil {
		t.Fatal(err)
	}
	renamed := filepath.Join(t.TempDir(), "libcudart-a1b2c3d4.so.12")
	copyFile(t, built, renamed)
	cmd := exec.Command(os.Args[0], "-test.run=^TestFindLoaded$", "-test.v")
	cmd.Env = append(os.Environ(), "NEXAR_TEST_FIND_LOADED="+renamed, "NEXAR_CUDART=")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "found "+renamed) {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func findLoadedChild(t *testing.T, path string) {
	if rt, err := FindLoaded(); rt != nil || err != nil {
		t.Fatalf("before loading: FindLoaded = %v, %v; want none", rt, err)
	}
	if rt, err := InProcess(""); rt != nil || err != nil {
		t.Fatalf("before loading: InProcess = %v, %v; want none", rt, err)
	}
	if _, err := Open(path); err != nil { // the program's own dlopen, RTLD_LOCAL
		t.Fatal(err)
	}
	rt, err := InProcess("")
	if err != nil || rt == nil {
		t.Fatalf("InProcess after the program loaded %s = %v, %v", path, rt, err)
	}
	if rt.Path() != path || !rt.IsCUDA() {
		t.Fatalf("found %q (cuda %v), want %q", rt.Path(), rt.IsCUDA(), path)
	}
	p, err := rt.Malloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if typ, _, err := rt.PointerType(uintptr(p)); err != nil || typ != Device {
		t.Fatalf("PointerType = %v, %v", typ, err)
	}
	t.Logf("found %s", rt.Path())
}

func copyFile(t *testing.T, from, to string) {
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReadable: the probe tells readable host memory from memory a read
// would fault on, without faulting.
func TestReadable(t *testing.T) {
	b := make([]byte, 16)
	if !Readable(uintptr(unsafe.Pointer(&b[0]))) {
		t.Fatal("Go heap memory reported unreadable")
	}
	m, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	if Readable(uintptr(unsafe.Pointer(&m[0]))) {
		t.Fatal("PROT_NONE memory reported readable")
	}
	if Readable(8) {
		t.Fatal("address 8 reported readable")
	}
}
