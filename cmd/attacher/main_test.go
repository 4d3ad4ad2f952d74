package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"
)

func noEnv(string) string { return "" }

func TestParseFlagsDefaults(t *testing.T) {
	cfg, err := parseFlags(nil, &bytes.Buffer{}, noEnv)
	if err != nil {
		t.Fatalf("parseFlags: %v", err)
	}
	got := *cfg
	// The per-controller and compatibility flags have tests of their own.
	got.logging = nil
	got.compat = compatFlags{}
	got.capacity, got.registrar, got.resizer = capacityConfig{}, registrarConfig{}, resizerConfig{}
	got.webhook, got.fencing = webhookConfig{}, fencingConfig{}
	want := config{
		csiAddress:                  "/run/csi/socket",
		controllers:                 []string{"attach"},
		workerThreads:               32,
		kubeAPIQPS:                  150,
		kubeAPIBurst:                300,
		timeout:                     15 * time.Second,
		retryIntervalStart:          time.Second,
		retryIntervalMax:            5 * time.Minute,
		resync:                      10 * time.Minute,
		reconcileSync:               time.Minute,
		maxEntries:                  256,
		maxGRPCLogLength:            -1,
		leaderElectionLeaseDuration: 15 * time.Second,
		leaderElectionRenewDeadline: 10 * time.Second,
		leaderElectionRetryPeriod:   5 * time.Second,
		metricsPath:                 "/metrics",
	}
	if d := cmp.Diff(want, got, cmp.AllowUnexported(config{}, compatFlags{}, featureGates{}, capacityConfig{}, registrarConfig{}, resizerConfig{}, webhookConfig{}, fencingConfig{})); d != "" {
		t.Errorf("defaults (-want +got):\n%s", d)
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(*config) bool
		wantErr string
	}{
		{
			name: "upstream flags and a controller list with spaces and repeats",
			args: []string{"--csi-address=/csi/csi.sock", "--controllers= attach,attach ", "--worker-threads=4", "--leader-election", "--leader-election-namespace=kube-system", "--http-endpoint=:8080", "--v=5"},
			check: func(c *config) bool {
				return c.csiAddress == "/csi/csi.sock" && len(c.controllers) == 1 && c.workerThreads == 4
			},
		},
		{name: "unknown controller", args: []string{"--controllers=snapshot"}, wantErr: `--controllers: unknown controller "snapshot"`},
		{name: "empty controller list", args: []string{"--controllers=,"}, wantErr: "--controllers is empty"},
		{name: "unknown flag", args: []string{"--bogus"}, wantErr: "flag provided but not defined: -bogus"},
		{name: "bad duration", args: []string{"--timeout=soon"}, wantErr: `invalid value "soon" for flag -timeout`},
		{name: "positional argument", args: []string{"attach"}, wantErr: "unexpected arguments"},
		{name: "no workers", args: []string{"--worker-threads=0"}, wantErr: "--worker-threads must be greater than zero"},
		{name: "no QPS", args: []string{"--kube-api-qps=0"}, wantErr: "--kube-api-qps must be greater than zero"},
		{name: "no burst", args: []string{"--kube-api-burst=0"}, wantErr: "--kube-api-burst must be at least 1"},
		{name: "no timeout", args: []string{"--timeout=0"}, wantErr: "--timeout must be positive"},
		{name: "retry max below start", args: []string{"--retry-interval-start=2m", "--retry-interval-max=1m"}, wantErr: "--retry-interval-max=1m0s is shorter"},
		{name: "negative resync", args: []string{"--resync=-1s"}, wantErr: "--resync must not be negative"},
		{name: "negative page size", args: []string{"--max-entries=-1"}, wantErr: "--max-entries must be between"},
		{name: "metrics path without slash", args: []string{"--metrics-path=metrics"}, wantErr: "--metrics-path must start with /"},
		{name: "metrics path on healthz", args: []string{"--metrics-path=/healthz"}, wantErr: "collides with /healthz"},
		{name: "endpoint without port", args: []string{"--http-endpoint=localhost"}, wantErr: "--http-endpoint \"localhost\" is not host:port"},
		{name: "lease shorter than renew deadline", args: []string{"--leader-election", "--leader-election-lease-duration=5s"}, wantErr: "must be longer than --leader-election-renew-deadline"},
		{name: "renew deadline within the jittered retry", args: []string{"--leader-election", "--leader-election-retry-period=9s"}, wantErr: "must be longer than 1.2 × --leader-election-retry-period"},
		{name: "leader-election timings unchecked without leader election", args: []string{"--leader-election-lease-duration=1s"}},
		{name: "--version skips validation", args: []string{"--version", "--worker-threads=0"}, check: func(c *config) bool { return c.showVersion }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseFlags(tc.args, &bytes.Buffer{}, noEnv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseFlags(%q) = %v, want an error containing %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if tc.check != nil && !tc.check(cfg) {
				t.Errorf("parseFlags(%q) = %+v", tc.args, cfg)
			}
		})
	}
}

func TestExitCodes(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "--version", args: []string{"--version"}, wantCode: 0, wantStdout: "attacher unknown\n"},
		{name: "--help lists every flag with its help", args: []string{"--help"}, wantCode: 0, wantStdout: "-kube-api-qps float\n"},
		{name: "bad flag → 2 and a short message", args: []string{"--worker-threads=-1"}, wantCode: 2, wantStderr: "attacher: invalid value \"-1\" for flag -worker-threads"},
		{name: "unknown controller → 2", args: []string{"--controllers=nope"}, wantCode: 2, wantStderr: "Run 'attacher --help' for the flags."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := mainWithCode(tc.args, &stdout, &stderr); code != tc.wantCode {
				t.Errorf("exit code = %d, want %d (stderr %q)", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout = %q, want it to contain %q", stdout.String(), tc.wantStdout)
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr = %q, want it to contain %q", stderr.String(), tc.wantStderr)
			}
			if tc.name == "--help lists every flag with its help" && strings.Contains(stdout.String(), "\n  -") {
				// Every flag line is followed by its help text.
				for _, line := range strings.Split(stdout.String(), "\n") {
					if strings.HasPrefix(line, "  -") && strings.HasSuffix(line, "\t") {
						t.Errorf("flag without help: %q", line)
					}
				}
			}
		})
	}
}

func TestRunControllersStopsAllWhenOneFails(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	stopped := make(chan struct{})
	err := runControllers(ctx, []runner{
		{name: "waits", run: func(ctx context.Context) error {
			<-ctx.Done()
			close(stopped)
			return nil
		}},
		{name: "fails", run: func(context.Context) error { return errors.New("boom") }},
	})
	if err == nil || err.Error() != "controller fails: boom" {
		t.Errorf("runControllers = %v, want the failing controller's error", err)
	}
	select {
	case <-stopped:
	default:
		t.Error("the other controller was not stopped")
	}
}

func TestStopReason(t *testing.T) {
	errConn := errors.New("connect failed")
	canceled, cancel := context.WithCancelCause(context.Background())
	cancel(nil)
	failed, fail := context.WithCancelCause(context.Background())
	fail(errors.New("HTTP server: address in use"))
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want string
	}{
		{name: "running: the error", ctx: context.Background(), err: errConn, want: "connect failed"},
		{name: "signal: clean stop", ctx: canceled, err: errConn, want: ""},
		{name: "HTTP server died: its error", ctx: failed, err: errConn, want: "HTTP server: address in use"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if err := stopReason(tc.ctx, tc.err); err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("stopReason = %q, want %q", got, tc.want)
			}
		})
	}
}
