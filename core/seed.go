package core

import (
	"errors"
	"log/slog"

	"github.com/nexar-go/nexar/membership"
)

// Seed is the rendezvous service of one job (package membership).
type Seed = membership.Seed

// StartSeed listens on addr (UDP host:port) for worldSize joiners holding
// token; see membership.StartSeed. Its errors are *Error.
func StartSeed(addr string, worldSize int, token []byte) (*Seed, error) {
	return startSeed(addr, worldSize, token, nil)
}

func startSeed(addr string, worldSize int, token []byte, log *slog.Logger) (*Seed, error) {
	s, err := membership.StartSeed(addr, worldSize, token, log)
	if err != nil {
		return nil, fromMembership(err)
	}
	return s, nil
}

// fromMembership turns a *membership.Error into an *Error with its code,
// operation, message and cause; other errors become CodeInternal.
func fromMembership(err error) error {
	if err == nil {
		return nil
	}
	var me *membership.Error
	if errors.As(err, &me) {
		return &Error{Code: Code(me.Code), Op: me.Op, Rank: -1, Msg: me.Msg, Cause: me.Cause}
	}
	return &Error{Code: CodeInternal, Op: "rendezvous", Rank: -1, Msg: err.Error(), Cause: err}
}
