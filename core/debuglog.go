package core

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// This file is NEXAR_DEBUG (docs/diagnostics.md): a level and subsystems,
// like NCCL_DEBUG and NCCL_DEBUG_SUBSYS, that build the default
// Config.Logger: a text logger on stderr that passes records at or above
// the level whose subsystem (the "subsys" attribute) is selected. Records
// without a subsystem pass on their level alone.

// LevelTrace is the slog level of NEXAR_DEBUG=TRACE: one record per
// operation started and completed (subsystems COLL and P2P).
const LevelTrace = slog.LevelDebug - 4

// The subsystems of NEXAR_DEBUG_SUBSYS; a record names its own in the
// "subsys" attribute.
const (
	SubsysInit   = "INIT"   // configuration, rendezvous, mesh formation
	SubsysColl   = "COLL"   // collectives
	SubsysP2P    = "P2P"    // point-to-point messages
	SubsysNet    = "NET"    // transports and data paths
	SubsysFlight = "FLIGHT" // the flight recorder's dumps
)

// debugSubsystems lists the subsystems NEXAR_DEBUG_SUBSYS names.
func debugSubsystems() []string {
	return []string{SubsysInit, SubsysColl, SubsysP2P, SubsysNet, SubsysFlight}
}

// debugLevel parses NEXAR_DEBUG.
func debugLevel(v string) (slog.Level, error) {
	switch strings.ToUpper(strings.TrimSpace(v)) {
	case "WARN", "WARNING":
		return slog.LevelWarn, nil
	case "INFO":
		return slog.LevelInfo, nil
	case "DEBUG":
		return slog.LevelDebug, nil
	case "TRACE":
		return LevelTrace, nil
	}
	return 0, fmt.Errorf("core: NEXAR_DEBUG=%q: want WARN, INFO, DEBUG or TRACE", v)
}

// debugSubsys parses NEXAR_DEBUG_SUBSYS: a comma-separated list of
// subsystems (or ALL); a leading ^ selects every subsystem but those
// listed. Empty: ALL.
func debugSubsys(v string) (map[string]bool, error) {
	v = strings.ToUpper(strings.TrimSpace(v))
	all := debugSubsystems()
	on := make(map[string]bool, len(all))
	except := strings.HasPrefix(v, "^")
	v = strings.TrimPrefix(v, "^")
	if v == "" || v == "ALL" {
		for _, s := range all {
			on[s] = !except
		}
		return on, nil
	}
	for _, s := range all {
		on[s] = except
	}
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "ALL" {
			for _, t := range all {
				on[t] = !except
			}
			continue
		}
		if _, ok := on[s]; !ok {
			return nil, fmt.Errorf("core: NEXAR_DEBUG_SUBSYS: unknown subsystem %q (want %s or ALL, optionally after ^)",
				s, strings.Join(all, ","))
		}
		on[s] = !except
	}
	return on, nil
}

// newDebugLogger is the logger of NEXAR_DEBUG=level and
// NEXAR_DEBUG_SUBSYS=subsys, writing text records to w.
func newDebugLogger(w io.Writer, level, subsys string) (*slog.Logger, error) {
	lv, err := debugLevel(level)
	if err != nil {
		return nil, err
	}
	on, err := debugSubsys(subsys)
	if err != nil {
		return nil, err
	}
	h := slog.NewTextHandler(w, &slog.HandlerOptions{Level: lv})
	return slog.New(&subsysHandler{h: h, on: on}), nil
}

// debugLoggerFromEnv is newDebugLogger over the variables lookup finds;
// nil when NEXAR_DEBUG is not set.
func debugLoggerFromEnv(lookup func(string) (string, bool), w io.Writer) (*slog.Logger, error) {
	level, ok := lookup("NEXAR_DEBUG")
	if !ok || strings.TrimSpace(level) == "" {
		return nil, nil
	}
	subsys, _ := lookup("NEXAR_DEBUG_SUBSYS")
	return newDebugLogger(w, level, subsys)
}

// subsysHandler drops records of subsystems not selected. The subsystem is
// a record's "subsys" attribute, or one the logger was given With it.
// Immutable once built.
type subsysHandler struct {
	h      slog.Handler
	on     map[string]bool
	subsys string // from WithAttrs
}

func (s *subsysHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return s.h.Enabled(ctx, l) && (s.subsys == "" || s.on[s.subsys])
}

func (s *subsysHandler) Handle(ctx context.Context, r slog.Record) error {
	sub := s.subsys
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "subsys" {
			sub = a.Value.String()
			return false
		}
		return true
	})
	if sub != "" && !s.on[sub] {
		return nil
	}
	return s.h.Handle(ctx, r)
}

func (s *subsysHandler) WithAttrs(as []slog.Attr) slog.Handler {
	t := &subsysHandler{h: s.h.WithAttrs(as), on: s.on, subsys: s.subsys}
	for _, a := range as {
		if a.Key == "subsys" {
			t.subsys = a.Value.String()
		}
	}
	return t
}

func (s *subsysHandler) WithGroup(name string) slog.Handler {
	return &subsysHandler{h: s.h.WithGroup(name), on: s.on, subsys: s.subsys}
}

// traceOn reports whether l takes LevelTrace records of subsystem subsys.
func traceOn(l *slog.Logger, subsys string) bool {
	if l == nil {
		return false
	}
	return l.With("subsys", subsys).Enabled(context.Background(), LevelTrace)
}
