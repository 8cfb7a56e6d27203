package cuda

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"
)

func TestMemoryType(t *testing.T) {
	tests := []struct {
		m        MemoryType
		name     string
		onDevice bool
	}{
		{Unregistered, "unregistered", false},
		{Host, "host", false},
		{Device, "device", true},
		{Managed, "managed", false},
		{MemoryType(9), "memorytype(9)", false},
	}
	for _, tt := range tests {
		if got := tt.m.String(); got != tt.name {
			t.Errorf("String(%d) = %q, want %q", int(tt.m), got, tt.name)
		}
		if got := tt.m.OnDevice(); got != tt.onDevice {
			t.Errorf("%v.OnDevice() = %v", tt.m, got)
		}
	}
}

// TestAvailable checks that the reason for unavailability is one of the two
// documented ones; the test never fails just because there is no GPU.
func TestAvailable(t *testing.T) {
	err := Available()
	switch {
	case err == nil:
		n, _ := DeviceCount()
		t.Logf("CUDA available: %d devices", n)
	case errors.Is(err, ErrNoLibrary), errors.Is(err, ErrNoDevice):
		t.Logf("unavailable, as expected without a GPU: %v", err)
	default:
		t.Fatalf("Available: undocumented error %v", err)
	}
}

func TestHostPointerIsNotDevice(t *testing.T) {
	if _, err := LibraryPath(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	buf := make([]byte, 64)
	if IsDevicePointer(uintptr(unsafe.Pointer(&buf[0]))) {
		t.Error("Go heap memory reported as a device pointer")
	}
}

func TestDeviceRoundTrip(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	const n = 1 << 20
	p, err := Malloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer Free(p)
	if typ, _, err := PointerType(uintptr(p)); err != nil || typ != Device {
		t.Fatalf("PointerType(cudaMalloc'd) = %v, %v; want device", typ, err)
	}
	src := bytes.Repeat([]byte{1, 2, 3, 4, 5, 6, 7}, n/7+1)[:n]
	dst := make([]byte, n)
	if err := CopyToDevice(p, src); err != nil {
		t.Fatal(err)
	}
	if err := CopyFromDevice(dst, p); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("device round trip changed the data")
	}
}
