//go:build cgo

package main

import (
	"context"

	"github.com/nexar-go/nexar/core"

	"github.com/nexar-go/nexar/transport/mesh"
)

// newWorld joins the world cfg describes (rendezvous plus QUIC mesh).
func newWorld(ctx context.Context, cfg core.Config) (*core.Comm, error) {
	cfg.Mesh = mesh.Builder{} // the transports (package transport/mesh)
	return core.New(ctx, cfg)
}
