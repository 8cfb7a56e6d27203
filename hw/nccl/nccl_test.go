package nccl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/internal/dtype"
)

func TestDTypeMapping(t *testing.T) {
	tests := []struct {
		d    dtype.DType
		want int
	}{
		{dtype.Int8, 0}, {dtype.Uint8, 1}, {dtype.Int32, 2}, {dtype.Uint32, 3},
		{dtype.Int64, 4}, {dtype.Uint64, 5}, {dtype.Float16, 6},
		{dtype.Float32, 7}, {dtype.Float64, 8}, {dtype.BFloat16, 9},
	}
	seen := map[int]bool{}
	for _, tt := range tests {
		got, err := DType(tt.d)
		if err != nil || got != tt.want {
			t.Errorf("DType(%v) = %d, %v; want %d", tt.d, got, err, tt.want)
		}
		seen[got] = true
	}
	if len(seen) != len(tests) {
		t.Error("two nexar types map to the same NCCL type")
	}
	if _, err := DType(dtype.DType(200)); err == nil {
		t.Error("invalid dtype accepted")
	}
}

func TestOpMapping(t *testing.T) {
	tests := []struct {
		o       dtype.Op
		want    int
		wantErr bool
	}{
		{dtype.Sum, 0, false}, {dtype.Prod, 1, false}, {dtype.Max, 2, false},
		{dtype.Min, 3, false}, {dtype.Avg, 4, false},
		{dtype.Band, 0, true}, {dtype.Bor, 0, true}, {dtype.Bxor, 0, true},
		{dtype.Op(99), 0, true},
	}
	for _, tt := range tests {
		got, err := Op(tt.o)
		if (err != nil) != tt.wantErr || (!tt.wantErr && got != tt.want) {
			t.Errorf("Op(%v) = %d, %v; want %d (error %v)", tt.o, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestVersion(t *testing.T) {
	tests := []struct{ code, ma, mi, pa int }{
		{22704, 2, 27, 4}, {2804, 2, 8, 4}, {21003, 2, 10, 3},
	}
	for _, tt := range tests {
		ma, mi, pa := Version(tt.code)
		if ma != tt.ma || mi != tt.mi || pa != tt.pa {
			t.Errorf("Version(%d) = %d.%d.%d", tt.code, ma, mi, pa)
		}
	}
}

// TestLibrary calls into libnccl where it can be loaded: ncclGetVersion
// needs no GPU.
func TestLibrary(t *testing.T) {
	v, err := LibraryVersion()
	if errors.Is(err, ErrNoLibrary) {
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	ma, mi, pa := Version(v)
	if ma < 2 {
		t.Errorf("implausible NCCL version %d.%d.%d (code %d)", ma, mi, pa, v)
	}
	t.Logf("NCCL %d.%d.%d", ma, mi, pa)
	if err := Available(); err != nil {
		t.Logf("NCCL loads but is unavailable: %v", err)
	}
}

// TestAllReduce runs a 1-rank float32 sum on the first GPU (the result
// equals the input) when there is one. Without a GPU it skips.
func TestAllReduce(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("skipping: %v", err)
	}
	id, err := NewUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewComm(id, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const count = 1 << 16
	src := make([]byte, 4*count)
	for i := range count {
		binary.LittleEndian.PutUint32(src[4*i:], math.Float32bits(float32(i)))
	}
	send, err := cuda.Malloc(len(src))
	if err != nil {
		t.Fatal(err)
	}
	defer cuda.Free(send)
	recv, err := cuda.Malloc(len(src))
	if err != nil {
		t.Fatal(err)
	}
	defer cuda.Free(recv)
	if err := cuda.CopyToDevice(send, src); err != nil {
		t.Fatal(err)
	}
	if err := c.AllReduce(send, recv, count, dtype.Float32, dtype.Sum, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(src))
	// cudaMemcpy on the legacy default stream waits for the allreduce.
	if err := cuda.CopyFromDevice(got, recv); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("1-rank allreduce changed the data")
	}
}
