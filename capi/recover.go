package main

/*
#include <stdint.h>

#include "capi.h"
*/
import "C"

import (
	"context"
	"slices"
	"strings"
	"unsafe"

	"github.com/nexar-go/nexar/core"
)

// This file is recovery without restart: failure policies, revoke, agree
// and shrink (include/nexar.h; core/recover.go).

//export nxgo_comm_set_failure_policy
func nxgo_comm_set_failure_policy(comm C.uintptr_t, policy C.int) (r C.int) {
	const fn = "nexar_comm_set_failure_policy"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	if a.ok() && (policy < 0 || policy > C.int(core.PolicyShrink)) {
		a.failf(resInvalidArgument, "policy %d is not a nexar_failure_policy_t (0 abort, 1 manual, 2 shrink)", int(policy))
	}
	if !a.ok() {
		return a.fail()
	}
	return result(fn, c.SetFailurePolicy(core.FailurePolicy(policy)))
}

//export nxgo_comm_get_failure_policy
func nxgo_comm_get_failure_policy(comm C.uintptr_t, policy *C.int) (r C.int) {
	const fn = "nexar_comm_get_failure_policy"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("policy", unsafe.Pointer(policy))
	if !a.ok() {
		return a.fail()
	}
	*policy = C.int(c.FailurePolicy())
	return resSuccess
}

//export nxgo_comm_revoke
func nxgo_comm_revoke(comm C.uintptr_t) (r C.int) {
	const fn = "nexar_comm_revoke"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.baseComm(comm) // revokes what the handle was made with, not a successor
	if !a.ok() {
		return a.fail()
	}
	c.Revoke()
	return resSuccess
}

//export nxgo_comm_is_revoked
func nxgo_comm_is_revoked(comm C.uintptr_t, flag *C.int) (r C.int) {
	const fn = "nexar_comm_is_revoked"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("flag", unsafe.Pointer(flag))
	if !a.ok() {
		return a.fail()
	}
	*flag = 0
	if c.Revoked() {
		*flag = 1
	}
	return resSuccess
}

//export nxgo_comm_agree
func nxgo_comm_agree(comm C.uintptr_t, flag *C.uint64_t, failed *C.int, capacity C.size_t, count *C.size_t) (r C.int) {
	const fn = "nexar_comm_agree"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("flag", unsafe.Pointer(flag))
	if capacity > 0 {
		a.out("failed", unsafe.Pointer(failed))
		a.out("count", unsafe.Pointer(count))
	}
	if !a.ok() {
		return a.fail()
	}
	f, lost, err := c.Agree(bg, uint64(*flag))
	if err != nil {
		return result(fn, err)
	}
	*flag = C.uint64_t(f)
	if count != nil {
		*count = C.size_t(len(lost))
	}
	if n := min(len(lost), int(capacity)); n > 0 {
		dst := unsafe.Slice(failed, n)
		for i := range dst {
			dst[i] = C.int(lost[i])
		}
	}
	return resSuccess
}

//export nxgo_comm_shrink
func nxgo_comm_shrink(comm C.uintptr_t, newcomm *C.uintptr_t) (r C.int) {
	const fn = "nexar_comm_shrink"
	defer recoverToResult(fn, &r)
	return derive(fn, comm, newcomm, (*core.Comm).Shrink)
}

//export nxgo_comm_grow
func nxgo_comm_grow(comm C.uintptr_t, newcomm *C.uintptr_t) (r C.int) {
	const fn = "nexar_comm_grow"
	defer recoverToResult(fn, &r)
	return derive(fn, comm, newcomm, (*core.Comm).Grow)
}

// derive stores in *newcomm the handle of the communicator from derives
// from comm's (shrink, grow), NEXAR_COMM_NULL on failure.
func derive(fn string, comm C.uintptr_t, newcomm *C.uintptr_t, from func(*core.Comm, context.Context) (*core.Comm, error)) C.int {
	a := args{fn: fn}
	c := a.comm(comm)
	a.out("newcomm", unsafe.Pointer(newcomm))
	if !a.ok() {
		return a.fail()
	}
	*newcomm = 0
	nc, err := from(c, bg)
	if err != nil {
		return result(fn, err)
	}
	*newcomm = C.uintptr_t(comms.add(nc))
	return resSuccess
}

//export nxgo_comm_join
func nxgo_comm_join(config unsafe.Pointer, comm *C.uintptr_t) (r C.int) {
	const fn = "nexar_comm_join"
	defer recoverToResult(fn, &r)
	return initFrom(fn, config, comm, true)
}

//export nxgo_comm_get_join_addrs
func nxgo_comm_get_join_addrs(comm C.uintptr_t, buf *C.char, length C.size_t, needed *C.size_t) (r C.int) {
	const fn = "nexar_comm_get_join_addrs"
	defer recoverToResult(fn, &r)
	a := args{fn: fn}
	c := a.comm(comm)
	if a.ok() && buf == nil && length > 0 {
		a.failf(resInvalidArgument, "buf is NULL but len is %d", uint64(length))
	}
	if !a.ok() {
		return a.fail()
	}
	var live []string
	for r, addr := range c.JoinAddrs() {
		if addr != "" && !slices.Contains(c.Failed(), r) {
			live = append(live, addr)
		}
	}
	s := strings.Join(live, ",")
	if needed != nil {
		*needed = C.size_t(len(s) + 1)
	}
	if int(length) < len(s)+1 {
		if length > 0 {
			*buf = 0
		}
		return fail(fn, resTruncated, "the %d addresses need %d bytes with the NUL; len is %d", len(live), len(s)+1, uint64(length))
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(length))
	copy(dst, s)
	dst[len(s)] = 0
	return resSuccess
}
