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
	if uintptr(c.struct_size) < unsafe.Sizeof(*c) {
		a.failf(resInvalidArgument, "config->struct_size %d is smaller than sizeof(nexar_config_t) %d: initialize the config with NEXAR_CONFIG_INIT",
			uint64(c.struct_size), unsafe.Sizeof(*c))
		return cfg
	}
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
