package core

import (
	"net"
	"strings"
	"testing"
)

// A rank never advertises a loopback or link-local address while the seed
// is not loopback (ranks on other hosts may join): New fails at once naming
// the variable. On a loopback seed (one host) loopback is right.
func TestAdvertiseNeverLoopbackToAnotherHost(t *testing.T) {
	lo := &net.UDPAddr{IP: net.ParseIP("127.0.0.1"), Port: 4000}
	wild := &net.UDPAddr{IP: net.IPv4zero, Port: 4000}
	cases := []struct {
		name  string
		cfg   Config
		bound *net.UDPAddr
		want  string // the address, or "error: " and what the message names
	}{
		{"loopback seed, loopback address", Config{Seed: "127.0.0.1:29400"}, lo, "127.0.0.1:4000"},
		{"localhost seed, configured loopback", Config{Seed: "localhost:29400", AdvertiseAddr: "127.0.0.1"}, wild, "127.0.0.1:4000"},
		{"remote seed, configured routable", Config{Seed: "192.0.2.1:29400", AdvertiseAddr: "192.0.2.9:0"}, wild, "192.0.2.9:4000"},
		{"remote seed, configured loopback", Config{Seed: "192.0.2.1:29400", AdvertiseAddr: "127.0.0.1"}, wild,
			"error: NEXAR_ADVERTISE_ADDR is 127.0.0.1"},
		{"remote seed, configured link-local", Config{Seed: "192.0.2.1:29400", AdvertiseAddr: "169.254.0.7:5"}, wild,
			"error: NEXAR_ADVERTISE_ADDR is 169.254.0.7:5"},
		{"remote seed, bound to loopback", Config{Seed: "192.0.2.1:29400", BindAddr: "127.0.0.1:0"}, lo,
			"error: this rank listens on 127.0.0.1 (NEXAR_BIND_ADDR"},
	}
	for _, tc := range cases {
		got, err := advertiseAddr(tc.cfg, tc.bound)
		if w, ok := strings.CutPrefix(tc.want, "error: "); ok {
			if err == nil || !strings.Contains(err.Error(), w) || !strings.Contains(err.Error(), "set NEXAR_ADVERTISE_ADDR") ||
				!strings.Contains(err.Error(), tc.cfg.Seed) {
				t.Errorf("%s: advertiseAddr = %q, %v; want an error naming %q, the seed and NEXAR_ADVERTISE_ADDR", tc.name, got, err, w)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: advertiseAddr = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
