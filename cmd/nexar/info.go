package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"

	"github.com/nexar-go/nexar/core"
	"github.com/nexar-go/nexar/hier"
	"github.com/nexar-go/nexar/hw"
	"github.com/nexar-go/nexar/transport/bulk"
	trdma "github.com/nexar-go/nexar/transport/rdma"
)

func cmdInfo(args []string, stdout io.Writer) error {
	fs := newFlagSet("info", "info", stdout)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	fmt.Fprintf(stdout, "nexar %s (%s, %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintln(stdout, "\naddresses:")
	ifs, err := net.Interfaces()
	if err != nil {
		fmt.Fprintf(stdout, "  unavailable: %v\n", err)
	}
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		var ips []string
		for _, a := range addrs {
			ips = append(ips, a.String())
		}
		state := "down"
		if ifc.Flags&net.FlagUp != 0 {
			state = "up"
		}
		fmt.Fprintf(stdout, "  %-12s %-4s %s\n", ifc.Name, state, strings.Join(ips, " "))
	}
	fmt.Fprintln(stdout, "\ntransports:")
	cfg, err := core.Config{}.WithEnv()
	if err != nil {
		return err
	}
	for _, t := range transports(cfg) {
		fmt.Fprintf(stdout, "  %-6s %s\n", t.name, t.status)
	}
	fmt.Fprintln(stdout, "\ndata path (NEXAR_BULK=auto): shm between ranks of one host, rdma between hosts that both")
	fmt.Fprintln(stdout, "  have an active RDMA port, tcp otherwise, quic where none is agreed;")
	fmt.Fprintf(stdout, "  rdma here: %s\n", rdmaPath(cfg.RDMA))
	fmt.Fprintln(stdout, "  `nexar bench` prints the path to each peer (docs/bulk-path.md)")
	fmt.Fprintf(stdout, "\ndevice collectives: %s\n", deviceCollectives(cfg.NCCLHier))
	return nil
}

// deviceCollectives says what NEXAR_NCCL_HIER (value v) makes of the
// collectives of CUDA device buffers (docs/device-memory.md).
func deviceCollectives(v string) string {
	mode, err := hier.ParseMode(v)
	if err != nil {
		return err.Error()
	}
	how := map[hier.Mode]string{
		hier.Auto: "NCCL within a host and nexar between hosts where every rank loads NCCL and a host holds several ranks, staged through pinned memory otherwise",
		hier.On:   "NCCL within a host and nexar between hosts; the first device collective fails, naming the ranks, where a rank cannot use NCCL",
		hier.Off:  "staged through pinned memory (NCCL not used)",
	}[mode]
	return fmt.Sprintf("NEXAR_NCCL_HIER=%v: %s (docs/device-memory.md)", mode, how)
}

// rdmaPath says which port and addressing the RDMA data path would use on
// this machine (NEXAR_IBVERBS, NEXAR_IB_HCA, NEXAR_IB_GID_INDEX), or why
// there is none, and what was verified.
func rdmaPath(opt trdma.Options) string {
	d, err := trdma.Open(opt)
	if err != nil {
		return "none (" + err.Error() + ")"
	}
	defer d.Close()
	return d.Describe() + " (not encrypted: used with NEXAR_BULK_PLAINTEXT=1 or NEXAR_BULK=rdma; tested against a fake libibverbs only, not verified on hardware; " +
		d.Registrations() + ", docs/bulk-path.md;" +
		" GPUDirect RDMA: the C ABI's sends and receives of CUDA device buffers, and its device allreduce, broadcast and allgather" +
		" where every member's paths reach device memory, go between the NIC and device memory (dma-buf, peer memory);" +
		" elsewhere they stage; tested against fakes only, docs/device-memory.md)"
}

type transportInfo struct{ name, status string }

// transports reports what this build and this machine can use: the
// software transports are always in the build, the hardware ones are
// probed by package hw (a library load, no allocation).
func transports(cfg core.Config) []transportInfo {
	shm, cma, tcp := bulk.Available()
	ts := []transportInfo{
		{"quic", "yes (TLS 1.3, mutual authentication; control, heartbeats, and data where no bulk path is agreed)"},
		{"shm", shm},
		{"cma", cma},
		{"tcp", tcp},
		{"mem", "yes (in-process ranks: tests and core.NewLocal)"},
	}
	for _, s := range hw.Probe(hw.Libraries{IBVerbs: cfg.RDMA.Library, CUDA: cfg.CUDARuntime, NCCL: cfg.NCCLLibrary}) {
		state := "unavailable: "
		if s.OK {
			state = "available: "
		}
		ts = append(ts, transportInfo{s.Name, state + s.Detail})
	}
	return ts
}
