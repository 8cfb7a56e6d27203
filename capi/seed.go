package main

/*
#include "capi.h"
*/
import "C"

import (
	"unsafe"

	"github.com/nexar-go/nexar/core"
)

//export nxgo_seed_start
func nxgo_seed_start(bindAddr *C.char, worldSize C.int, token unsafe.Pointer, tokenLen C.size_t,
	seed *C.uintptr_t, addr *C.char, addrLen C.size_t) (r C.int) {
	const fn = "nexar_seed_start"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	a.out("bind_addr", unsafe.Pointer(bindAddr))
	a.out("token", token)
	a.out("seed", unsafe.Pointer(seed))
	a.out("addr", unsafe.Pointer(addr))
	if !a.ok() {
		return a.fail()
	}
	switch {
	case worldSize < 1:
		return fail(fn, resInvalidArgument, "world_size %d must be >= 1", int(worldSize))
	case tokenLen == 0:
		return fail(fn, resInvalidArgument, "token_len is 0: the job needs a secret")
	case tokenLen > 1<<20:
		return fail(fn, resInvalidArgument, "token_len %d is over 1 MiB", uint64(tokenLen))
	}
	tok := C.GoBytes(token, C.int(tokenLen))
	s, err := core.StartSeed(C.GoString(bindAddr), int(worldSize), tok)
	if err != nil {
		return result(fn, err)
	}
	got := s.Addr().String()
	if uint64(addrLen) < uint64(len(got))+1 {
		s.Close()
		return fail(fn, resInvalidArgument, "addr_len %d is too small for %q and its NUL", uint64(addrLen), got)
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(addr)), len(got)+1)
	copy(dst, got)
	dst[len(got)] = 0
	*seed = C.uintptr_t(seeds.add(s))
	return resSuccess
}

//export nxgo_seed_close
func nxgo_seed_close(seed C.uintptr_t) (r C.int) {
	const fn = "nexar_seed_close"
	defer recoverToResult(fn, &r)
	s, ok := seeds.remove(uintptr(seed))
	if !ok {
		return fail(fn, resInvalidHandle, "seed %#x is unknown or already closed", uint64(seed))
	}
	_ = s.Close()
	return resSuccess
}
