package main

// #include "capi.h"
import "C"

// nexar_comm_dump_flight_record (docs/diagnostics.md).

//export nxgo_comm_dump_flight_record
func nxgo_comm_dump_flight_record(comm C.uintptr_t, path *C.char) (r C.int) {
	const fn = "nexar_comm_dump_flight_record"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	if a.ok() && (path == nil || *path == 0) {
		a.failf(resInvalidArgument, "path is NULL or empty")
	}
	if !a.ok() {
		return a.fail()
	}
	if err := c.DumpFlightRecord(C.GoString(path)); err != nil {
		return fail(fn, resInternal, "%v", err)
	}
	return resSuccess
}
