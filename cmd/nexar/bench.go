package main

import "io"

func cmdBench(args []string, stdout io.Writer) error {
	return usageError("bench: not implemented yet (TODO)")
}
