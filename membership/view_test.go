package membership

import (
	"slices"
	"testing"
)

func TestViewChanges(t *testing.T) {
	v := Initial(4)
	if v.Gen != First || !slices.Equal(v.Members(), []int{0, 1, 2, 3}) {
		t.Fatalf("Initial(4) = %v", v)
	}
	for _, tc := range []struct {
		name    string
		change  func(View) (View, error)
		members []int
		gen     Generation
		fails   bool
	}{
		{"without one", func(v View) (View, error) { return v.Without(2) }, []int{0, 1, 3}, 2, false},
		{"without several", func(v View) (View, error) { return v.Without(3, 0) }, []int{1, 2}, 2, false},
		{"without a stranger", func(v View) (View, error) { return v.Without(7) }, nil, 0, true},
		{"without everyone", func(v View) (View, error) { return v.Without(0, 1, 2, 3) }, nil, 0, true},
		{"with two", func(v View) (View, error) { w, _, err := v.With(2); return w, err }, []int{0, 1, 2, 3, 4, 5}, 2, false},
		{"with none", func(v View) (View, error) { w, _, err := v.With(0); return w, err }, nil, 0, true},
		{"shrink then grow: ranks are not reused", func(v View) (View, error) {
			w, err := v.Without(3)
			if err != nil {
				return w, err
			}
			w, _, err = w.With(1)
			return w, err
		}, []int{0, 1, 2, 4}, 3, false},
		{"from no view", func(View) (View, error) { return View{}.Without(0) }, nil, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := tc.change(v)
			if tc.fails {
				if err == nil {
					t.Fatalf("got %v, want an error", w)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if w.Gen != tc.gen || !slices.Equal(w.Members(), tc.members) {
				t.Fatalf("got %v, want generation %d: %v", w, tc.gen, tc.members)
			}
			if v.Gen != First || v.Size() != 4 {
				t.Fatalf("the change altered the view it started from: %v", v)
			}
		})
	}
}

func TestViewIndex(t *testing.T) {
	w, err := Initial(5).Without(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	for world, want := range map[int]int{0: 0, 2: 1, 4: 2} {
		if r, ok := w.Index(world); !ok || r != want {
			t.Errorf("Index(%d) = %d, %v; want %d", world, r, ok, want)
		}
	}
	for _, gone := range []int{1, 3, 5, -1} {
		if w.Contains(gone) {
			t.Errorf("Contains(%d) after it left", gone)
		}
	}
	m := w.Members()
	m[0] = 99
	if !w.Contains(0) {
		t.Fatal("Members returned the view's own slice")
	}
}
