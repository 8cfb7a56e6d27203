package bulk

import (
	"bytes"
	"fmt"
	"unsafe"

	"github.com/nexar-go/nexar/transport/internal/record"
)

// This file describes the endpoint for diagnostics: the paths, the local
// peers, the rings' memory, and what this machine offers (nexar info).

// Paths says which path carries this rank's data to each peer.
func (e *Endpoint) Paths() map[int]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := make(map[int]string, e.size)
	for r, p := range e.paths {
		if ch := e.out[r].Load(); ch != nil && ch.ring != nil && ch.remoteMin > 0 && ch.ring.remoteOK() {
			p += fmt.Sprintf(", cross-memory attach from %d KiB", ch.remoteMin>>10)
		}
		if end, ok := rdmaChannel(e.out[r].Load()); ok && end.Detail() != "" {
			p += ", " + end.Detail()
		}
		m[r] = p
	}
	return m
}

// LocalPeers is the number of peers whose data comes over shared-memory
// rings, made or to be made on first use: the other ranks on this host.
func (e *Endpoint) LocalPeers() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.neg.localPeers()
}

// RingBytes returns the capacity of the shared-memory rings this process
// created: data rings (charged to Options.RingBudget) and RPC rings (a
// quarter of it on top, rpcchan.go).
func (e *Endpoint) RingBytes() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rpc.mu.Lock()
	defer e.rpc.mu.Unlock()
	return int64(e.ringBytes + e.rpc.ringBytes)
}

func ringDesc(size int) string {
	if size >= 1<<20 {
		return fmt.Sprintf("shm %d MiB ring", size>>20)
	}
	return fmt.Sprintf("shm %d KiB ring", size>>10)
}

// Available describes, for `nexar info`, what this build and machine offer:
// shared-memory rings, cross-memory attach (tried on this process; each pair
// of ranks is probed again when it connects) and TCP.
func Available() (shm, cma, tcp string) {
	shm = "unavailable: needs Linux and a writable " + shmDir
	if shmSupported() {
		if r, _, _, err := createRing(64 << 10); err == nil {
			r.Close()
			r.release()
			shm = fmt.Sprintf("yes (%s; %d MiB ring per direction between ranks of one host)", shmDir, DefaultRingSize>>20)
		} else {
			shm = "unavailable: " + err.Error()
		}
	}
	cma = "unavailable on this platform"
	if cmaSupported {
		probe := []byte("nexar cross-memory attach probe")
		got := make([]byte, len(probe))
		if err := readRemote(selfPID(), uint64(uintptr(unsafe.Pointer(&probe[0]))), got); err != nil {
			cma = "unavailable: " + err.Error()
		} else if !bytes.Equal(got, probe) {
			cma = "unavailable: process_vm_readv returned wrong data"
		} else {
			cma = fmt.Sprintf("yes (process_vm_readv; payloads from %d KiB on shared-memory paths)", DefaultRemoteMin>>10)
		}
	}
	tcp = fmt.Sprintf("yes (%d connections per direction between hosts, authenticated by TLS 1.3, data sealed with %s unless NEXAR_BULK_PLAINTEXT=1)", DefaultConns, record.AES128GCM)
	return shm, cma, tcp
}

// RPCPaths says which path carries this rank's RPC to each peer: "quic"
// until a first call negotiated a channel. Safe for concurrent use.
func (e *Endpoint) RPCPaths() map[int]string {
	s := e.rpc
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[int]string, e.size)
	for r, p := range s.paths {
		if r == e.self {
			continue
		}
		if ch := s.out[r].Load(); ch != nil && ch.r != nil && ch.remoteMin > 0 && ch.r.remoteOK() {
			p += fmt.Sprintf(", cross-memory attach from %d KiB", ch.remoteMin>>10)
		}
		m[r] = p
	}
	return m
}
