package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nexar-go/nexar/core"
)

const seedSynopsis = "seed --listen ADDR --world-size N [--token-file F] [--persist]"

// seedLinger bounds how long a stand-alone seed stays up after the job
// formed: until every rank reported its mesh formed (so that a rank lost
// meanwhile is reported to the others), at most this long.
const seedLinger = 60 * time.Second

func cmdSeed(args []string, stderr io.Writer) error {
	fs := newFlagSet("seed", seedSynopsis, stderr)
	listen := fs.String("listen", "", "UDP host:port to listen on, e.g. 0.0.0.0:29400 (required)")
	size := fs.Int("world-size", 0, "number of ranks in the job (required, >= 1)")
	tokenFile := fs.String("token-file", "", "file holding the job token (default: $NEXAR_TOKEN, then $NEXAR_TOKEN_FILE)")
	persist := fs.Bool("persist", false, "serve job after job instead of exiting once the first has formed")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2}
	}
	if *listen == "" || *size < 1 {
		return usageError("seed: --listen and --world-size (>= 1) are required (nexar %s)", seedSynopsis)
	}
	token, err := seedToken(*tokenFile)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	log := slog.New(slog.NewTextHandler(stderr, nil))
	addr := seedListen(*listen, log)
	for {
		s, err := core.StartSeed(addr, *size, token)
		if err != nil {
			return err
		}
		log.Info("nexar seed: listening", "addr", s.Addr().String(), "world_size", *size)
		select {
		case <-s.Formed():
			log.Info("nexar seed: job formed", "world_size", *size)
			// Stay until every rank reported its mesh formed (or was
			// lost: the seed tells the others), at most seedLinger.
			select {
			case <-s.Settled():
			case <-time.After(seedLinger):
			case <-sigs:
				s.Close()
				return nil
			}
			s.Close()
		case sig := <-sigs:
			s.Close()
			log.Info("nexar seed: stopped before the job formed", "signal", sig.String())
			return &exitError{code: 1}
		}
		if !*persist {
			return nil
		}
	}
}

// seedToken reads the job token: --token-file, else NEXAR_TOKEN, else
// NEXAR_TOKEN_FILE. Surrounding white space is not part of it, matching
// core.ConfigFromEnv.
func seedToken(file string) ([]byte, error) {
	if file == "" {
		t, err := core.TokenFromEnv()
		if err != nil {
			return nil, fmt.Errorf("seed: reading the token: %w", err)
		}
		if t != nil {
			return t, nil
		}
	}
	if file == "" {
		return nil, usageError("seed: no token: set NEXAR_TOKEN or pass --token-file")
	}
	t, err := core.ReadTokenFile(file)
	if err != nil {
		return nil, fmt.Errorf("seed: reading the token: %w", err)
	}
	return t, nil
}

// seedListen is where the seed listens for --listen ADDR: a host name the
// way rank 0's embedded seed reads it (core.SeedListenAddr: one that
// resolves only to loopback here, as a host's own name may, gets every
// interface, since other hosts resolve it to this host's address). A
// loopback listener is logged: only ranks on this host can join it.
func seedListen(listen string, log *slog.Logger) string {
	addr := core.SeedListenAddr(listen)
	if addr != listen {
		log.Info("nexar seed: listening address chosen for the name", "listen", listen, "addr", addr)
	}
	if host, _, err := net.SplitHostPort(addr); err == nil {
		if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
			log.Warn("nexar seed: listening on loopback: only ranks on this host can join (listen on this host's address, "+
				"or 0.0.0.0, for a job across hosts)", "addr", addr)
		}
	}
	return addr
}
