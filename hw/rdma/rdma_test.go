package rdma

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestDefaultLibrary loads libibverbs the way nexar does by default, on a
// machine that may have no RDMA hardware: the binding must load it (the
// project's setup installs it) and either list devices or say there are
// none.
func TestDefaultLibrary(t *testing.T) {
	if os.Getenv("NEXAR_IBVERBS") != "" {
		t.Skip("skipping: NEXAR_IBVERBS is set; this test is about the default library")
	}
	devs, err := Devices()
	switch {
	case errors.Is(err, ErrNoLibrary):
		t.Skipf("skipping: %v", err)
	case errors.Is(err, ErrNoDevice):
		t.Skipf("skipping: libibverbs loaded and reports: %v", err)
	case err != nil:
		t.Fatalf("Devices: %v", err)
	}
	for _, d := range devs {
		if d.Name == "" || len(d.Ports) == 0 {
			t.Errorf("incomplete device %+v", d)
		}
		t.Log(d)
	}
}

func TestSysfsDevices(t *testing.T) {
	old := sysfsDir
	t.Cleanup(func() { sysfsDir = old })
	dir := t.TempDir()
	tests := []struct {
		name    string
		dir     string
		mk      []string
		want    int
		wantErr error
	}{
		{"missing", filepath.Join(dir, "nope"), nil, 0, ErrNoDevice},
		{"empty", filepath.Join(dir, "empty"), nil, 0, ErrNoDevice},
		{"two", filepath.Join(dir, "two"), []string{"mlx5_0", "rxe0"}, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name != "missing" {
				if err := os.MkdirAll(tt.dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, m := range tt.mk {
				if err := os.Mkdir(filepath.Join(tt.dir, m), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			sysfsDir = tt.dir
			names, err := sysfsDevices()
			if !errors.Is(err, tt.wantErr) || len(names) != tt.want {
				t.Fatalf("got %v, %v; want %d names, err %v", names, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestHelpers(t *testing.T) {
	if got := mtuBytes(5); got != 4096 {
		t.Errorf("mtuBytes(5) = %d", got)
	}
	if got := mtuBytes(1); got != 256 {
		t.Errorf("mtuBytes(1) = %d", got)
	}
	if got := portStateName(4); got != "active" {
		t.Errorf("portStateName(4) = %q", got)
	}
	g := GID{Raw: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 1}}
	if !g.IPv4Mapped() {
		t.Errorf("%x is IPv4-mapped", g.Raw)
	}
	g.Raw[0] = 0xfe
	if g.IPv4Mapped() {
		t.Errorf("%x is not IPv4-mapped", g.Raw)
	}
	if s := StatusString(10); s != "remote access error" { // IBV_WC_REM_ACCESS_ERR
		t.Errorf("StatusString(REM_ACCESS_ERR) = %q", s)
	}
}
