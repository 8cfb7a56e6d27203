//go:build !race

// Package race says whether the race detector is on, for the tests that
// shrink or skip work it would slow by an order of magnitude. It is the
// one definition the module's packages share.
package race

// Enabled reports whether the binary was built with the race detector.
const Enabled = false
