package main

import (
	"bytes"
	"flag"
	"slices"
	"strings"
	"testing"

	"github.com/kubernetes-csi/csi-lib-utils/standardflags"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// upstreamFlags are the flags the mains of the upstream sidecars declare
// beside csi-lib-utils' standardflags and component-base's logging flags,
// read from their sources: external-attacher v4.13.0
// (cmd/csi-attacher/main.go), external-provisioner v6.4.0 (the capacity
// controller's flags and those every provisioner manifest passes,
// cmd/csi-provisioner/csi-provisioner.go), node-driver-registrar
// (cmd/csi-node-driver-registrar/main.go) and external-resizer
// (cmd/csi-resizer/main.go).
var upstreamFlags = map[string][]string{
	"external-attacher": {
		"resync", "timeout", "retry-interval-start", "retry-interval-max", "worker-threads", "max-entries",
		"default-fstype", "reconcile-sync", "max-grpc-log-length", "feature-gates", "automaxprocs",
	},
	"external-provisioner (capacity)": {
		"enable-capacity", "capacity-poll-interval", "capacity-ownerref-level", "capacity-for-immediate-binding",
		"capacity-threads", "kube-api-capacity-qps", "kube-api-capacity-burst", "node-deployment", "master",
		"timeout", "worker-threads", "retry-interval-start", "retry-interval-max", "enable-pprof", "feature-gates", "automaxprocs",
	},
	"node-driver-registrar": {
		"connection-timeout", "timeout", "csi-address", "plugin-registration-path", "kubelet-registration-path",
		"health-port", "http-endpoint", "version", "mode", "enable-pprof", "automaxprocs",
	},
	"external-resizer": {
		"master", "kubeconfig", "resync-period", "workers", "extra-modify-metadata", "csi-address", "timeout", "version",
		"retry-interval-start", "retry-interval-max", "leader-election", "leader-election-namespace",
		"leader-election-lease-duration", "leader-election-renew-deadline", "leader-election-retry-period",
		"metrics-address", "http-endpoint", "metrics-path", "kube-api-qps", "kube-api-burst",
		"handle-volume-inuse-error", "feature-gates", "automaxprocs",
	},
}

// TestUpstreamFlagsAccepted registers the upstream sidecars' flag sets into
// a scratch FlagSet and checks that ours declares every one of their names:
// a manifest written for any of them parses here.
func TestUpstreamFlagsAccepted(t *testing.T) {
	theirs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	standardflags.RegisterCommonFlags(theirs) // (its metrics-path lands on flag.CommandLine: listed below)
	names := map[string][]string{}
	theirs.VisitAll(func(f *flag.Flag) { names[f.Name] = append(names[f.Name], "csi-lib-utils standardflags") })
	names["metrics-path"] = append(names["metrics-path"], "csi-lib-utils standardflags")
	for sidecar, list := range upstreamFlags {
		for _, n := range list {
			names[n] = append(names[n], sidecar)
		}
	}
	for _, n := range []string{"v", "vmodule"} {
		names[n] = append(names[n], "component-base logging")
	}

	ours, _ := newFlagSet(&config{logging: logsapi.NewLoggingConfiguration()}, noEnv)
	for _, n := range slices.Sorted(func(yield func(string) bool) {
		for n := range names {
			if !yield(n) {
				return
			}
		}
	}) {
		if ours.Lookup(n) == nil {
			t.Errorf("--%s (of %s) is not accepted", n, strings.Join(names[n], ", "))
		}
	}
}

func TestCompatFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(*config) string // "" when right
		wantErr string
	}{
		{
			name:  "--metrics-address is --http-endpoint",
			args:  []string{"--metrics-address=:9090"},
			check: func(c *config) string { return want(c.httpEndpoint, ":9090") },
		},
		{
			name:  "--health-port serves on all addresses",
			args:  []string{"--health-port=9809"},
			check: func(c *config) string { return want(c.httpEndpoint, ":9809") },
		},
		{name: "two endpoints → error", args: []string{"--metrics-address=:1", "--http-endpoint=:2"}, wantErr: "only one of --http-endpoint, --metrics-address and --health-port"},
		{name: "health port out of range", args: []string{"--health-port=70000"}, wantErr: "--health-port=70000 is not a port"},
		{
			name:  "leader-election labels key:value",
			args:  []string{"--leader-election-labels=team:storage,tier:infra"},
			check: func(c *config) string { return want(c.compat.leaderElectionLabels.String(), "team:storage,tier:infra") },
		},
		{name: "a label without a colon", args: []string{"--leader-election-labels=team=storage"}, wantErr: `label "team=storage" is not key:value`},
		{name: "known feature gates", args: []string{"--feature-gates=Topology=true,ReleaseLeaderElectionOnExit=true,RecoverVolumeExpansionFailure=true"}},
		{name: "an unknown feature gate", args: []string{"--feature-gates=NoSuchGate=true"}, wantErr: "NoSuchGate"},
		{name: "a gate that is not a bool", args: []string{"--feature-gates=Topology=yes"}, wantErr: `"yes" is not true or false`},
		{name: "--automaxprocs and --connection-timeout are accepted", args: []string{"--automaxprocs", "--connection-timeout=15s"}},
		{name: "--mode=registration is upstream's default", args: []string{"--mode=registration"}},
		{name: "another --mode", args: []string{"--mode=direct"}, wantErr: `--mode="direct"`},
		{
			name:  "--enable-capacity adds the capacity controller",
			args:  []string{"--enable-capacity"},
			check: func(c *config) string { return want(strings.Join(c.controllers, ","), "attach,capacity") },
		},
		{
			name:  "--master reaches the client configuration",
			args:  []string{"--master=https://127.0.0.1:6443"},
			check: func(c *config) string { return want(c.compat.master, "https://127.0.0.1:6443") },
		},
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
			if tc.check != nil {
				if msg := tc.check(cfg); msg != "" {
					t.Error(msg)
				}
			}
		})
	}
}

func want(got, want string) string {
	if got != want {
		return "got " + got + ", want " + want
	}
	return ""
}

// TestRegistrationProbeExitsZero: node-driver-registrar manifests run the
// binary with --mode=kubelet-registration-probe as an exec probe.
func TestRegistrationProbeExitsZero(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := mainWithCode([]string{"--kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock", "--mode=kubelet-registration-probe"}, &stdout, &stderr); code != 0 {
		t.Errorf("exit code %d, want 0 (stderr %q)", code, stderr.String())
	}
}
