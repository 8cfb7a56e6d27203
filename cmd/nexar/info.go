package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
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
	for _, t := range transports() {
		fmt.Fprintf(stdout, "  %-6s %s\n", t.name, t.status)
	}
	return nil
}

type transportInfo struct{ name, status string }

// transports reports what this build and this machine can use. The
// hardware probes are cheap file checks, not driver calls: they say whether
// a transport could work here, and the hw packages say whether it does.
func transports() []transportInfo {
	return []transportInfo{
		{"quic", "yes (TLS 1.3, mutual authentication; every message, control and bulk)"},
		{"mem", "yes (in-process ranks: tests and core.NewLocal)"},
		{"shm", "unavailable: not implemented in this build (same-host bulk goes over QUIC on loopback)"},
		{"tcp", "unavailable: not implemented in this build (bulk goes over QUIC)"},
		{"rdma", probeRDMA()},
		{"cuda", probeLib("libcuda.so", "no NVIDIA driver (libcuda.so) found")},
		{"nccl", probeLib("libnccl.so", "no libnccl.so found")},
	}
}

func probeRDMA() string {
	ents, err := os.ReadDir("/sys/class/infiniband")
	if err != nil || len(ents) == 0 {
		return "unavailable: no RDMA device in /sys/class/infiniband"
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return "unavailable: devices " + strings.Join(names, ", ") + " present, but the RDMA transport is not in this build"
}

// libDirs are where the dynamic loader usually finds driver libraries.
var libDirs = []string{
	"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
	"/usr/local/lib", "/usr/local/cuda/lib64", "/usr/local/nvidia/lib64", "/lib/x86_64-linux-gnu",
}

func probeLib(name, missing string) string {
	dirs := libDirs
	if v := os.Getenv("LD_LIBRARY_PATH"); v != "" {
		dirs = append(filepath.SplitList(v), dirs...)
	}
	for _, d := range dirs {
		for _, n := range []string{name, name + ".1", name + ".2"} {
			p := filepath.Join(d, n)
			if _, err := os.Stat(p); err == nil {
				return "unavailable: " + p + " found, but this transport is not in this build"
			}
		}
	}
	return "unavailable: " + missing
}
