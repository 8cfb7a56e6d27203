// Package membership owns who is in the world: the seed that forms it
// (rendezvous: StartSeed, Join), and the view of its members with the
// generation that numbers each membership (View).
//
// Every message core sends carries the generation of the view it was sent
// in, and a receiver drops what another generation sent, so that no
// message crosses from one membership to the next. Today a world has one
// view for its life (generation 1, from the seed's welcome); shrinking and
// growing it (issue 10) derive the next view from the current one
// (View.Without, View.With) after the survivors agree on it.
package membership
