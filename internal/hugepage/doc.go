// Package hugepage maps large buffers outside the Go heap, advised for
// transparent huge pages (madvise(MADV_HUGEPAGE)), as numpy and glibc do for
// large arrays: copying and reducing tens of megabytes over 4 KiB pages costs
// up to twice as much in TLB misses. The collective package's scratch pool
// and `nexar bench`'s buffers use it. Map and Unmap are safe for concurrent
// use; a mapping must be unmapped exactly once.
package hugepage
