package hier

import (
	"errors"
	"fmt"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/nexar-go/nexar/hw/cuda"
)

// Prober answers what memory an address is (the device runtime's pointer
// query, cudaPointerGetAttributes for CUDA); *cuda.Runtime and
// *cuda.Driver have it.
type Prober interface {
	PointerType(p uintptr) (cuda.MemoryType, int, error)
}

// Place is where a buffer lives: host memory the host may read, or memory
// of CUDA device Device.
type Place struct {
	OnDevice bool
	Device   int // -1 for host memory
}

// Host is the Place of host memory.
var Host = Place{Device: -1}

// KindCacheSize bounds the addresses a Kinds remembers.
const KindCacheSize = 4096

// Kinds remembers what memory a buffer is, so that a buffer passed again is
// not asked about again: the CUDA runtime's answer for a buffer's first
// address, in an LRU bounded by KindCacheSize. Safe for concurrent use.
//
// The rule, for memory freed and handed out again at the same address:
//
//   - Only two answers are kept: device memory (cudaMalloc, cudaMallocAsync,
//     memory pools; with its device) and plain host memory that CUDA does
//     not know (malloc, mmap, Python and torch CPU tensors). Under CUDA's
//     unified addressing the driver takes device addresses from ranges it
//     reserves for the life of the context, apart from the host's heap, so
//     neither address comes back as the other kind while the process keeps
//     its CUDA context.
//   - Managed memory (cudaMallocManaged) and page-locked host memory
//     (cudaMallocHost, cudaHostAlloc, cudaHostRegister) are asked every
//     time: CUDA hands these addresses out and takes them back (a
//     registration changes the answer for host memory that stays where it
//     is; managed memory sits among device addresses), so they are where a
//     remembered answer could turn stale.
//   - A staged call that fails forgets the addresses of its device buffers
//     (a copy failing on a remembered address is how a stale answer would
//     show), and Forget and Purge drop answers explicitly: a program that
//     returns memory to the system and may get the same address back as
//     another kind (cudaFree then a host mmap at that address, or the
//     reverse) calls Forget first. capi purges when a communicator is
//     destroyed.
//
// An error from the runtime is not remembered.
//
// Memory the runtime does not know (Unregistered) is host memory only if
// the host can read it: that is checked once per address (cuda.Readable,
// which does not fault), and an address the host cannot read is an
// *UnknownPointerError (memory of a runtime libnexar did not find: a
// statically linked CUDA runtime, another GPU's), never a fault later.
type Kinds struct {
	probe    Prober
	readable func(p uintptr) bool
	cache    *lru.Cache[uintptr, Place]
}

// NewKinds returns an empty cache over probe.
func NewKinds(probe Prober) *Kinds {
	c, err := lru.New[uintptr, Place](KindCacheSize)
	if err != nil {
		panic(err) // only for a size <= 0
	}
	return &Kinds{probe: probe, readable: cuda.Readable, cache: c}
}

// UnknownPointerError is a buffer that is not memory the host can read
// and that no device runtime of this process claims.
type UnknownPointerError struct {
	Ptr uintptr
	// Driver: the CUDA driver says it is device memory, but libnexar has
	// no CUDA runtime to copy it with.
	Driver bool
	Device int
}

func (e *UnknownPointerError) Error() string {
	if e.Driver {
		return fmt.Sprintf("%#x is CUDA device memory (device %d, says the CUDA driver), but libnexar found no CUDA runtime to copy it with (a statically linked one, nvcc's default, exports none): set NEXAR_CUDART to a CUDA runtime library of the driver's version (libcudart.so.12, ...)", e.Ptr, e.Device)
	}
	return fmt.Sprintf("%#x is not memory the host can read, and no device runtime in this process claims it: if it is GPU memory, set NEXAR_CUDART to the CUDA runtime library the program uses (a statically linked one, nvcc's default, cannot be found), or install the runtime's adapter (nexar_device_adapter_install), before creating the communicator", e.Ptr)
}

// Of reports where the buffer at p lives; p 0 is host (a NULL buffer is
// its caller's to refuse).
func (k *Kinds) Of(p uintptr) (Place, error) {
	if p == 0 {
		return Host, nil
	}
	if pl, ok := k.cache.Get(p); ok {
		return pl, nil
	}
	t, dev, err := k.probe.PointerType(p)
	if err != nil {
		var u *UnknownPointerError
		if errors.As(err, &u) {
			return Host, err
		}
		return Host, fmt.Errorf("pointer query (%#x): %w", p, err)
	}
	switch t {
	case cuda.Device:
		pl := Place{OnDevice: true, Device: dev}
		k.cache.Add(p, pl)
		return pl, nil
	case cuda.Unregistered:
		if !k.readable(p) {
			return Host, &UnknownPointerError{Ptr: p}
		}
		k.cache.Add(p, Host)
	}
	return Host, nil // page-locked or managed: the host may read it
}

// Forget drops what is remembered about the buffer at p.
func (k *Kinds) Forget(p uintptr) { k.cache.Remove(p) }

// Purge drops every remembered answer.
func (k *Kinds) Purge() { k.cache.Purge() }

// Len is the number of addresses remembered.
func (k *Kinds) Len() int { return k.cache.Len() }
