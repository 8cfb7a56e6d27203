package mesh

import (
	"log/slog"
	"testing"

	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/bulk"
)

// TestBulkModes: the modes transport.CheckBulkMode accepts (core checks a
// Config with it) are exactly those bulk.ParseMode reads.
func TestBulkModes(t *testing.T) {
	for _, s := range []string{"", "auto", "AUTO", " off ", "quic", "tcp", "shm", "rdma", "Rdma", "fast", "ring", "on", "tcp,shm"} {
		_, perr := bulk.ParseMode(s)
		cerr := transport.CheckBulkMode(s)
		if (perr == nil) != (cerr == nil) {
			t.Errorf("%q: bulk.ParseMode says %v, transport.CheckBulkMode %v", s, perr, cerr)
		}
	}
}

// TestRDMAOnlyWhereTrusted: RDMA carries data in the clear, so the auto
// mode opens the device only when the job declared its network trusted
// (BulkPlaintext); NEXAR_BULK=rdma opens it regardless. The device here is
// the fake libibverbs'.
func TestRDMAOnlyWhereTrusted(t *testing.T) {
	lib, err := ibverbs.Cached()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode      bulk.Mode
		plaintext bool
		want      bool
	}{
		{bulk.ModeAuto, false, false},
		{bulk.ModeAuto, true, true},
		{bulk.ModeRDMA, false, true},
		{bulk.ModeTCP, true, false},
	} {
		o := transport.MeshOptions{BulkPlaintext: tc.plaintext, Logger: slog.Default()}
		o.RDMA.Library = lib // NEXAR_IBVERBS, which core reads into it
		rd, err := openRDMA(o, tc.mode)
		if err != nil {
			t.Fatalf("mode %v, plaintext %v: %v", tc.mode, tc.plaintext, err)
		}
		if (rd != nil) != tc.want {
			t.Errorf("mode %v, plaintext %v: RDMA opened %v, want %v", tc.mode, tc.plaintext, rd != nil, tc.want)
		}
		if rd != nil {
			rd.Close()
		}
	}
}
