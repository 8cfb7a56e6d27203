package main

// #include "capi.h"
import "C"

import (
	"fmt"
	"os"
	"runtime/debug"
	"sync"
)

var stackOnce sync.Once

// recoverToResult, deferred first in every export, turns a panic into
// NEXAR_ERR_INTERNAL so a bug in nexar never unwinds into C (which would
// kill the host). The first panic's stack goes to stderr once: it is a bug
// report, and the process may carry on.
func recoverToResult(fn string, r *C.int) {
	p := recover()
	if p == nil {
		return
	}
	stackOnce.Do(func() {
		fmt.Fprintf(os.Stderr, "nexar: internal error: panic in %s: %v\n%s", fn, p, debug.Stack())
	})
	*r = fail(fn, resInternal, "internal error: panic: %v", p)
}
