//go:build !cgo

package cuda

import (
	"errors"
	"testing"
)

// TestRuntimeWithoutCgo: without cgo no runtime can be had, and every
// method of the (never made) Runtime fails with ErrNoLibrary, so that code
// built either way sees the same error (make gotest runs this package with
// CGO_ENABLED=0).
func TestRuntimeWithoutCgo(t *testing.T) {
	if rt, err := Default(); rt != nil || !errors.Is(err, ErrNoLibrary) {
		t.Fatalf("Default: %v, %v", rt, err)
	}
	var l *Runtime
	_, e1 := l.DeviceCount()
	_, e2 := l.GetDevice()
	_, e3 := l.Malloc(1)
	_, e4 := l.MallocHost(1)
	_, _, e5 := l.PointerType(0)
	_, e6 := l.StreamCreate()
	_, e7 := l.EventCreate()
	_, e8 := l.EventQuery(0)
	_, e9 := l.DmaBuf(0, 1)
	for i, err := range []error{e1, e2, e3, e4, e5, e6, e7, e8, e9,
		l.SetDevice(0), l.Free(0), l.FreeHost(nil), l.CopyToDevice(0, nil), l.CopyFromDevice(nil, 0),
		l.Memcpy(0, 0, 1), l.MemcpyAsync(0, 0, 1, 0, 0), l.StreamDestroy(0), l.StreamSynchronize(0),
		l.StreamWaitEvent(0, 0), l.EventDestroy(0), l.EventRecord(0, 0)} {
		if !errors.Is(err, ErrNoLibrary) {
			t.Errorf("call %d: %v, want ErrNoLibrary", i, err)
		}
	}
	if l.IsCUDA() || l.Path() != "" || l.Name() != "" {
		t.Error("a runtime without cgo claims a library")
	}
}
