package collective

import "context"

// Barrier returns on every rank only after all ranks have entered it. It is
// the dissemination barrier: in round k (k = 1, 2, 4, ...) rank r signals
// r+k and waits for r-k, so after ceil(log2 size) rounds every rank has
// heard, directly or transitively, from every other.
func Barrier(ctx context.Context, l Link) error {
	rank, size, err := checkLink(l)
	if err != nil {
		return err
	}
	var st steps
	st.init(l)
	for k := 1; k < size; k <<= 1 {
		if err := st.exchange(ctx, l, (rank+k)%size, nil, mod(rank-k, size), nil); err != nil {
			return err
		}
	}
	return nil
}
