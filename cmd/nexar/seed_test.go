package main

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
)

// nexar seed --listen reads a host name as rank 0's embedded seed does, and
// says when only this host's ranks can join.
func TestSeedListen(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(slog.NewTextHandler(&b, nil))
	if got := seedListen("localhost:29400", log); got != "127.0.0.1:29400" {
		t.Errorf("localhost: %q", got)
	}
	if !strings.Contains(b.String(), "listening on loopback") {
		t.Errorf("no warning for a loopback listener:\n%s", b.String())
	}
	b.Reset()
	if got := seedListen("0.0.0.0:29400", log); got != "0.0.0.0:29400" || b.Len() != 0 {
		t.Errorf("0.0.0.0: %q, logged %q", got, b.String())
	}
	// A host name that resolves only to loopback here (a Debian host's own
	// name, 127.0.1.1) gets every interface: other hosts reach it.
	name, err := os.Hostname()
	if err != nil {
		t.Skip("no host name")
	}
	ips, err := net.LookupIP(name)
	loopOnly := err == nil && len(ips) > 0
	for _, ip := range ips {
		loopOnly = loopOnly && ip.IsLoopback()
	}
	if !loopOnly {
		t.Skipf("this host's name %q does not resolve to loopback only (%v): the case cannot be set up here", name, ips)
	}
	if got := seedListen(name+":29400", log); got != "0.0.0.0:29400" {
		t.Errorf("%s (loopback only): %q, want every interface", name, got)
	}
}
