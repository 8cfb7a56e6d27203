//go:build !rdma || !cgo

package rdma

// Available reports why RDMA cannot be used: this build has no verbs bindings.
func Available() error { return ErrUnavailable }

// Devices returns ErrUnavailable in a build without the rdma tag.
func Devices() ([]Device, error) { return nil, ErrUnavailable }

// Enabled reports whether this binary was built with the verbs bindings.
const Enabled = false
