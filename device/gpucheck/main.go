// Command gpucheck runs the device checks of scripts/gpu_check.sh as
// processes of one machine (itself again, one per rank), against whatever
// CUDA runtime and NCCL NEXAR_CUDART and NEXAR_NCCL name: a GPU's, or the
// fakes of tests/fakes for the script's dry run. Each part writes its
// figures as JSON to -out and exits non-zero when a check failed.
//
//	gpucheck matrix    -mode staged|hier  device allreduce of every dtype and
//	                                     op, blocking and on a stream, against
//	                                     nexar's host allreduce of the same input
//	gpucheck collectives                 broadcast, allgather, reduce-scatter,
//	                                     send/recv of device memory, NCCL within
//	                                     a host and nexar between 2 simulated hosts
//	gpucheck bandwidth                   allreduce bus bandwidth: nexar staged
//	                                     device, nexar through NCCL between 2
//	                                     simulated hosts, host memory, and NCCL's
//	                                     own allreduce, in the same run
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nexar-go/nexar/collective"
	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/device"
	"github.com/nexar-go/nexar/hw/cuda"
	"github.com/nexar-go/nexar/hw/nccl"
	"github.com/nexar-go/nexar/transport/mesh"
)

type options struct {
	part    string
	mode    string
	out     string
	hosts   []string
	sizes   []int
	iters   int
	counts  []int
	timeout time.Duration
	rank    int // >= 0: this process is that rank (launch starts them), else the launcher
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gpucheck matrix|collectives|bandwidth [flags]")
		os.Exit(2)
	}
	o := options{part: os.Args[1]}
	fs := flag.NewFlagSet(o.part, flag.ExitOnError)
	fs.StringVar(&o.mode, "mode", "staged", "matrix: staged (NEXAR_NCCL_HIER=off) or hier (NCCL within a host, 2 simulated hosts)")
	fs.StringVar(&o.out, "out", "", "JSON file for the figures")
	sizes := fs.String("sizes", "1048576,16777216,67108864", "bandwidth: message sizes in bytes")
	counts := fs.String("counts", "7,65537", "matrix, collectives: element counts")
	fs.IntVar(&o.iters, "iters", 9, "bandwidth: timed iterations per size")
	fs.DurationVar(&o.timeout, "timeout", 4*time.Minute, "the whole part's deadline")
	fs.IntVar(&o.rank, "rank", -1, "(set by the launcher) run as this rank")
	fs.Parse(os.Args[2:])
	var err error
	if o.sizes, err = ints(*sizes); err == nil {
		o.counts, err = ints(*counts)
	}
	if err != nil {
		fatalf("%v", err)
	}
	switch o.part {
	case "matrix", "collectives", "bandwidth":
	default:
		fatalf("unknown part %q (matrix, collectives, bandwidth)", o.part)
	}
	if o.rank >= 0 {
		if err := runRank(o); err != nil {
			fatalf("rank %d: %v", o.rank, err)
		}
		return
	}
	os.Exit(launch(o))
}

func fatalf(format string, v ...any) {
	fmt.Fprintf(os.Stderr, "gpucheck: "+format+"\n", v...)
	os.Exit(1)
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// launch runs the part as 2 ranks and writes rank 0's result line.
func launch(o options) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fatalf("%v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	hosts := []string{"A", "A"}
	hier := "off"
	if o.part == "collectives" || (o.part == "matrix" && o.mode == "hier") {
		hosts, hier = []string{"A", "B"}, "on"
	}
	if o.part == "collectives" {
		o.mode = "hier"
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	outs := make([]string, len(hosts))
	errs := make([]error, len(hosts))
	var wg sync.WaitGroup
	for r, h := range hosts {
		args := append(append([]string(nil), os.Args[1:]...), "-rank", strconv.Itoa(r))
		cmd := exec.CommandContext(ctx, os.Args[0], args...)
		cmd.Env = append(os.Environ(), "NEXAR_HIER_HOST_ID="+h, fmt.Sprintf("NEXAR_RANK=%d", r),
			fmt.Sprintf("NEXAR_WORLD_SIZE=%d", len(hosts)), fmt.Sprintf("NEXAR_SEED=127.0.0.1:%d", port),
			"NEXAR_TOKEN=gpucheck-token-0123456789abcdef0123")
		cmd.Env = append(cmd.Env, "NEXAR_NCCL_HIER="+hier)
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(b), err
		}()
	}
	wg.Wait()
	status := 0
	var result string
	for r, out := range outs {
		fmt.Printf("----- %s rank %d -----\n", o.part, r)
		for _, line := range strings.SplitAfter(out, "\n") {
			if !strings.HasPrefix(line, "RESULT ") {
				fmt.Print(line)
			}
		}
		if errs[r] != nil {
			fmt.Printf("rank %d: %v\n", r, errs[r])
			status = 1
		}
		if r == 0 {
			sc := bufio.NewScanner(strings.NewReader(out))
			sc.Buffer(nil, 1<<24)
			for sc.Scan() {
				if s, ok := strings.CutPrefix(sc.Text(), "RESULT "); ok {
					result = s
				}
			}
		}
	}
	var sum struct {
		OK      bool     `json:"ok"`
		Checked int      `json:"checked"`
		Failed  int      `json:"failed"`
		Figures []Figure `json:"figures"`
	}
	if result == "" || json.Unmarshal([]byte(result), &sum) != nil {
		result = fmt.Sprintf(`{"part":%q,"ok":false,"error":"rank 0 reported no result"}`, o.part)
		status = 1
	} else if !sum.OK {
		status = 1
	}
	fmt.Printf("%s %s: ok=%v checked=%d failed=%d\n", o.part, o.mode, sum.OK, sum.Checked, sum.Failed)
	for _, f := range sum.Figures {
		fmt.Printf("  %-22s %10d B  median %9.0f us  busbw %7.2f GB/s %s\n", f.Path, f.Bytes, f.Median, f.BusBW, f.Error)
	}
	if o.out != "" {
		if err := os.WriteFile(o.out, []byte(result+"\n"), 0o644); err != nil {
			fatalf("%v", err)
		}
	}
	return status
}

// rank is one process: its communicator, the device calls, the runtime.
type rank struct {
	c  *core.Comm
	d  *device.Comm
	rt *cuda.Runtime
	s  cuda.Stream
}

func join(ctx context.Context) (*rank, error) {
	cfg, err := core.ConfigFromLookup(os.LookupEnv)
	if err != nil {
		return nil, err
	}
	cfg.Mesh = mesh.Builder{}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Any runtime found: the real one is looked for by name when NEXAR_CUDART
	// is not set (cuda.Default), as a CUDA program would have loaded it.
	if cfg.CUDARuntime == "" {
		rt, err := cuda.Default()
		if err != nil {
			return nil, err
		}
		cfg.CUDARuntime = rt.Path()
	}
	c, err := core.New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	d := device.New(c, nil)
	rt := d.Router().Runtime()
	if rt == nil {
		c.Close()
		return nil, fmt.Errorf("no CUDA device: %s", d.Router().Reason())
	}
	if err := rt.SetDevice(0); err != nil { // 2 processes on one GPU
		return nil, err
	}
	s, err := rt.StreamCreate()
	if err != nil {
		return nil, err
	}
	return &rank{c: c, d: d, rt: rt, s: s}, nil
}

func (k *rank) close() { k.d.Close(); k.c.Close() }

func runRank(o options) error {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
	k, err := join(ctx)
	if err != nil {
		return err
	}
	defer k.close()
	var res any
	switch o.part {
	case "matrix":
		res, err = k.matrix(ctx, o)
	case "collectives":
		res, err = k.collectives(ctx, o)
	case "bandwidth":
		res, err = k.bandwidth(ctx, o)
	}
	if res != nil {
		b, _ := json.Marshal(res)
		fmt.Printf("RESULT %s\n", b)
	}
	return err
}

func allDTypes() []collective.DType {
	return []collective.DType{collective.Int8, collective.Uint8, collective.Int32, collective.Uint32, collective.Int64,
		collective.Uint64, collective.Float16, collective.BFloat16, collective.Float32, collective.Float64}
}

func allOps() []collective.Op {
	return []collective.Op{collective.Sum, collective.Prod, collective.Min, collective.Max, collective.Avg,
		collective.Band, collective.Bor, collective.Bxor}
}

// encode is v (small non-negative integers, exact in every type and in any
// order of reduction) as elements of dt.
func encode(dt collective.DType, v []int) []byte {
	es := dt.Size()
	b := make([]byte, len(v)*es)
	for i, x := range v {
		e := b[i*es:]
		switch dt {
		case collective.Int8, collective.Uint8:
			e[0] = byte(x)
		case collective.Int32, collective.Uint32:
			binary.LittleEndian.PutUint32(e, uint32(x))
		case collective.Int64, collective.Uint64:
			binary.LittleEndian.PutUint64(e, uint64(x))
		case collective.Float16:
			binary.LittleEndian.PutUint16(e, half(float32(x)))
		case collective.BFloat16:
			binary.LittleEndian.PutUint16(e, uint16(math.Float32bits(float32(x))>>16))
		case collective.Float32:
			binary.LittleEndian.PutUint32(e, math.Float32bits(float32(x)))
		case collective.Float64:
			binary.LittleEndian.PutUint64(e, math.Float64bits(float64(x)))
		}
	}
	return b
}

// half is f as IEEE binary16, for the small integers encode takes.
func half(f float32) uint16 {
	if f == 0 {
		return 0
	}
	bits := math.Float32bits(f)
	exp := int((bits>>23)&0xff) - 127 + 15
	return uint16(exp)<<10 | uint16((bits>>13)&0x3ff)
}

// Case is one checked call.
type Case struct {
	DType string `json:"dtype"`
	Op    string `json:"op,omitempty"`
	Call  string `json:"call,omitempty"`
	Count int    `json:"count"`
	Form  string `json:"form"`
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// Result is a part's figures.
type Result struct {
	Part    string   `json:"part"`
	Mode    string   `json:"mode,omitempty"`
	Runtime string   `json:"cuda_runtime"`
	OK      bool     `json:"ok"`
	Checked int      `json:"checked,omitempty"`
	Failed  int      `json:"failed,omitempty"`
	Cases   []Case   `json:"cases,omitempty"`
	Figures []Figure `json:"figures,omitempty"`
}

func (k *rank) result(part, mode string) *Result {
	return &Result{Part: part, Mode: mode, Runtime: k.rt.Path(), OK: true}
}

func (r *Result) add(c Case) {
	r.Cases = append(r.Cases, c)
	r.Checked++
	if !c.OK {
		r.Failed++
		r.OK = false
	}
}

func (k *rank) upload(b []byte) (cuda.DevicePtr, error) {
	p, err := k.rt.Malloc(max(len(b), 1))
	if err != nil {
		return 0, err
	}
	return p, k.rt.CopyToDevice(p, b)
}

func (k *rank) download(p cuda.DevicePtr, n int) ([]byte, error) {
	if err := k.rt.StreamSynchronize(k.s); err != nil {
		return nil, err
	}
	b := make([]byte, n)
	return b, k.rt.CopyFromDevice(b, p)
}

// firstDiff says where got and want first differ, "" when equal.
func firstDiff(got, want []byte, es int) string {
	for i := 0; i < len(want); i += es {
		if string(got[i:i+es]) != string(want[i:i+es]) {
			return fmt.Sprintf("element %d is %x, want %x", i/es, got[i:i+es], want[i:i+es])
		}
	}
	return ""
}

func input(r, count int) []int {
	v := make([]int, count)
	for i := range v {
		v[i] = (i*7+r*3)%5 + 1
	}
	return v
}

// matrix: every valid dtype and op, each count, blocking and on a stream;
// the device result must equal nexar's host allreduce of the same input
// byte for byte.
func (k *rank) matrix(ctx context.Context, o options) (*Result, error) {
	res := k.result("matrix", o.mode)
	r := k.c.Rank()
	for _, dt := range allDTypes() {
		for _, op := range allOps() {
			if collective.Check(dt, op) != nil {
				continue
			}
			for _, count := range o.counts {
				in := encode(dt, input(r, count))
				ref := make([]byte, len(in))
				if err := k.c.Allreduce(ctx, in, ref, dt, op); err != nil {
					return res, fmt.Errorf("host reference allreduce %v %v: %w", dt, op, err)
				}
				for _, form := range []string{"blocking", "stream"} {
					c := Case{DType: dt.String(), Op: op.String(), Count: count, Form: form}
					c.Error = k.allreduceCase(ctx, in, ref, count, dt, op, form == "stream")
					c.OK = c.Error == ""
					res.add(c)
				}
			}
		}
	}
	return res, nil
}

func (k *rank) allreduceCase(ctx context.Context, in, ref []byte, count int, dt collective.DType, op collective.Op, onStream bool) string {
	send, err := k.upload(in)
	if err != nil {
		return err.Error()
	}
	defer k.rt.Free(send)
	recv, err := k.upload(make([]byte, len(in)))
	if err != nil {
		return err.Error()
	}
	defer k.rt.Free(recv)
	s := device.Stream{}
	if onStream {
		s = device.On(k.s)
	}
	if err := k.d.Allreduce(ctx, send, recv, count, dt, op, s); err != nil {
		return err.Error()
	}
	got, err := k.download(recv, len(in))
	if err != nil {
		return err.Error()
	}
	return firstDiff(got, ref, dt.Size())
}

// collectives: the device calls besides allreduce, through NCCL within a
// host and nexar between 2 simulated hosts (send/recv: staged or GPUDirect).
func (k *rank) collectives(ctx context.Context, o options) (*Result, error) {
	res := k.result("collectives", "hier")
	r, n := k.c.Rank(), k.c.Size()
	for _, dt := range []collective.DType{collective.Float32, collective.BFloat16, collective.Int64} {
		for _, count := range o.counts {
			es := dt.Size()
			for _, form := range []string{"blocking", "stream"} {
				s := device.Stream{}
				if form == "stream" {
					s = device.On(k.s)
				}
				check := func(call string, f func() (got, want []byte, err error)) {
					c := Case{DType: dt.String(), Call: call, Count: count, Form: form}
					got, want, err := f()
					if err != nil {
						c.Error = err.Error()
					} else {
						c.Error = firstDiff(got, want, es)
					}
					c.OK = c.Error == ""
					res.add(c)
				}
				check("broadcast", func() ([]byte, []byte, error) {
					want := encode(dt, input(n-1, count))
					mine := want
					if r != n-1 {
						mine = make([]byte, len(want))
					}
					p, err := k.upload(mine)
					if err != nil {
						return nil, nil, err
					}
					defer k.rt.Free(p)
					if err := k.d.Broadcast(ctx, p, count, dt, n-1, s); err != nil {
						return nil, nil, err
					}
					got, err := k.download(p, len(want))
					return got, want, err
				})
				check("allgather", func() ([]byte, []byte, error) {
					var want []byte
					for q := range n {
						want = append(want, encode(dt, input(q, count))...)
					}
					sp, err := k.upload(encode(dt, input(r, count)))
					if err != nil {
						return nil, nil, err
					}
					defer k.rt.Free(sp)
					rp, err := k.upload(make([]byte, len(want)))
					if err != nil {
						return nil, nil, err
					}
					defer k.rt.Free(rp)
					if err := k.d.Allgather(ctx, sp, rp, count, dt, s); err != nil {
						return nil, nil, err
					}
					got, err := k.download(rp, len(want))
					return got, want, err
				})
				check("reduce_scatter", func() ([]byte, []byte, error) {
					in := encode(dt, input(r, count*n))
					full := make([]byte, len(in))
					if err := k.c.Allreduce(ctx, in, full, dt, collective.Sum); err != nil {
						return nil, nil, err
					}
					want := full[r*count*es : (r+1)*count*es]
					sp, err := k.upload(in)
					if err != nil {
						return nil, nil, err
					}
					defer k.rt.Free(sp)
					rp, err := k.upload(make([]byte, len(want)))
					if err != nil {
						return nil, nil, err
					}
					defer k.rt.Free(rp)
					if err := k.d.ReduceScatter(ctx, sp, rp, count, dt, collective.Sum, s); err != nil {
						return nil, nil, err
					}
					got, err := k.download(rp, len(want))
					return got, want, err
				})
				check("send/recv", func() ([]byte, []byte, error) {
					want := encode(dt, input((r+n-1)%n, count))
					sp, err := k.upload(encode(dt, input(r, count)))
					if err != nil {
						return nil, nil, err
					}
					defer k.rt.Free(sp)
					rp, err := k.upload(make([]byte, len(want)))
					if err != nil {
						return nil, nil, err
					}
					defer k.rt.Free(rp)
					send := func() error { return k.d.Send(ctx, sp, count, dt, (r+1)%n, 9, s) }
					recv := func() error { _, err := k.d.Recv(ctx, rp, count, dt, (r+n-1)%n, 9, s); return err }
					steps := []func() error{send, recv}
					if r%2 == 1 {
						steps = []func() error{recv, send}
					}
					for _, f := range steps {
						if err := f(); err != nil {
							return nil, nil, err
						}
					}
					got, err := k.download(rp, len(want))
					return got, want, err
				})
			}
		}
	}
	return res, nil
}

// Figure is one bandwidth measurement.
type Figure struct {
	Path   string  `json:"path"`
	Bytes  int     `json:"bytes"`
	Median float64 `json:"median_us,omitempty"`
	P90    float64 `json:"p90_us,omitempty"`
	BusBW  float64 `json:"busbw_GBps,omitempty"`
	Error  string  `json:"error,omitempty"`
}

// timed runs f iters times after 2 untimed runs: median and p90 in µs, and
// the bus bandwidth of an allreduce of nbytes over n ranks at the median.
func timed(iters, nbytes, n int, f func() error) (Figure, error) {
	fig := Figure{Bytes: nbytes}
	for range 2 {
		if err := f(); err != nil {
			return fig, err
		}
	}
	ts := make([]float64, iters)
	for i := range ts {
		t0 := time.Now()
		if err := f(); err != nil {
			return fig, err
		}
		ts[i] = float64(time.Since(t0).Microseconds())
	}
	sort.Float64s(ts)
	fig.Median, fig.P90 = ts[len(ts)/2], ts[(len(ts)*9)/10]
	if fig.Median > 0 {
		fig.BusBW = 2 * float64(n-1) / float64(n) * float64(nbytes) / fig.Median / 1e3
	}
	return fig, nil
}

// bandwidth: allreduce of float32 at each size, one path after another on
// the same 2 ranks: host memory, staged device memory, NCCL's own
// allreduce. (The path through NCCL between simulated hosts is measured by
// hier's TestRealNCCLHier, which gpu_check.sh runs as well.) NCCL refuses
// two ranks on one GPU ("Duplicate GPU"): with one GPU its error is the
// figure.
func (k *rank) bandwidth(ctx context.Context, o options) (*Result, error) {
	res := k.result("bandwidth", "")
	n := k.c.Size()
	if k.c.Config().NCCLHier != "off" {
		return res, errors.New("bandwidth runs with NEXAR_NCCL_HIER=off (the staged path); the launcher sets it")
	}
	lib, libErr := loadNCCL(k.c.Config())
	var nc *nccl.Comm
	ncErr := libErr
	if libErr == nil {
		nc, ncErr = k.ncclComm(ctx, lib)
		if nc != nil {
			defer nc.Close()
		}
	}
	for _, size := range o.sizes {
		count := size / 4
		nb := count * 4
		host := make([]byte, nb)
		f, err := timed(o.iters, nb, n, func() error { return k.c.Allreduce(ctx, nil, host, collective.Float32, collective.Sum) })
		f.Path = "nexar host memory"
		if err != nil {
			f.Error = err.Error()
			res.OK = false
		}
		res.Figures = append(res.Figures, f)
		p, err := k.upload(make([]byte, nb))
		if err != nil {
			return res, err
		}
		f, err = timed(o.iters, nb, n, func() error {
			return k.d.Allreduce(ctx, p, p, count, collective.Float32, collective.Sum, device.Stream{})
		})
		f.Path = "nexar device, staged"
		if err != nil {
			f.Error = err.Error()
			res.OK = false
		}
		res.Figures = append(res.Figures, f)
		f = Figure{Path: "NCCL", Bytes: nb}
		if nc == nil {
			f.Error = ncErr.Error()
		} else {
			f, err = timed(o.iters, nb, n, func() error {
				if err := nc.AllReduce(p, p, count, collective.Float32, collective.Sum, k.s); err != nil {
					return err
				}
				return k.rt.StreamSynchronize(k.s)
			})
			f.Path = "NCCL"
			if err != nil {
				f.Error = err.Error()
			}
		}
		res.Figures = append(res.Figures, f)
		k.rt.Free(p)
	}
	return res, nil
}

func loadNCCL(cfg core.Config) (*nccl.Library, error) {
	if cfg.NCCLLibrary != "" {
		return nccl.Open(cfg.NCCLLibrary)
	}
	return nccl.Default()
}

// ncclComm makes NCCL's communicator over the ranks of c: rank 0's unique
// id broadcast by nexar. Every rank reports whether its init worked, so a
// refusal on one rank (NCCL's "Duplicate GPU") does not leave the other
// waiting in NCCL for ever... as long as NCCL's own init returns.
func (k *rank) ncclComm(ctx context.Context, lib *nccl.Library) (*nccl.Comm, error) {
	var id nccl.UniqueID
	if k.c.Rank() == 0 {
		var err error
		if id, err = lib.NewUniqueID(); err != nil {
			return nil, err
		}
	}
	if err := k.c.Broadcast(ctx, id[:], collective.Uint8, 0); err != nil {
		return nil, err
	}
	type res struct {
		c   *nccl.Comm
		err error
	}
	done := make(chan res, 1)
	go func() {
		c, err := lib.NewComm(id, k.c.Size(), k.c.Rank())
		done <- res{c, err}
	}()
	select {
	case x := <-done:
		return x.c, x.err
	case <-time.After(time.Minute):
		return nil, errors.New("ncclCommInitRank did not return within a minute")
	}
}
