package command

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"syscall"
	"testing"
	"time"

	logsapi "k8s.io/component-base/logs/api/v1"
)

func newFlags() (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	v := fs.String("endpoint", "unix:///csi.sock", "CSI endpoint.")
	return fs, v
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		wantErr  string
		wantHelp bool
		want     string
	}{
		{name: "flag → value", args: []string{"--endpoint=unix:///x"}, want: "unix:///x"},
		{name: "no flags → default", want: "unix:///csi.sock"},
		{name: "-h → help", args: []string{"-h"}, wantErr: flag.ErrHelp.Error(), wantHelp: true},
		{name: "unknown flag → error", args: []string{"--nope"}, wantErr: "flag provided but not defined: -nope"},
		{name: "positional word → error", args: []string{"--endpoint=a", "stray"}, wantErr: `unexpected arguments ["stray"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, v := newFlags()
			var out bytes.Buffer
			err := Parse(fs, tc.args, &out, "Usage: x [flags]")
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if *v != tc.want {
					t.Errorf("endpoint %q, want %q", *v, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Parse: %v, want %q", err, tc.wantErr)
			}
			help := out.String()
			if tc.wantHelp != (strings.HasPrefix(help, "Usage: x [flags]\n\nFlags:\n") && strings.Contains(help, "CSI endpoint.")) {
				t.Errorf("help printed %v, want %v: %q", help != "", tc.wantHelp, help)
			}
			if !tc.wantHelp && help != "" {
				t.Errorf("output for a bad command line: %q (the caller prints the error)", help)
			}
		})
	}
}

func TestStartLoggingBadFlag(t *testing.T) {
	cfg := logsapi.NewLoggingConfiguration()
	cfg.Format = "no-such-format"
	_, err := StartLogging(cfg)
	if !IsFlagError(err) {
		t.Fatalf("StartLogging with format %q: %v, want a FlagError", cfg.Format, err)
	}
	if !strings.Contains(err.Error(), "logging flags") {
		t.Errorf("message %q does not say which flags", err)
	}
	if IsFlagError(errors.New("other")) || IsFlagError(nil) {
		t.Error("IsFlagError is true for an error that is none")
	}
}

func TestSignalContextEndsOnSIGTERM(t *testing.T) {
	ctx := SignalContext(context.Background())
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the context did not end after SIGTERM")
	}
}
