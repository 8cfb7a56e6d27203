//go:build cgo

package cudart

/*
#cgo LDFLAGS: -ldl -lpthread
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int open;
} nx_gate;

static nx_gate *nx_gate_new(void) {
	nx_gate *g = calloc(1, sizeof *g);
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	return g;
}

static void nx_gate_wait(void *p) {
	nx_gate *g = p;
	pthread_mutex_lock(&g->mu);
	while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void nx_gate_open(nx_gate *g) {
	pthread_mutex_lock(&g->mu);
	g->open = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

typedef int (*nx_launch_fn)(void *, void (*)(void *), void *);

static int nx_gate_launch(const char *lib, uintptr_t stream, nx_gate *g) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	if (!h) return -1;
	nx_launch_fn f = (nx_launch_fn)dlsym(h, "cudaLaunchHostFunc");
	if (!f) return -2;
	return f((void *)stream, nx_gate_wait, g);
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Gate holds a stream at a point until Open: a host function enqueued
// through the runtime's cudaLaunchHostFunc that blocks until opened. Tests
// use it to make ordering deterministic: work behind a closed gate has
// certainly not run. Open is safe from any goroutine; the gate's few bytes
// are never freed (a stream thread may still hold them).
type Gate struct{ g *C.nx_gate }

// NewGate enqueues a closed gate on stream (a cudaStream_t as uintptr) of
// the runtime at lib.
func NewGate(lib string, stream uintptr) (*Gate, error) {
	g := C.nx_gate_new()
	cl := C.CString(lib)
	defer C.free(unsafe.Pointer(cl))
	if rc := C.nx_gate_launch(cl, C.uintptr_t(stream), g); rc != 0 {
		return nil, fmt.Errorf("fakes/cudart: cudaLaunchHostFunc on %s: %d", lib, int(rc))
	}
	return &Gate{g: g}, nil
}

// Open lets the stream go on.
func (g *Gate) Open() { C.nx_gate_open(g.g) }
