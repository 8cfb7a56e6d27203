package main

// This file has no exports, so it may include the public header and use
// its struct layouts (an export file may not; see doc.go).

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#include "nexar.h"
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/core"
)

// readConfig converts a nexar_config_t into a core.Config. Strings and the
// token are copied: C may free them after nexar_comm_init returns.
// With join (nexar_comm_join), rank and world_size are not read.
func readConfig(a *args, p unsafe.Pointer, join bool) core.Config {
	var cfg core.Config
	if !a.ok() {
		return cfg
	}
	c := (*C.nexar_config_t)(p)
	size := uintptr(c.struct_size)
	// The first header's struct ended at max_buffered_bytes; later fields
	// are read only where the program's struct has them.
	first := unsafe.Offsetof(c.max_buffered_bytes) + unsafe.Sizeof(c.max_buffered_bytes)
	if size < first || size > unsafe.Sizeof(*c) {
		a.failf(resInvalidArgument, "config->struct_size %d is neither a size of nexar_config_t this library knows (%d to %d): initialize the config with NEXAR_CONFIG_INIT",
			uint64(size), first, unsafe.Sizeof(*c))
		return cfg
	}
	// has says whether the program's struct includes the field at off.
	has := func(off, n uintptr) bool { return size >= off+n }
	cfg.Rank = int(c.rank)
	cfg.WorldSize = int(c.world_size)
	if join {
		// nexar_comm_join: the members decide the rank and world size.
		cfg.Rank, cfg.WorldSize, cfg.Join = -1, 0, true
	} else if cfg.WorldSize < 1 {
		a.failf(resInvalidArgument, "config->world_size %d is not >= 1", cfg.WorldSize)
		return cfg
	}
	if !join && (cfg.Rank < -1 || cfg.Rank >= cfg.WorldSize) {
		a.failf(resInvalidArgument, "config->rank %d is out of range [-1, %d)", cfg.Rank, cfg.WorldSize)
		return cfg
	}
	cfg.Seed = goString(c.seed_addr)
	if c.token_len > 0 {
		if c.token == nil {
			a.failf(resInvalidArgument, "config->token is NULL but config->token_len is %d", uint64(c.token_len))
			return cfg
		}
		if c.token_len > 1<<20 {
			a.failf(resInvalidArgument, "config->token_len %d is too large", uint64(c.token_len))
			return cfg
		}
		cfg.Token = C.GoBytes(c.token, C.int(c.token_len))
	}
	cfg.BindAddr = goString(c.bind_addr)
	cfg.AdvertiseAddr = goString(c.advertise_addr)
	cfg.Timeout = millis(c.timeout_ms)
	cfg.ConnectTimeout = millis(c.connect_timeout_ms)
	cfg.HeartbeatInterval = millis(c.heartbeat_interval_ms)
	cfg.HeartbeatTimeout = millis(c.heartbeat_timeout_ms)
	cfg.MaxBufferedBytes = int64(c.max_buffered_bytes)
	// The appended knobs, parsed as their environment variables are
	// (core's table), so that every entry point takes the same forms. A
	// field is read only once has says the program's struct holds it:
	// by offset, not as c.field in the table, which would read past an
	// older program's struct (AddressSanitizer: tests/c/test_knobs.c).
	knobs := []struct {
		field, knob string
		off         uintptr
	}{
		{"topology", "NEXAR_TOPOLOGY", unsafe.Offsetof(c.topology)},
		{"schedules", "NEXAR_SCHEDULES", unsafe.Offsetof(c.schedules)},
		{"bulk", "NEXAR_BULK", unsafe.Offsetof(c.bulk)},
		{"memory_profile", "NEXAR_MEMORY_PROFILE", unsafe.Offsetof(c.memory_profile)},
		{"failure_policy", "NEXAR_ON_FAILURE", unsafe.Offsetof(c.failure_policy)},
		{"join_addr", "NEXAR_JOIN_ADDR", unsafe.Offsetof(c.join_addr)},
		{"cuda_runtime", "NEXAR_CUDART", unsafe.Offsetof(c.cuda_runtime)},
		{"nccl_library", "NEXAR_NCCL", unsafe.Offsetof(c.nccl_library)},
		{"ibverbs_library", "NEXAR_IBVERBS", unsafe.Offsetof(c.ibverbs_library)},
		{"rdma_device", "NEXAR_IB_HCA", unsafe.Offsetof(c.rdma_device)},
	}
	for _, k := range knobs {
		if !has(k.off, unsafe.Sizeof(c.topology)) {
			continue
		}
		cp := *(**C.char)(unsafe.Add(p, k.off))
		if cp == nil {
			continue
		}
		if err := cfg.SetKnob(k.knob, C.GoString(cp)); err != nil {
			a.failf(resInvalidArgument, "config->%s: %v", k.field, err)
			return cfg
		}
	}
	if has(unsafe.Offsetof(c.bulk_plaintext), unsafe.Sizeof(c.bulk_plaintext)) && c.bulk_plaintext != 0 {
		cfg.BulkPlaintext = true
	}
	ints := []struct {
		field string
		off   uintptr
		lo    C.int
		hi    C.int
		to    *int
	}{
		{"bulk_conns", unsafe.Offsetof(c.bulk_conns), 1, 16, &cfg.BulkConns},
		{"min_world_size", unsafe.Offsetof(c.min_world_size), 1, 1 << 30, &cfg.MinWorldSize},
		{"max_world_size", unsafe.Offsetof(c.max_world_size), 1, 1 << 30, &cfg.MaxWorldSize},
	}
	for _, f := range ints {
		if !has(f.off, unsafe.Sizeof(c.bulk_conns)) {
			continue
		}
		v := *(*C.int)(unsafe.Add(p, f.off))
		if v == 0 {
			continue
		}
		if v < f.lo || v > f.hi {
			a.failf(resInvalidArgument, "config->%s %d is not in [%d, %d] (0: the environment's, else the default)", f.field, int(v), int(f.lo), int(f.hi))
			return cfg
		}
		*f.to = int(v)
	}
	if has(unsafe.Offsetof(c.spin_wait_us), unsafe.Sizeof(c.spin_wait_us)) {
		switch us := int64(c.spin_wait_us); {
		case us < 0:
			cfg.SpinWait = -1 // never spin
		case us > 0:
			cfg.SpinWait = time.Duration(us) * time.Microsecond
		}
	}
	return cfg
}

func goString(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// millis converts a millisecond field; <= 0 means the core default.
func millis(ms C.int64_t) time.Duration {
	if ms <= 0 {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// writeStatus fills a nexar_status_t (p may be NULL).
func writeStatus(p unsafe.Pointer, st core.Status, esize int) {
	if p == nil {
		return
	}
	s := (*C.nexar_status_t)(p)
	*s = C.nexar_status_t{}
	s.source = C.int(st.Source)
	s.tag = C.uint64_t(st.Tag)
	s.bytes = C.size_t(st.Count)
	if esize > 0 {
		s.count = C.size_t(st.Count / esize)
	}
}
