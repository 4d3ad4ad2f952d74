package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/loopvol/loopvol/internal/kube"
)

func TestCapacityFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--controllers=capacity"}, &bytes.Buffer{}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := capacityConfig{pollInterval: time.Minute, ownerrefLevel: 1, threads: 4, kubeAPIQPS: 20, kubeAPIBurst: 100}
	if cfg.capacity != want {
		t.Errorf("defaults %+v, want %+v", cfg.capacity, want)
	}
	cfg, err = parseFlags([]string{"--controllers=capacity", "--capacity-poll-interval=5m", "--capacity-ownerref-level=-1",
		"--capacity-for-immediate-binding", "--capacity-threads=2", "--kube-api-capacity-qps=1", "--kube-api-capacity-burst=5"}, &bytes.Buffer{}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want = capacityConfig{pollInterval: 5 * time.Minute, ownerrefLevel: -1, immediateBinding: true, threads: 2, kubeAPIQPS: 1, kubeAPIBurst: 5}
	if cfg.capacity != want {
		t.Errorf("upstream's flags %+v, want %+v", cfg.capacity, want)
	}
	for _, bad := range []string{"--capacity-poll-interval=0", "--capacity-ownerref-level=-2", "--capacity-threads=0",
		"--kube-api-capacity-qps=0", "--kube-api-capacity-burst=0"} {
		if _, err := parseFlags([]string{"--controllers=capacity", bad}, &bytes.Buffer{}, noEnv); err == nil || !strings.Contains(err.Error(), strings.Split(strings.TrimPrefix(bad, "--"), "=")[0]) {
			t.Errorf("%s: error %v, want one naming the flag", bad, err)
		}
	}
	// Bad capacity flags do not matter when the controller does not run.
	if _, err := parseFlags([]string{"--capacity-threads=0"}, &bytes.Buffer{}, noEnv); err != nil {
		t.Errorf("attach alone with a bad capacity flag: %v", err)
	}
}

func TestBuildCapacity(t *testing.T) {
	deps := func(env map[string]string, args ...string) *deps {
		t.Helper()
		cfg, err := parseFlags(append([]string{"--controllers=capacity"}, args...), &bytes.Buffer{}, func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		return &deps{
			cfg: cfg, rest: &rest.Config{Host: "https://127.0.0.1:1"}, informers: kube.NewInformers(fake.NewClientset(), 0),
			driver: "loopvol.csi.io", registry: prometheus.NewRegistry(), env: func(k string) string { return env[k] },
		}
	}
	tests := []struct {
		name      string
		env       map[string]string
		args      []string
		wantErr   string
		wantLease string
	}{
		{name: "no $NAMESPACE", env: nil, wantErr: "$NAMESPACE"},
		{name: "an owner level without $POD_NAME", env: map[string]string{"NAMESPACE": "ns"}, wantErr: "$POD_NAME"},
		{name: "central, with an owner: a Lease of its own", env: map[string]string{"NAMESPACE": "ns", "POD_NAME": "p"}, wantLease: "loopvol-capacity-leader-loopvol-csi-io"},
		{name: "central, no owner", env: map[string]string{"NAMESPACE": "ns"}, args: []string{"--capacity-ownerref-level=-1"}, wantLease: "loopvol-capacity-leader-loopvol-csi-io"},
		{name: "per node: no Lease", env: map[string]string{"NAMESPACE": "ns", "NODE_NAME": "n1"}, args: []string{"--capacity-ownerref-level=-1", "--node-deployment"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := buildCapacity(deps(tc.env, tc.args...))
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want one naming %s", err, tc.wantErr)
				}
			case err != nil:
				t.Errorf("buildCapacity: %v", err)
			case r.lease != tc.wantLease:
				t.Errorf("lease %q, want %q", r.lease, tc.wantLease)
			}
		})
	}
}
