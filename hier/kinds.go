package hier

import (
	"fmt"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/nexar-go/nexar/hw/cuda"
)

// Prober answers what memory an address is (cudaPointerGetAttributes);
// *cuda.Runtime has it.
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
type Kinds struct {
	probe Prober
	cache *lru.Cache[uintptr, Place]
}

// NewKinds returns an empty cache over probe.
func NewKinds(probe Prober) *Kinds {
	c, err := lru.New[uintptr, Place](KindCacheSize)
	if err != nil {
		panic(err) // only for a size <= 0
	}
	return &Kinds{probe: probe, cache: c}
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
		return Host, fmt.Errorf("cudaPointerGetAttributes(%#x): %w", p, err)
	}
	switch t {
	case cuda.Device:
		pl := Place{OnDevice: true, Device: dev}
		k.cache.Add(p, pl)
		return pl, nil
	case cuda.Unregistered:
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
