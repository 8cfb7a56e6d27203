//go:build !race

package bulk

// raceSync is empty without the race detector (racesync_on.go).
type raceSync struct{}

func (*raceSync) release() {}
func (*raceSync) acquire() {}
