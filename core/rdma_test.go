package core

import (
	"testing"

	"github.com/nexar-go/nexar/tests/fakes/ibverbs"
	"github.com/nexar-go/nexar/transport/bulk"
)

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
		cfg := testConfig()
		cfg.BulkPlaintext = tc.plaintext
		cfg.RDMA.Library = lib // NEXAR_IBVERBS, which New reads into it
		rd, err := openRDMA(cfg, tc.mode)
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
