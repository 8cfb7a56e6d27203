package core

import (
	"context"

	"github.com/nexar-go/nexar/transport"
	"github.com/nexar-go/nexar/transport/mesh"
)

// The tests make their communicators through these, which give a Config
// without a mesh builder (Config.Mesh) the default one: core names no
// concrete transport, so it has no default of its own.

func withMesh(cfg Config) Config {
	if cfg.Mesh == nil {
		cfg.Mesh = mesh.Builder{}
	}
	return cfg
}

func testNew(ctx context.Context, cfg Config) (*Comm, error) { return New(ctx, withMesh(cfg)) }

func testJoin(ctx context.Context, cfg Config) (*Comm, error) { return Join(ctx, withMesh(cfg)) }

func testNewLocal(n int, cfg Config) ([]*Comm, error) { return NewLocal(n, withMesh(cfg)) }

func testNewLocalQUIC(n int, cfg Config) ([]*Comm, error) { return NewLocalQUIC(n, withMesh(cfg)) }

func testNewLocalWrapped(n int, cfg Config, wrap func(int, transport.DataPath) transport.DataPath) ([]*Comm, error) {
	return newLocalWrapped(n, withMesh(cfg), wrap)
}

func testForm(ctx context.Context, cfg Config, o formOpts) (*Comm, error) {
	return form(ctx, withMesh(cfg), o)
}

func testNewQUIC(ctx context.Context, cfg Config, embed bool) (*Comm, error) {
	return newQUIC(ctx, withMesh(cfg), embed)
}
