//go:build !race

package quictransport

const raceEnabled = false
