//go:build !amd64

package sched

func cpu() int { return -1 }
