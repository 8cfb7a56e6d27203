//go:build linux

package bulk

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/nexar-go/nexar/internal/procwatch"
)

// Ring layout (all fields little-endian, the machine's own order: both
// sides run on one host). Producer and consumer fields sit on their own
// cache lines so the two sides do not false-share.
const (
	offMagic      = 0
	offSize       = 8
	offCookie     = 16
	offHead       = 64  // u64, bytes ever written (producer)
	offTail       = 128 // u64, bytes ever read (consumer)
	offDataSeq    = 192 // u32 futex word, bumped by the producer
	offDataWait   = 196 // u32, consumers sleeping on offDataSeq inside a frame
	offIdleWait   = 200 // u32, the idle reader sleeping on offDataSeq between frames
	offWaiting    = 204 // u32, consumer goroutines blocked until data arrives
	offCallWait   = 208 // u32, consumer threads asleep in a call on offDataSeq (sleepData)
	offSpaceSeq   = 256 // u32 futex word, bumped by the consumer
	offSpaceWait  = 260 // u32, producers sleeping on offSpaceSeq
	offProdClosed = 320 // u32
	offConsClosed = 324 // u32
	offRemoteOK   = 328 // u32, set by the consumer: it can read the producer's memory
	offAckSeq     = 384 // u32 futex word, remote frames the consumer has copied
	offAckWait    = 388 // u32, producers sleeping on offAckSeq
	offPresence   = 448 // u64, the consumer's presence (presence.go), read by the producer
	ringHdr       = 4096

	ringMagic = "NXRING01"
	// publish bounds how many bytes the producer copies before making them
	// visible, so that the consumer's copy overlaps the producer's.
	publish = 256 << 10
	// spins is how often a waiter re-checks before it sleeps in the kernel:
	// short, because on a 2-core host a spinning waiter steals the CPU the
	// other side needs.
	spins     = 64
	sleepSlot = 20 * time.Millisecond // futex timeout: how often ctx is checked
	// progressSlot is the futex timeout of a writer that progresses its
	// inbound ring while it waits for space: the peer's data may arrive
	// without waking it (see channel.poll).
	progressSlot = 100 * time.Microsecond
)

const (
	futexWait       = 0
	futexWake       = 1
	futexWaitBitset = 9
	futexWakeBitset = 10

	// Sleepers on offDataSeq say whom a wake is for, so that the producer
	// wakes the thread that needs the data and no other: the idle reader
	// (waitData) and a caller's own thread (sleepData). Plain FUTEX_WAIT
	// sleepers match every bit.
	bitIdle = 1
	bitCall = 2
)

var shmDir = "/dev/shm"

// ring is one single-producer single-consumer byte ring in a shared mapping.
// Write is called by one goroutine at a time, Read by one goroutine at a
// time; Close is safe concurrently with both.
type ring struct {
	mem      []byte
	data     []byte
	mask     uint64
	producer bool
	path     string // set on the creating side until unlinked
	// remoteSent counts the producer's remote frames (one writer at a
	// time: the channel's semaphore).
	remoteSent uint32
	// tailSeen is the consumer's tail as the producer last read it (one
	// writer at a time): the free space it implies only grows, so the
	// shared line is read again only when a write needs more room.
	tailSeen uint64
	// headMine is the head as the producer last published it (one writer
	// at a time): the producer never reads the shared head, whose line
	// the polling consumer reads all the time; reading it back cost a
	// cache miss, about 65 ns, at the start of every write.
	headMine uint64
	// yield: this host runs more ranks than it has cores; spinning
	// waiters yield the core between checks.
	yield    atomic.Bool
	closed   atomic.Bool
	unmapped atomic.Bool
	// pres publishes this (consumer) process's presence; nil on rings
	// that do not carry it. polls counts polls toward its next beat
	// (under the channel's read lock).
	pres  *presence
	polls uint32
	// sync orders this process's ring reads after its ring writes for
	// the race detector (racesync_on.go); set by Endpoint.addRing, nil
	// (no annotation) on rings of tests that make them directly.
	sync *raceSync
}

func (r *ring) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *ring) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

// createRing makes a ring file of size bytes (a power of two) readable only
// by this user, maps it, and returns it as the consumer side with the path
// and cookie the producer must present. Rings are made on a pair's first
// message (see Endpoint.connect), so both sides (see openRing) map them
// with MAP_POPULATE: the pages are allocated and mapped at once, instead of
// costing a fault in each process the first time a message crosses them
// (several microseconds a page on a VM).
//
// The file is named after its creator (see ringOwner) so that a later
// process can remove it if the creator dies before the producer has mapped
// and unlinked it (sweepStaleRings).
func createRing(size int) (*ring, string, []byte, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, "", nil, err
	}
	cookie := make([]byte, 16)
	if _, err := rand.Read(cookie); err != nil {
		return nil, "", nil, err
	}
	owner, err := ringOwner(os.Getpid())
	if err != nil {
		return nil, "", nil, fmt.Errorf("bulk: create ring: %w", err)
	}
	path := shmDir + "/" + ringPrefix + owner + "-" + hex.EncodeToString(rnd[:])
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, "", nil, fmt.Errorf("bulk: create ring: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(int64(ringHdr + size)); err != nil {
		os.Remove(path)
		return nil, "", nil, fmt.Errorf("bulk: size ring: %w", err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, ringHdr+size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		os.Remove(path)
		return nil, "", nil, fmt.Errorf("bulk: map ring: %w", err)
	}
	r := &ring{mem: mem, data: mem[ringHdr:], mask: uint64(size - 1), path: path}
	copy(mem[offMagic:], ringMagic)
	*r.u64(offSize) = uint64(size)
	copy(mem[offCookie:offCookie+16], cookie)
	return r, path, cookie, nil
}

// openRing maps the ring a peer created as its producer side, after checking
// that the file is ours, has the advertised size, and carries the cookie.
// It unlinks the file: both sides hold it mapped from here on.
func openRing(path string, size int, cookie []byte) (*ring, error) {
	if size <= 0 || size&(size-1) != 0 || size > maxRing {
		return nil, fmt.Errorf("bulk: ring size %d is not a power of two up to %d", size, maxRing)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("bulk: open ring: %w", err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("bulk: stat ring: %w", err)
	}
	if st.Uid != uint32(os.Geteuid()) || st.Size != int64(ringHdr+size) || st.Mode&0o077 != 0 {
		return nil, fmt.Errorf("bulk: ring %s: owner, size or mode not as offered", path)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, ringHdr+size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("bulk: map ring: %w", err)
	}
	r := &ring{mem: mem, data: mem[ringHdr:], mask: uint64(size - 1), producer: true}
	if string(mem[offMagic:offMagic+8]) != ringMagic || *r.u64(offSize) != uint64(size) ||
		subtle.ConstantTimeCompare(mem[offCookie:offCookie+16], cookie) != 1 {
		syscall.Munmap(mem)
		return nil, fmt.Errorf("bulk: ring %s: not the segment offered", path)
	}
	os.Remove(path)
	r.headMine = atomic.LoadUint64(r.u64(offHead)) // 0: nothing was written yet
	return r, nil
}

// ringPrefix starts the name of every ring file under shmDir:
// nexar-<pid namespace>-<creator pid>-<creator start time>-<random>.
const ringPrefix = "nexar-"

// ringOwner names process pid for a ring file: the inode of its PID
// namespace, its pid and its start time in clock ticks since boot, so that
// a reused pid is not taken for the creator.
func ringOwner(pid int) (string, error) {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
	if err != nil {
		return "", err
	}
	// "pid:[4026531836]"
	ns = strings.TrimSuffix(strings.TrimPrefix(ns, "pid:["), "]")
	if _, err := strconv.ParseUint(ns, 10, 64); err != nil {
		return "", fmt.Errorf("bulk: PID namespace %q", ns)
	}
	start, err := procwatch.StartTime(pid)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s-%d-%d", ns, pid, start), nil
}

// sweepStaleRings removes the ring files (and the RPC rings' doorbell
// FIFOs, named the same plus bellSuffix) under shmDir that this user's
// dead processes left (a creator killed between creating a ring and its
// peer mapping it; after that the file is unlinked). Only files named by a
// process of this PID namespace whose pid is gone, or now belongs to a
// process that started at another time, are removed: a live job's files,
// and files it cannot judge, are left alone. It returns the names removed.
func sweepStaleRings() []string {
	self, err := ringOwner(os.Getpid())
	if err != nil {
		return nil
	}
	ns, _, _ := strings.Cut(self, "-")
	ents, err := os.ReadDir(shmDir)
	if err != nil {
		return nil
	}
	uid := uint32(os.Geteuid())
	var removed []string
	for _, ent := range ents {
		name := ent.Name()
		rest, ok := strings.CutPrefix(name, ringPrefix)
		if !ok {
			continue
		}
		kind := uint32(syscall.S_IFREG)
		if r, bell := strings.CutSuffix(rest, bellSuffix); bell {
			rest, kind = r, syscall.S_IFIFO
		}
		f := strings.Split(rest, "-")
		if len(f) != 4 || f[0] != ns {
			continue
		}
		pid, err1 := strconv.Atoi(f[1])
		start, err2 := strconv.ParseUint(f[2], 10, 64)
		if err1 != nil || err2 != nil || pid <= 0 {
			continue
		}
		now, err := procwatch.StartTime(pid)
		if err == nil && now == start {
			continue // the creator lives
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			continue // cannot tell
		}
		var st syscall.Stat_t
		path := shmDir + "/" + name
		if syscall.Lstat(path, &st) != nil || st.Uid != uid || st.Mode&syscall.S_IFMT != kind {
			continue
		}
		if os.Remove(path) == nil {
			removed = append(removed, name)
		}
	}
	return removed
}

// unlink removes the creator's file name (the mapping stays); idempotent.
func (r *ring) unlink() {
	if r.path != "" {
		os.Remove(r.path)
		r.path = ""
	}
}

var errRingClosed = errors.New("bulk: ring closed")

func futex(addr *uint32, op int, val uint32, d time.Duration) {
	if op != futexWait {
		rawFutexWake(addr, uintptr(op), 0)
		return
	}
	t := syscall.NsecToTimespec(int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(op), uintptr(val), uintptr(unsafe.Pointer(&t)), 0, 0)
}

// futexSleep sleeps on addr while it holds val, for at most d, as one of
// the sleepers bits names (FUTEX_WAIT_BITSET: its timeout is absolute, on
// CLOCK_MONOTONIC).
func futexSleep(addr *uint32, val uint32, d time.Duration, bits uint32) {
	var now syscall.Timespec
	const clockMonotonic = 1
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&now)), 0)
	t := syscall.NsecToTimespec(syscall.TimespecToNsec(now) + int64(d))
	syscall.Syscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitBitset, uintptr(val), uintptr(unsafe.Pointer(&t)), 0, uintptr(bits))
}

// futexWakeBits wakes every sleeper on addr that bits name.
func futexWakeBits(addr *uint32, bits uint32) {
	rawFutexWake(addr, futexWakeBitset, uintptr(bits))
}

// wait blocks until ready reports true, spinning briefly and then sleeping
// on the futex word seq. It fails when either side closed or ctx ends.
// progress, when not nil, is other work the waiter does meanwhile (the
// inbound ring of an exchange): while it makes progress the waiter never
// sleeps, and its sleeps are short.
func (r *ring) wait(ctx context.Context, seq, waiters int, ready func() bool, progress func() bool) error {
	return r.waitSpin(ctx, seq, waiters, ready, progress, 0)
}

// waitSpin is wait that spins for at least spinFor before it sleeps: for a
// wait whose end is near and known (a peer copying a payload of known
// size), a futex sleep and wake would cost more.
func (r *ring) waitSpin(ctx context.Context, seq, waiters int, ready func() bool, progress func() bool, spinFor time.Duration) error {
	var start time.Time
	if spinFor > 0 {
		start = time.Now()
	}
	// With more ranks than cores, every check yields the core, and dozens
	// of waiters yielding to each other starve the ranks that have work:
	// check a few times, then sleep.
	n := spins
	if r.yield.Load() {
		n = 4
	}
	for {
		for i := 0; i < n; i++ {
			if ready() {
				return nil
			}
			if progress != nil && progress() {
				i = 0
				continue
			}
			// No runtime.Gosched: see core's spin (a goroutine called in
			// from C is locked to its thread, and a yield costs a kernel
			// hand-off). With more ranks than cores, give the core away:
			// the peer we wait for may need it.
			if r.yield.Load() {
				syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) // not raw: see core's osYield
			}
			if i == n-1 && spinFor > 0 && time.Since(start) < spinFor {
				i = 0
			}
		}
		if ready() {
			return nil
		}
		if r.closed.Load() || atomic.LoadUint32(r.u32(offProdClosed)) != 0 || atomic.LoadUint32(r.u32(offConsClosed)) != 0 {
			return errRingClosed
		}
		if ctx != nil {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		slot := sleepSlot
		if progress != nil {
			slot = progressSlot
		}
		atomic.AddUint32(r.u32(waiters), 1)
		s := atomic.LoadUint32(r.u32(seq))
		if !ready() {
			futex(r.u32(seq), futexWait, s, slot)
		}
		atomic.AddUint32(r.u32(waiters), ^uint32(0))
	}
}

func (r *ring) bump(seq, waiters int) {
	atomic.AddUint32(r.u32(seq), 1)
	if atomic.LoadUint32(r.u32(waiters)) != 0 {
		futex(r.u32(seq), futexWake, 1<<30, 0)
	}
}

// bumpIfWaiting is bump for a futex word that only wakes sleepers (not a
// count that is read as data, like offAckSeq): with nobody counted in
// waiters it writes nothing to the shared line. A waiter counts itself
// before it reads the word and checks its condition once more, so it sees
// the change it waits for or is seen here (both are sequentially
// consistent atomics).
func (r *ring) bumpIfWaiting(seq, waiters int) {
	if atomic.LoadUint32(r.u32(waiters)) != 0 {
		atomic.AddUint32(r.u32(seq), 1)
		futex(r.u32(seq), futexWake, 1<<30, 0)
	}
}

// bumpData publishes new data. It wakes a consumer waiting for the rest of
// a frame, and the idle reader only when someone needs it to deliver: a
// goroutine blocked on data from this ring (setWaiting), or a ring filling
// up. Otherwise a goroutine that polls (a receive about to wait, an
// exchange) takes the data, and a futex wake, which costs both processes
// a thread switch, is saved; data nobody asks for is drained when the
// idle reader's sleep times out (wakeIdle's timeouts).
//
// A thread asleep in a call for this data (sleepData) is woken directly,
// and only it: one futex wake, a few microseconds, where a wake of the
// idle reader that then wakes the waiting goroutine costs two thread
// switches and a pass through the Go scheduler.
//
// With nobody to wake, it writes nothing to the futex word's line: a
// polling consumer then reads only the head (see bumpIfWaiting for why no
// sleeper misses data). That holds while the idle reader sleeps unwanted,
// the usual state under a poller: an atomic add on the word there cost a
// cache-line transfer, 60-80 ns, on every small send. The bump only fails
// a sleep that races a wake-up, and there is no wake-up to race; an idle
// reader that sleeps through this data is what was asked.
func (r *ring) bumpData() {
	data, call, idle := atomic.LoadUint32(r.u32(offDataWait)), atomic.LoadUint32(r.u32(offCallWait)), atomic.LoadUint32(r.u32(offIdleWait))
	if data|call|idle == 0 {
		return
	}
	var bits uint32
	if data != 0 || call != 0 {
		bits = bitCall // Read's plain waits match any bit
	}
	if idle != 0 && (atomic.LoadUint32(r.u32(offWaiting)) != 0 || r.fillingUp()) {
		bits |= bitIdle
	}
	if bits == 0 {
		return // only the idle reader sleeps, unwanted (above)
	}
	atomic.AddUint32(r.u32(offDataSeq), 1)
	futexWakeBits(r.u32(offDataSeq), bits)
}

// fillingUp reports, on the producer side, whether the ring holds more than
// half its size. It reads the consumer's tail, a line the consumer writes
// at every read (a transfer each way, 60-80 ns), only when the tail the
// producer last saw (tailSeen, never ahead of the real one) says so.
func (r *ring) fillingUp() bool {
	head, half := r.headMine, (r.mask+1)/2
	if head-r.tailSeen <= half {
		return false
	}
	r.tailSeen = atomic.LoadUint64(r.u64(offTail))
	return head-r.tailSeen > half
}

// sleepData puts the calling thread to sleep until the producer publishes
// data, d passes, either side closes, or done reports true (checked after
// the sleep is announced, so a delivery by another goroutine that then
// calls nudge is not missed). It reports false, without sleeping, when the
// ring is closed: the caller must wait some other way.
func (r *ring) sleepData(done func() bool, d time.Duration) bool {
	if r.closed.Load() || atomic.LoadUint32(r.u32(offProdClosed)) != 0 || atomic.LoadUint32(r.u32(offConsClosed)) != 0 {
		return false
	}
	atomic.AddUint32(r.u32(offCallWait), 1)
	s := atomic.LoadUint32(r.u32(offDataSeq))
	if !done() && r.available() == 0 {
		futexSleep(r.u32(offDataSeq), s, d, bitCall)
	}
	atomic.AddUint32(r.u32(offCallWait), ^uint32(0))
	return true
}

// nudge wakes the threads asleep in sleepData on this (consumer) side: a
// goroutine of this process delivered data one of them may wait for.
func (r *ring) nudge() {
	atomic.AddUint32(r.u32(offDataSeq), 1)
	futexWakeBits(r.u32(offDataSeq), bitCall)
}

// wakeIdle wakes the idle reader if it sleeps. The word changes first, as
// for every wake-up here: a reader that has counted itself but not yet
// slept then finds it changed and does not sleep. (bumpData changes it
// only when it wakes someone, so this wake-up could otherwise be lost,
// and the data wait for the reader's timeout.)
func (r *ring) wakeIdle() {
	if atomic.LoadUint32(r.u32(offIdleWait)) != 0 {
		atomic.AddUint32(r.u32(offDataSeq), 1)
		futex(r.u32(offDataSeq), futexWake, 1<<30, 0)
	}
}

// available is the number of bytes the consumer can read now.
func (r *ring) available() uint64 {
	return atomic.LoadUint64(r.u64(offHead)) - atomic.LoadUint64(r.u64(offTail))
}

// waitData blocks the idle reader until data is available, either side
// closed, or d passed; it reports whether data is available.
func (r *ring) waitData(d time.Duration) (bool, error) {
	for i := 0; i < spins; i++ {
		if r.available() > 0 {
			return true, nil
		}
	}
	if r.closed.Load() || atomic.LoadUint32(r.u32(offProdClosed)) != 0 || atomic.LoadUint32(r.u32(offConsClosed)) != 0 {
		return r.available() > 0, errRingClosed
	}
	atomic.AddUint32(r.u32(offIdleWait), 1)
	s := atomic.LoadUint32(r.u32(offDataSeq))
	if r.available() == 0 {
		futexSleep(r.u32(offDataSeq), s, d, bitIdle)
	}
	atomic.AddUint32(r.u32(offIdleWait), ^uint32(0))
	return r.available() > 0, nil
}

// setWaiting adds delta to the count, on the consumer side, of goroutines
// blocked until data from this ring is delivered: while any is, the
// producer wakes the idle reader at once. Data that arrived before the
// count went up is handed to the idle reader now.
func (r *ring) setWaiting(delta int) {
	atomic.AddUint32(r.u32(offWaiting), uint32(int32(delta)))
	if delta > 0 && r.available() > 0 {
		r.wakeIdle()
	}
}

// Write copies p into the ring, blocking while it is full. On error some
// prefix of p may have been written. progress (may be nil) is called after
// each published piece and while waiting for space: the caller's other
// work, so that one goroutine can keep both directions of an exchange
// moving.
func (r *ring) Write(ctx context.Context, p []byte, progress func() bool) (int, error) {
	head := r.headMine
	size := r.mask + 1
	done := 0
	for done < len(p) {
		var free uint64
		ready := func() bool {
			free = size - (head - r.tailSeen)
			if free < uint64(len(p)-done) {
				r.tailSeen = atomic.LoadUint64(r.u64(offTail))
				free = size - (head - r.tailSeen)
			}
			return free > 0
		}
		if !ready() {
			r.wakeIdle() // full: whoever reads must run
		}
		err := r.wait(ctx, offSpaceSeq, offSpaceWait, ready, progress)
		if err != nil {
			return done, err
		}
		n := min(free, uint64(len(p)-done), publish)
		at := head & r.mask
		c := copy(r.data[at:], p[done:done+int(n)])
		if uint64(c) < n {
			copy(r.data, p[done+c:done+int(n)])
		}
		head += n
		done += int(n)
		r.headMine = head
		r.sync.release()
		atomic.StoreUint64(r.u64(offHead), head)
		r.bumpData()
		if progress != nil && done < len(p) {
			progress()
		}
	}
	return done, nil
}

// Read copies at least one byte into p, blocking while the ring is empty.
// It returns io.EOF once the producer closed and everything was read.
func (r *ring) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var avail uint64
	err := r.wait(nil, offDataSeq, offDataWait, func() bool {
		avail = r.available()
		return avail > 0
	}, nil)
	if err != nil {
		if atomic.LoadUint32(r.u32(offProdClosed)) != 0 && !r.closed.Load() {
			return 0, io.EOF
		}
		return 0, err
	}
	return r.TryRead(p), nil
}

// TryRead copies what is available, up to len(p) bytes, without waiting.
func (r *ring) TryRead(p []byte) int {
	tail := atomic.LoadUint64(r.u64(offTail))
	avail := atomic.LoadUint64(r.u64(offHead)) - tail
	n := min(avail, uint64(len(p)), publish)
	if n == 0 {
		return 0
	}
	r.sync.acquire()
	at := tail & r.mask
	c := copy(p[:n], r.data[at:])
	if uint64(c) < n {
		copy(p[c:n], r.data)
	}
	atomic.StoreUint64(r.u64(offTail), tail+n)
	r.bumpIfWaiting(offSpaceSeq, offSpaceWait)
	return int(n)
}

// setPresence writes the consumer's presence word (presence.go): a plain
// store, not an atomic one, which on amd64 would stall the poller until
// the line is its own again after every read by the producer; an aligned
// word is never torn, and the word is a hint that orders nothing.
func (r *ring) setPresence(v uint64) { *r.u64(offPresence) = v }

// presence reads the consumer's presence word (producer side).
func (r *ring) presence() uint64 { return *r.u64(offPresence) }

// remoteOK reports whether the consumer can copy payloads straight out of
// this (producer) process's memory.
func (r *ring) remoteOK() bool { return atomic.LoadUint32(r.u32(offRemoteOK)) != 0 }

// setRemoteOK records, on the consumer side, that it can read the
// producer's memory.
func (r *ring) setRemoteOK() { atomic.StoreUint32(r.u32(offRemoteOK), 1) }

// sentRemote counts a remote frame written by the producer and returns its
// number, to wait for with waitAck.
func (r *ring) sentRemote() uint32 {
	r.remoteSent++
	return r.remoteSent
}

// ack tells the producer that the consumer has copied one more remote frame.
func (r *ring) ack() { r.bump(offAckSeq, offAckWait) }

// waitAck blocks the producer until remote frame k has been copied (or the
// ring closes, or ctx ends), running progress meanwhile like Write.
func (r *ring) waitAck(ctx context.Context, k uint32, n int, progress func() bool) error {
	// The receiver copies n bytes at several GB/s: spin that long.
	spin := 20*time.Microsecond + time.Duration(n/4096)*time.Microsecond
	return r.waitSpin(ctx, offAckSeq, offAckWait, func() bool {
		return int32(atomic.LoadUint32(r.u32(offAckSeq))-k) >= 0
	}, progress, spin)
}

// closedErr says why an empty ring will deliver nothing more: io.EOF when
// the producer closed it, errRingClosed when this side did, nil while open.
func (r *ring) closedErr() error {
	switch {
	case r.closed.Load():
		return errRingClosed
	case atomic.LoadUint32(r.u32(offProdClosed)) != 0:
		return io.EOF
	}
	return nil
}

// Close marks this side closed in the shared header, wakes both sides and
// unlinks the file if still named. The mapping is released by release once
// no goroutine uses the ring any more.
func (r *ring) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	off := offConsClosed
	if r.producer {
		off = offProdClosed
	}
	atomic.StoreUint32(r.u32(off), 1)
	atomic.AddUint32(r.u32(offDataSeq), 1)
	futex(r.u32(offDataSeq), futexWake, 1<<30, 0)
	r.bump(offSpaceSeq, offSpaceWait)
	futex(r.u32(offAckSeq), futexWake, 1<<30, 0)
	r.unlink()
	return nil
}

// producerGone marks, on the consumer side, the producer closed, as its
// Close would have: its process is dead. The reader delivers what the ring
// holds and then ends with io.EOF.
func (r *ring) producerGone() {
	atomic.StoreUint32(r.u32(offProdClosed), 1)
	atomic.AddUint32(r.u32(offDataSeq), 1)
	futex(r.u32(offDataSeq), futexWake, 1<<30, 0)
}

// release unmaps the ring; call only when no Read or Write can run.
func (r *ring) release() {
	if !r.unmapped.Swap(true) {
		syscall.Munmap(r.mem)
	}
}

func shmSupported() bool {
	st, err := os.Stat(shmDir)
	return err == nil && st.IsDir()
}

// rawFutexWake wakes every sleeper on addr (op futexWake, or
// futexWakeBitset with the sleepers bits names) without telling the Go
// scheduler: a wake never blocks, and through syscall.Syscall one that
// lets the woken thread run first and keeps this one off its CPU past
// sysmon's 20 µs loses the P to another thread, and the goroutine then
// resumes on a different thread after a wake-up of its own.
func rawFutexWake(addr *uint32, op, bits uintptr) {
	syscall.RawSyscall6(syscall.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), op, 1<<30, 0, 0, bits)
}
