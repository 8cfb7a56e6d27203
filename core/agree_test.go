package core

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nexar-go/nexar/collective"
)

// mismatchCases are calls that disagree across ranks in a way whose data
// flow need not reach every rank: rooted collectives with two roots, scans
// with a count that differs on the last rank. Issue 14 item 4: roots 0,0,1,1
// on 4 ranks used to return success on ranks 0 and 1.
func mismatchCases() map[string]func(c *Comm) error {
	const n = 1000 // elements of int32: 4000 B, as in the issue
	root := func(c *Comm) int {
		if c.Rank() < (c.Size()+1)/2 {
			return 0
		}
		return 1
	}
	count := func(c *Comm) int {
		if c.Rank() == c.Size()-1 {
			return n + 1
		}
		return n
	}
	buf := func(k int) []byte { return make([]byte, 4*k) }
	eq := func(c *Comm, k int) ([]int, []int) {
		counts, displs := make([]int, c.Size()), make([]int, c.Size())
		for i := range counts {
			counts[i], displs[i] = k, i*k
		}
		return counts, displs
	}
	bg := context.Background()
	return map[string]func(c *Comm) error{
		"broadcast/roots": func(c *Comm) error { return c.Broadcast(bg, buf(n), collective.Int32, root(c)) },
		"broadcast/counts": func(c *Comm) error {
			return c.Broadcast(bg, buf(count(c)), collective.Int32, 0)
		},
		"reduce/roots": func(c *Comm) error {
			return c.Reduce(bg, buf(n), buf(n), collective.Int32, collective.Sum, root(c))
		},
		"gather/roots": func(c *Comm) error {
			return c.Gather(bg, buf(n), buf(n*c.Size()), collective.Int32, root(c))
		},
		"scatter/roots": func(c *Comm) error {
			return c.Scatter(bg, buf(n*c.Size()), buf(n), collective.Int32, root(c))
		},
		"gatherv/roots": func(c *Comm) error {
			counts, displs := eq(c, n)
			return c.Gatherv(bg, buf(n), buf(n*c.Size()), counts, displs, collective.Int32, root(c))
		},
		"scatterv/roots": func(c *Comm) error {
			counts, displs := eq(c, n)
			return c.Scatterv(bg, buf(n*c.Size()), counts, displs, buf(n), collective.Int32, root(c))
		},
		"scan/counts": func(c *Comm) error {
			return c.Scan(bg, buf(count(c)), buf(count(c)), collective.Int32, collective.Sum)
		},
		"exscan/counts": func(c *Comm) error {
			return c.Exscan(bg, buf(count(c)), buf(count(c)), collective.Int32, collective.Sum)
		},
	}
}

// TestMismatchFailsEveryRank checks invariant 2 where data flow alone does
// not: every rank's call fails as mismatched, none returns success.
func TestMismatchFailsEveryRank(t *testing.T) {
	worlds := []struct {
		name string
		make func(n int) ([]*Comm, error)
		ns   []int
		reps int
	}{
		{"mem", func(n int) ([]*Comm, error) { return testNewLocal(n, testConfig()) }, []int{2, 3, 4, 5}, 5},
		{"quic", func(n int) ([]*Comm, error) { return testNewLocalQUIC(n, testConfig()) }, []int{2, 4}, 1},
	}
	for _, w := range worlds {
		for _, n := range w.ns {
			for name, call := range mismatchCases() {
				t.Run(fmt.Sprintf("%s/n=%d/%s", w.name, n, name), func(t *testing.T) {
					for rep := 0; rep < w.reps; rep++ {
						comms, err := w.make(n)
						if err != nil {
							t.Fatal(err)
						}
						start := time.Now()
						errs := each(comms, call)
						for r, err := range errs {
							if CodeOf(err) != CodeMismatch {
								t.Errorf("rep %d: rank %d: %v, want a mismatch", rep, r, err)
							}
						}
						if d := time.Since(start); d > 10*time.Second {
							t.Errorf("rep %d: took %v", rep, d)
						}
						closeAll(t, comms)
					}
				})
			}
		}
	}
}

// TestAgreedCollectivesStillWork runs every collective that now ends with
// agreeSignatures with matching calls, on world sizes that are and are not
// powers of two, and checks the data.
func TestAgreedCollectivesStillWork(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 8} {
		comms := newLocal(t, n)
		bg := context.Background()
		mustAll(t, each(comms, func(c *Comm) error {
			b := f32s(float32(c.Rank()), 7)
			if c.Rank() == n-1 {
				b = f32s(42, 43)
			}
			if err := c.Broadcast(bg, b, collective.Float32, n-1); err != nil {
				return err
			}
			if getF32(b, 0) != 42 || getF32(b, 1) != 43 {
				return fmt.Errorf("broadcast: got %v %v", getF32(b, 0), getF32(b, 1))
			}
			out := make([]byte, 4)
			if err := c.Scan(bg, f32s(1), out, collective.Float32, collective.Sum); err != nil {
				return err
			}
			if got := getF32(out, 0); got != float32(c.Rank()+1) {
				return fmt.Errorf("scan: got %v", got)
			}
			red := make([]byte, 4)
			if err := c.Reduce(bg, f32s(2), red, collective.Float32, collective.Sum, 0); err != nil {
				return err
			}
			if c.Rank() == 0 && getF32(red, 0) != float32(2*n) {
				return fmt.Errorf("reduce: got %v", getF32(red, 0))
			}
			return nil
		}))
	}
}
