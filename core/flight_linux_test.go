package core

import (
	"log/slog"
	"os"
	"runtime"
	"syscall"
	"testing"
	"unsafe"
)

// TestFlightRecorderResident: the recorder's ring is in memory once made,
// every page of it, so that no call faults one in (each 32nd call of the
// first thousand did). The ring is made large, so that the Go heap takes
// it from memory fresh from the OS, which is not resident until written.
func TestFlightRecorderResident(t *testing.T) {
	cfg := testConfig()
	cfg.FlightRecorderSize = 1 << 16
	f := newFlightRecorder(cfg, slog.New(slog.DiscardHandler), 1, 0)
	page := uintptr(os.Getpagesize())
	lo := uintptr(unsafe.Pointer(&f.slots[0])) &^ (page - 1)
	hi := uintptr(unsafe.Pointer(&f.slots[len(f.slots)-1])) + unsafe.Sizeof(f.slots[0])
	n := (hi - lo + page - 1) / page
	vec := make([]byte, n)
	if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, lo, n*page, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal("mincore:", e)
	}
	runtime.KeepAlive(f)
	missing := 0
	for _, v := range vec {
		if v&1 == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of the ring's %d pages not resident after newFlightRecorder", missing, n)
	}
}
