//go:build !cgo

package main

import (
	"fmt"
	"os"
)

// main runs only in a build without cgo, which cannot make libnexar (a
// c-shared library is built by cgo): it says so, and fails.
func main() {
	fmt.Fprintln(os.Stderr, "capi: libnexar is built with cgo (CGO_ENABLED=1 and a C compiler): this build has none")
	os.Exit(2)
}
