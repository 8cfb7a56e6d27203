//go:build !linux || !(amd64 || arm64)

package bulk

import "errors"

const cmaSupported = false

func readRemote(int, uint64, []byte) error {
	return errors.New("bulk: cross-memory attach is not available on this platform")
}

func selfPID() int { return 0 }
