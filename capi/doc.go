// Command capi is libnexar.so: the C ABI declared in include/nexar.h, built
// with
//
//	go build -buildmode=c-shared -o build/libnexar.so ./capi
//
// (see build.sh for the full command: SONAME, version script).
//
// The package is a thin boundary and holds no logic beyond this:
//
//   - The exported nexar_* symbols are C functions (entry.c). Each returns
//     NEXAR_ERR_FORKED at once in a child made by fork() without exec()
//     (a pthread_atfork handler marks it), before entering Go, whose
//     runtime threads do not survive fork; otherwise it calls its Go
//     implementation, the cgo export nxgo_<name> (nexar_allreduce calls
//     nxgo_allreduce).
//   - Arguments are checked before anything else: a NULL buffer with a
//     non-zero count, a byte size that overflows, an unknown datatype, op,
//     root or peer give NEXAR_ERR_INVALID_ARGUMENT and a last-error message
//     naming the function and the argument. A bad caller never crashes the
//     host process.
//   - Handles are integers from one counter, never reused, looked up in
//     tables (handles.go); an unknown or destroyed handle gives
//     NEXAR_ERR_INVALID_HANDLE.
//   - Buffers are C memory wrapped with unsafe.Slice for the duration of the
//     operation, never copied and never retained by C code, so the cgo
//     pointer rules hold: no Go pointer is ever handed to C. CUDA device
//     pointers are the exception (devmem.go): detected in args.buf once a
//     CUDA runtime is in the process, they are staged through pinned host
//     buffers by hw/cuda/stage, or refused by the entry points that do not
//     stage; a device pointer is never dereferenced.
//   - core errors map to nexar_result_t in one table (errors.go).
//   - The last error is a C11 _Thread_local buffer (lasterror.c): a C→Go
//     call runs on the caller's OS thread for its whole duration, so a C
//     setter called from Go writes the caller's own buffer.
//   - Every export recovers panics into NEXAR_ERR_INTERNAL (guard.go).
//
// Export files include only capi.h (stdint/stddef declarations), never
// nexar.h: the prototypes cgo generates for nxgo_* use plain integer types,
// and entry.c converts nexar.h's enums and handle pointers to them. The two
// are ABI compatible on every platform Go's c-shared mode supports (enums
// are int sized, handles pointer sized).
package main
