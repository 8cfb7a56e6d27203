package membership

import (
	"fmt"
	"slices"
)

// Generation numbers the memberships of one world: First for the world the
// seed formed, one more for each change. The zero Generation is no
// membership.
type Generation uint32

// First is the generation of a world as the seed formed it.
const First Generation = 1

// View is one membership of a world: its generation and its members, as
// world ranks in ascending order (a member's index in Members is its rank
// in the view). A View is a value: a change derives the next one and
// leaves this one as it was, so Views are safe to share between
// goroutines.
type View struct {
	Gen     Generation
	members []int
	next    int // one more than the highest world rank any view of this world held
}

// Initial is the first view of a world of size ranks: every rank, First.
func Initial(size int) View {
	m := make([]int, size)
	for i := range m {
		m[i] = i
	}
	return View{Gen: First, members: m, next: size}
}

// Size is the number of members.
func (v View) Size() int { return len(v.members) }

// Members returns the members' world ranks in ascending order (a copy).
func (v View) Members() []int { return slices.Clone(v.members) }

// Index returns world rank w's rank in v, or false when w is not a member.
func (v View) Index(w int) (int, bool) {
	return slices.BinarySearch(v.members, w)
}

// Contains reports whether world rank w is a member.
func (v View) Contains(w int) bool {
	_, ok := v.Index(w)
	return ok
}

// Without is the next view: v less the world ranks gone. Every rank gone
// must be a member, and one member at least must remain.
func (v View) Without(gone ...int) (View, error) {
	if v.Gen == 0 {
		return View{}, fmt.Errorf("membership: no view to change")
	}
	drop := make(map[int]bool, len(gone))
	for _, w := range gone {
		if !v.Contains(w) {
			return View{}, fmt.Errorf("membership: world rank %d is not a member of generation %d", w, v.Gen)
		}
		drop[w] = true
	}
	if len(drop) == len(v.members) {
		return View{}, fmt.Errorf("membership: removing every member of generation %d leaves no world", v.Gen)
	}
	next := make([]int, 0, len(v.members)-len(drop))
	for _, w := range v.members {
		if !drop[w] {
			next = append(next, w)
		}
	}
	return View{Gen: v.Gen + 1, members: next, next: v.next}, nil
}

// With is the next view: v and n new members, given the world ranks after
// the highest any view of this world held (world ranks are never reused,
// so a departed rank cannot be taken for a newcomer). It returns the new
// members' world ranks too.
func (v View) With(n int) (View, []int, error) {
	if v.Gen == 0 {
		return View{}, nil, fmt.Errorf("membership: no view to change")
	}
	if n < 1 {
		return View{}, nil, fmt.Errorf("membership: adding %d members", n)
	}
	added := make([]int, n)
	for i := range added {
		added[i] = v.next + i
	}
	return View{Gen: v.Gen + 1, members: append(slices.Clone(v.members), added...), next: v.next + n}, added, nil
}

// String is for logs: "generation 2: [0 1 3]".
func (v View) String() string { return fmt.Sprintf("generation %d: %v", v.Gen, v.members) }
