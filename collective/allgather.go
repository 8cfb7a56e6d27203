package collective

import (
	"context"
	"fmt"
)

// Allgather concatenates every rank's send, in rank order, into recv
// (size*len(send) bytes) on every rank. send == nil means this rank's block
// is already in place in recv.
func Allgather(ctx context.Context, l Link, send, recv []byte) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if len(recv)%size != 0 || (send != nil && len(recv) != size*len(send)) {
		return fmt.Errorf("collective: allgather recv has %d bytes, want %d blocks of %d", len(recv), size, len(send))
	}
	blk := len(recv) / size
	auto := AlgoRing
	if len(recv) < l.Tuning().AllgatherBruckThreshold {
		auto = AlgoBruck
	}
	algo, err := choose("allgather", l.Tuning().Force.Allgather, auto, AlgoBruck, AlgoRing)
	if err != nil {
		return err
	}
	prepare(l, send, recv)
	// The blocks' headers on the stack in a small world: a barrier is an
	// allgather of signatures, often one before every small call.
	var small [smallWorld][]byte
	blocks := small[:0]
	if size > smallWorld {
		blocks = make([][]byte, 0, size)
	}
	blocks = appendEqblocks(blocks, recv, size, blk)
	if send != nil {
		copy(blocks[rank], send)
	}
	if size == 1 || blk == 0 {
		return nil
	}
	if algo == AlgoRing && l.Tuning().Force.Allgather == AlgoAuto {
		if h, ok := twoLevel(l); ok && l.Tuning().Layout == nil {
			return hierAllgather(ctx, l, h, recv, blk)
		}
	}
	var st steps
	st.init(l)
	if algo == AlgoRing {
		return st.ringAllgather(ctx, l, blocks)
	}
	// Bruck: tmp[i] holds the block of rank (rank+i) mod size. In round k
	// a rank has the first k blocks and fetches the next min(k, size-k)
	// from rank+k, which holds them as its own first ones.
	tmp := scratchOf(l).Get(len(recv))
	defer scratchOf(l).Put(tmp)
	copy(tmp, blocks[rank])
	for k := 1; k < size; k <<= 1 {
		c := min(k, size-k)
		if err := st.exchange(ctx, l, mod(rank-k, size), tmp[:c*blk], mod(rank+k, size), tmp[k*blk:(k+c)*blk]); err != nil {
			return err
		}
	}
	for i := 1; i < size; i++ {
		copy(blocks[(rank+i)%size], tmp[i*blk:(i+1)*blk])
	}
	return nil
}

// Allgatherv places rank i's send at recv[displs[i]:displs[i]+counts[i]] on
// every rank (counts and displacements in bytes, equal on all ranks). send
// == nil means this rank's block is already in place.
func Allgatherv(ctx context.Context, l Link, send, recv []byte, counts, displs []int) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := checkV("allgatherv", counts, displs, size, len(recv)); err != nil {
		return err
	}
	if send != nil && len(send) != counts[rank] {
		return fmt.Errorf("collective: allgatherv rank %d sends %d bytes, counts say %d", rank, len(send), counts[rank])
	}
	blocks := vblocks(recv, counts, displs)
	if send != nil {
		copy(blocks[rank], send)
	}
	if size == 1 {
		return nil
	}
	prepare(l, send, recv)
	var st steps
	st.init(l)
	return st.ringAllgather(ctx, l, blocks)
}

// Alltoall sends block j of send to rank j, which stores it as block Rank()
// of its recv; blocks are len(recv)/size bytes. send == nil means in place:
// the outgoing blocks are in recv.
func Alltoall(ctx context.Context, l Link, send, recv []byte) error {
	_, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if len(recv)%size != 0 || (send != nil && len(send) != len(recv)) {
		return fmt.Errorf("collective: alltoall buffers of %d and %d bytes are not %d equal blocks", len(send), len(recv), size)
	}
	blk := len(recv) / size
	auto := AlgoPairwise
	if size > 2 && len(recv) < l.Tuning().AlltoallBruckThreshold {
		auto = AlgoBruck
	}
	// The two-level schedule only when forced: at 2 hosts x 2 ranks it
	// took longer than the flat ones at every size measured (hosts.go).
	hosts, hier := twoLevel(l)
	algo, err := choose("alltoall", l.Tuning().Force.Alltoall, auto, AlgoBruck, AlgoPairwise, AlgoHier)
	if err != nil {
		return err
	}
	if algo == AlgoHier && !hier {
		return fmt.Errorf("collective: alltoall's hier algorithm needs Tuning.Hosts with at least two hosts of equal rank counts (two or more each); have %v", hostsDesc(l))
	}
	prepare(l, send, recv)
	if algo == AlgoHier && blk > 0 {
		return hierAlltoall(ctx, l, hosts, send, recv, blk)
	}
	if algo == AlgoBruck && size > 1 && blk > 0 {
		var st steps
		st.init(l)
		return st.bruckAlltoall(ctx, l, send, recv, blk)
	}
	counts, displs := make([]int, size), make([]int, size)
	for i := range counts {
		counts[i], displs[i] = blk, i*blk
	}
	if send == nil {
		return alltoallv(ctx, l, nil, counts, displs, recv, counts, displs)
	}
	return alltoallv(ctx, l, send, counts, displs, recv, counts, displs)
}

// bruckAlltoall is Bruck's all-to-all: ceil(log2 size) steps instead of
// size-1, each moving about half the blocks, so it wins for small blocks.
// tmp[i] starts as the block for rank+i; in the step of bit k every rank
// sends the blocks whose index has bit k set to rank+k and receives the
// same indexes from rank-k. A block for rank d from rank s travels at index
// d-s, by the bits of d-s, so at the end tmp[i] came from rank-i.
func (st *steps) bruckAlltoall(ctx context.Context, l Link, send, recv []byte, blk int) error {
	rank, size := l.Rank(), l.Size()
	in := send
	if in == nil {
		in = recv
	}
	tmp := scratchOf(l).Get(size * blk)
	defer scratchOf(l).Put(tmp)
	for i := 0; i < size; i++ {
		j := (rank + i) % size
		copy(tmp[i*blk:(i+1)*blk], in[j*blk:(j+1)*blk])
	}
	out, back := scratchOf(l).Get(size*blk), scratchOf(l).Get(size*blk)
	defer scratchOf(l).Put(out)
	defer scratchOf(l).Put(back)
	for k := 1; k < size; k <<= 1 {
		n := 0
		for i := k; i < size; i++ {
			if i&k != 0 {
				copy(out[n*blk:(n+1)*blk], tmp[i*blk:(i+1)*blk])
				n++
			}
		}
		if err := st.exchange(ctx, l, (rank+k)%size, out[:n*blk], mod(rank-k, size), back[:n*blk]); err != nil {
			return err
		}
		n = 0
		for i := k; i < size; i++ {
			if i&k != 0 {
				copy(tmp[i*blk:(i+1)*blk], back[n*blk:(n+1)*blk])
				n++
			}
		}
	}
	for i := 0; i < size; i++ {
		j := mod(rank-i, size)
		copy(recv[j*blk:(j+1)*blk], tmp[i*blk:(i+1)*blk])
	}
	return nil
}

// Alltoallv sends send[sdispls[j]:+scounts[j]] to rank j, which stores it at
// recv[rdispls[i]:+rcounts[i]] for sender i (all in bytes). send == nil means
// in place: the outgoing blocks are in recv, laid out by rcounts/rdispls.
func Alltoallv(ctx context.Context, l Link, send []byte, scounts, sdispls []int, recv []byte, rcounts, rdispls []int) error {
	_, size, err := checkLink(l)
	if err != nil {
		return err
	}
	if err := checkV("alltoallv recv", rcounts, rdispls, size, len(recv)); err != nil {
		return err
	}
	if send != nil {
		if err := checkV("alltoallv send", scounts, sdispls, size, len(send)); err != nil {
			return err
		}
	}
	prepare(l, send, recv)
	return alltoallv(ctx, l, send, scounts, sdispls, recv, rcounts, rdispls)
}

// alltoallv is the pairwise exchange: in step s rank r sends to r+s and
// receives from r-s, so every rank talks to one peer at a time in each
// direction.
func alltoallv(ctx context.Context, l Link, send []byte, scounts, sdispls []int, recv []byte, rcounts, rdispls []int) error {
	rank, size := l.Rank(), l.Size()
	if send == nil {
		send = scratchOf(l).Get(len(recv))
		defer scratchOf(l).Put(send)
		copy(send, recv)
		scounts, sdispls = rcounts, rdispls
	}
	sb, rb := vblocks(send, scounts, sdispls), vblocks(recv, rcounts, rdispls)
	if len(sb[rank]) != len(rb[rank]) {
		return fmt.Errorf("collective: alltoallv rank %d sends itself %d bytes but expects %d", rank, len(sb[rank]), len(rb[rank]))
	}
	copy(rb[rank], sb[rank])
	var st steps
	st.init(l)
	for s := 1; s < size; s++ {
		to, from := (rank+s)%size, mod(rank-s, size)
		if err := st.exchange(ctx, l, to, sb[to], from, rb[from]); err != nil {
			return err
		}
	}
	return nil
}
