//go:build !cgo

package rdma

import "fmt"

var errNoCgo = fmt.Errorf("%w (built without cgo)", ErrNoLibrary)

// Lib cannot be loaded without cgo; no value of it exists.
type Lib struct{}

// Default fails: a build without cgo cannot dlopen.
func Default() (*Lib, error) { return nil, errNoCgo }

// Open fails: a build without cgo cannot dlopen.
func Open(path string) (*Lib, error) { return nil, errNoCgo }

// Path is empty: no library.
func (l *Lib) Path() string { return "" }

// Devices fails: no library.
func (l *Lib) Devices() ([]Device, error) { return nil, errNoCgo }
