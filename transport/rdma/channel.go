package rdma

import "context"

// Channel is one end of a channel as transport/bulk drives it (its
// RDMAEnd): an alias of an interface literal, so that Device implements
// bulk's RDMA interface without either package importing the other.
type Channel = interface {
	Read(p []byte) (int, error)
	ReadOnce(p []byte) (int, error)
	Write(ctx context.Context, bufs ...[]byte) (int, error)
	Accept(params []byte) error
	Detail() string
	Failed() <-chan struct{}
	Err() error
	Close() error
}
