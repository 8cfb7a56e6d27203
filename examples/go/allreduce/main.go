// Command allreduce is the smallest nexar program: every rank contributes a
// vector and prints the element-wise sum. Start it with the launcher, which
// sets the NEXAR_* variables that core.ConfigFromEnv reads:
//
//	nexar run -n 4 -- ./allreduce
package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/transport/mesh"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "allreduce:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := core.ConfigFromEnv()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	comm, err := core.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer comm.Close()

	// Rank r contributes (r+1) * [1, 2, 3, 4].
	const n = 4
	in := make([]float32, n)
	for i := range in {
		in[i] = float32((comm.Rank() + 1) * (i + 1))
	}
	buf := floatsToBytes(in)
	if err := comm.Allreduce(ctx, nil, buf, collective.Float32, collective.Sum); err != nil {
		return err
	}
	out := bytesToFloats(buf)

	// The sum over ranks of (r+1) is size*(size+1)/2.
	s := comm.Size()
	tri := float32(s * (s + 1) / 2)
	for i, v := range out {
		if want := tri * float32(i+1); v != want {
			return fmt.Errorf("element %d = %v, want %v", i, v, want)
		}
	}
	fmt.Printf("rank %d of %d: allreduce(sum) of %v = %v\n", comm.Rank(), s, in, out)

	// Close (deferred) is local and graceful: a rank that is done may
	// leave while the others still finish, no barrier needed.
	return nil
}

func floatsToBytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, f := range v {
		binary.NativeEndian.PutUint32(b[4*i:], math.Float32bits(f))
	}
	return b
}

func bytesToFloats(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.NativeEndian.Uint32(b[4*i:]))
	}
	return v
}
