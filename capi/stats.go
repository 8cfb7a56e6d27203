package main

// #include "capi.h"
import "C"

import "unsafe"

// nexar_comm_get_stats (docs/memory.md); the struct is written by
// writeStats (statsfill.go, which may include the public header).

//export nxgo_comm_get_stats
func nxgo_comm_get_stats(comm C.uintptr_t, stats unsafe.Pointer) (r C.int) {
	const fn = "nexar_comm_get_stats"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	if a.ok() && stats == nil {
		a.failf(resInvalidArgument, "stats is NULL")
	}
	if !a.ok() {
		return a.fail()
	}
	writeStats(&a, stats, c.Stats())
	if !a.ok() {
		return a.fail()
	}
	return resSuccess
}
