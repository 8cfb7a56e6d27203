package rdma

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestDevices(t *testing.T) {
	if err := Available(); err != nil {
		if !errors.Is(err, ErrUnavailable) && !errors.Is(err, ErrNoDevice) {
			t.Fatalf("Available: unexpected error %v", err)
		}
		t.Skipf("skipping: %v", err)
	}
	devs, err := Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) == 0 {
		t.Fatal("Available succeeded but Devices found none")
	}
	for _, d := range devs {
		if d.Name == "" || len(d.Ports) == 0 {
			t.Errorf("incomplete device %+v", d)
		}
		t.Logf("%v ports %+v", d, d.Ports)
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
}
