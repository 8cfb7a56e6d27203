package main

import (
	"context"

	"github.com/nexar-go/nexar/core"
)

// newWorld joins the world cfg describes (rendezvous plus QUIC mesh).
func newWorld(ctx context.Context, cfg core.Config) (*core.Comm, error) {
	return core.New(ctx, cfg)
}
