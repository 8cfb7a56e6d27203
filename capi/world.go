package main

import (
	"context"

	"github.com/nexar-go/nexar/core"
)

// newWorld joins the world cfg describes.
//
// TODO(capi): switch to core.New once core has it; until then only
// single-rank worlds (over the in-memory transport) can be created.
func newWorld(_ context.Context, cfg core.Config) (*core.Comm, error) {
	if cfg.WorldSize != 1 {
		return nil, &core.Error{Code: core.CodeInternal, Op: "new", Rank: -1,
			Msg: "multi-rank worlds need core.New, which this build lacks"}
	}
	cs, err := core.NewLocal(1, cfg)
	if err != nil {
		return nil, err
	}
	return cs[0], nil
}
