//go:build race

package quictransport

const raceEnabled = true
