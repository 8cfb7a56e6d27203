package netns

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTwoHostsTwoRanks: one rank in each namespace, so every byte crosses
// the veth pair on the bulk TCP path: with TLS (records sealed with
// AES-128-GCM) and in plaintext. testprog's
// check runs every collective up to 256 KiB, whose 2-rank allreduce of
// that size is the fused, pipelined ring.
func TestTwoHostsTwoRanks(t *testing.T) {
	a, b := twoHosts(t)
	_, testprog := build(t)
	for i, plain := range []bool{false, true} {
		name, want := "tls", regexp.MustCompile(`^tcp x2 tls aes-128-gcm$`)
		if plain {
			name, want = "plaintext", regexp.MustCompile(`^tcp x2 plaintext$`)
		}
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			procs := onePerHost(t, ctx, []host{a, b}, 29600+i, []string{"NEXAR_BULK_PLAINTEXT=" + strconv.FormatBool(plain)}, testprog, "check")
			checked := 0
			for _, p := range procs {
				if err := p.cmd.Wait(); err != nil {
					t.Errorf("%s: %v\n%s", p.name, err, p.out.String())
				}
				checked += strings.Count(p.out.String(), "CHECKED")
				for rp, path := range dataPaths(p.out.String()) {
					if rp[0] != rp[1] && !want.MatchString(path) {
						t.Errorf("rank %d reaches rank %d by %q, want %v", rp[0], rp[1], path, want)
					} else if rp[0] != rp[1] {
						t.Logf("rank %d reaches rank %d by %q", rp[0], rp[1], path)
					}
				}
			}
			if checked != 2 {
				t.Errorf("%d ranks reported CHECKED, want 2", checked)
			}
		})
	}
}
