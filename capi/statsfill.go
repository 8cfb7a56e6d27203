package main

// This file has no exports, so it may include the public header and use
// its struct layouts (an export file may not; see doc.go).

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#include "nexar.h"
*/
import "C"

import (
	"unsafe"

	"github.com/nexar-go/nexar/core"
)

// statsV1Size is the size of the first nexar_stats_t, the smallest
// struct_size accepted. Fields appended later must be written only when
// struct_size covers them.
const statsV1Size = unsafe.Sizeof(C.nexar_stats_t{})

// writeStats checks the nexar_stats_t at p (non-nil) and fills it with s.
func writeStats(a *args, p unsafe.Pointer, s core.Stats) {
	st := (*C.nexar_stats_t)(p)
	if uintptr(st.struct_size) < statsV1Size {
		a.failf(resInvalidArgument, "stats->struct_size %d is smaller than sizeof(nexar_stats_t) %d: initialize it with NEXAR_STATS_INIT",
			uint64(st.struct_size), statsV1Size)
		return
	}
	st.bytes_buffered = C.int64_t(s.BytesBuffered)
	st.scratch_bytes = C.int64_t(s.ScratchBytes)
	st.ring_bytes = C.int64_t(s.RingBytes)
	st.relayed_bytes = C.int64_t(s.RelayedBytes)
	st.messages_sent = C.int64_t(s.MessagesSent)
	st.bytes_sent = C.int64_t(s.BytesSent)
	st.bytes_received = C.int64_t(s.BytesReceived)
}
