// Package command holds the command-line plumbing that cmd/driver and
// cmd/attacher share, so that both binaries parse, log and stop alike:
// flags parsed apart from running (Parse), component-base logging applied
// from those flags (StartLogging), and the signal context their run
// functions serve under (SignalContext). It never calls os.Exit: each main
// turns the errors into its one exit code.
package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/component-base/featuregate"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// FlagError is an error of the command line (exit code 2), as opposed to
// one of the program (exit code 1). Its message is Err's.
type FlagError struct{ Err error }

func (e *FlagError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *FlagError) Unwrap() error { return e.Err }

// IsFlagError reports whether err is, or wraps, a FlagError.
func IsFlagError(err error) bool {
	var fe *FlagError
	return errors.As(err, &fe)
}

// Parse parses args with fs. For -h or --help it prints usage, then every
// flag with its default and help, to output and returns flag.ErrHelp.
// Positional arguments are refused: every option of both binaries is a
// flag, so a stray word is a typo that must not be ignored. fs must have
// been made with flag.ContinueOnError.
func Parse(fs *flag.FlagSet, args []string, output io.Writer, usage string) error {
	fs.SetOutput(io.Discard) // the error is returned; the help is printed below
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(output, "%s\n\nFlags:\n", usage)
			fs.SetOutput(output)
			fs.PrintDefaults()
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (every option is a --flag)", fs.Args())
	}
	return nil
}

// StartLogging sets up klog through component-base from the logging flags
// (format, verbosity, vmodule), as the upstream sidecars do, and returns
// the function that flushes the logs, to be deferred by main. A FlagError
// is a bad flag value.
func StartLogging(cfg *logsapi.LoggingConfiguration) (flush func(), err error) {
	logs.InitLogs()
	fg := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(fg); err != nil {
		logs.FlushLogs()
		return nil, fmt.Errorf("logging feature gates: %w", err)
	}
	if err := logsapi.ValidateAndApply(cfg, fg); err != nil {
		logs.FlushLogs()
		return nil, &FlagError{fmt.Errorf("logging flags: %w", err)}
	}
	return logs.FlushLogs, nil
}

// SignalContext returns a context that ends on the first SIGINT or
// SIGTERM: the servers and controllers stop and the program exits cleanly.
// After that the default handling is back, so a second signal kills the
// process at once (a stop that hangs can always be cut short).
func SignalContext(parent context.Context) context.Context {
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx
}
