// Command nexar launches and inspects nexar jobs.
//
//	nexar run -n N [flags] -- prog args...   start N local ranks of prog
//	nexar seed --listen ADDR --world-size N   run a stand-alone rendezvous seed
//	nexar info                                version, addresses, transports
//	nexar bench [flags]                       collective bandwidth table
//	nexar diagnose DIR                        who waits for whom, from flight records
//
// Each subcommand has its own flag set; `nexar CMD -h` lists its flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

const usage = `nexar ` + version + ` - distributed communication runtime

usage:
  nexar run -n N [--seed-port P] [--bind ADDR] [--grace D] [--flight-dir DIR] [--hang-timeout D] -- prog args...
        start N local processes wired with NEXAR_* and torchrun variables;
        with --hang-timeout, report who waits for whom when no rank progresses
  nexar seed --listen ADDR --world-size N [--token-file F] [--persist]
        run the rendezvous seed stand-alone (token from NEXAR_TOKEN or --token-file)
  nexar info
        print version, addresses and available transports
  nexar bench [-n N] [--ops LIST] [--sizes LIST] [--json] [--inproc]
        measure collectives, nccl-tests style: starts N local ranks, or is one
        rank when started by a launcher (nexar run, torchrun, srun, mpirun)
  nexar diagnose DIR
        read the flight records the ranks dumped into DIR; say who waits for whom
  nexar version
        print the version

Run "nexar CMD -h" for the flags of CMD.
`

// exitError carries an exit status out of a subcommand without os.Exit deep
// inside it, so deferred cleanups run.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func main() {
	os.Exit(mainErr(os.Args[1:], os.Stdout, os.Stderr))
}

func mainErr(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "run":
		err = cmdRun(args[1:], stdout, stderr)
	case "seed":
		err = cmdSeed(args[1:], stderr)
	case "info":
		err = cmdInfo(args[1:], stdout)
	case "bench":
		err = cmdBench(args[1:], stdout, stderr)
	case "diagnose":
		err = cmdDiagnose(args[1:], stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, "nexar", version)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "nexar: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(stderr, "nexar:", ee.msg)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "nexar:", err)
	return 1
}

// newFlagSet returns a flag set for subcommand name that reports errors
// instead of exiting, so mainErr decides the status.
func newFlagSet(name, synopsis string, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: nexar %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// usageError is a bad command line: status 2, like the flag package.
func usageError(format string, args ...any) error {
	return &exitError{code: 2, msg: fmt.Sprintf(format, args...)}
}
