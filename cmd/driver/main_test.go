package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2/ktesting"
)

const testHost = "host-1"

func TestMain(m *testing.M) {
	// mainWithCode applies the logging flags, once per process in
	// production; the tests (and -count) call it again with the same ones.
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged
	os.Exit(m.Run())
}

// TestFlagsKeepTheirNamesDefaultsAndHelp: the driver's own flags are the
// ones its manifests and users know, with the same defaults and help; the
// rest are component-base's logging flags.
func TestFlagsKeepTheirNamesDefaultsAndHelp(t *testing.T) {
	want := []struct{ name, def, usage string }{
		{"endpoint", "unix:///csi/csi.sock", "CSI endpoint, unix:///absolute/path of the socket to serve."},
		{"mode", "all", "Services to run: controller (Identity + Controller), node (Identity + Node) or all."},
		{"driver-name", "loopvol.csi.io", "CSI driver name reported by GetPluginInfo."},
		{"node-id", testHost, "ID of this node in attachments and node records (node mode); defaults to the host name."},
		{"zone", "default", "Topology zone of this node and of the pools given with --pool."},
		{"pool", "[]", "Pool of this zone as NAME=PATH (NAME a DNS label, PATH a directory); repeatable."},
		{"config", "", "YAML file with pools of several zones: pools: [{name, zone, path, reserveBytes}]."},
		{"kubelet-dir", "/var/lib/kubelet", "Staging and target paths must lie under this directory."},
		{"pod-uid", "", "UID of the node plugin's own Pod (the Downward API's metadata.uid); with it the node's status (kubectl loopvol doctor) tells whether --kubelet-dir is kubelet's directory. Empty: not told."},
		{"max-volumes-per-node", "128", "Most volumes attached to this node at once, reported by NodeGetInfo and enforced by ControllerPublishVolume (0: no limit)."},
		{"http-endpoint", "", "host:port to serve /metrics (CSI call counts and latencies, pool space) and /healthz on; empty: off."},
		{"default-fstype", "ext4", "Filesystem of mount volumes whose request names none: ext4 or xfs."},
		{"heartbeat-namespace", "", "Namespace of this node's heartbeat Lease, renewed by the node plugin (node mode); empty: no heartbeat, so loopvol never fences this node and it never self-fences (docs/fencing.md)."},
		{"kubeconfig", "", "kubeconfig file of the heartbeat's API server; empty: the in-cluster config."},
		{"heartbeat-interval", "2s", "Time between two renewals of the heartbeat Lease."},
		{"fencing-period", "20s", "How long the heartbeat Lease may go unrenewed before this node may be fenced; written into the Lease, and the same for every node."},
		{"self-fence-after", "10s", "How long without a successful renewal before the node freezes its shared-pool volumes itself; shorter than --fencing-period minus --heartbeat-interval and a margin of a fifth of the period."},
		{"version", "false", "Print the version and exit."},
	}
	fs := newFlagSet(&config{logging: logsapi.NewLoggingConfiguration()}, testHost)
	var own []string
	for _, w := range want {
		own = append(own, w.name)
		f := fs.Lookup(w.name)
		if f == nil {
			t.Errorf("--%s is gone", w.name)
			continue
		}
		if f.DefValue != w.def || f.Usage != w.usage {
			t.Errorf("--%s: default %q, help %q; want %q, %q", w.name, f.DefValue, f.Usage, w.def, w.usage)
		}
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(own, f.Name) && !slices.Contains([]string{"v", "vmodule"}, f.Name) && !strings.HasPrefix(f.Name, "log") {
			t.Errorf("--%s is neither the driver's nor a logging flag", f.Name)
		}
	})
	for _, name := range []string{"v", "vmodule", "logging-format"} {
		if fs.Lookup(name) == nil {
			t.Errorf("the logging flag --%s is missing", name)
		}
	}
}

func TestParseFlagsDefaults(t *testing.T) {
	cfg, err := parseFlags([]string{"--pool=p1=/pools/p1"}, io.Discard, testHost)
	if err != nil {
		t.Fatalf("parseFlags: %v", err)
	}
	got := *cfg
	got.logging = nil
	want := config{
		endpoint:      "unix:///csi/csi.sock",
		mode:          "all",
		driverName:    "loopvol.csi.io",
		nodeID:        testHost,
		zone:          "default",
		pools:         poolFlag{{Name: "p1", Path: "/pools/p1"}},
		kubeletDir:    "/var/lib/kubelet",
		maxVolumes:    128,
		defaultFsType: "ext4",

		heartbeatInterval: 2 * time.Second,
		fencingPeriod:     20 * time.Second,
		selfFenceAfter:    10 * time.Second,
	}
	if d := cmp.Diff(want, got, cmp.AllowUnexported(config{})); d != "" {
		t.Errorf("defaults (-want +got):\n%s", d)
	}
}

// TestParseFlags: flags → config → validate, each refusal naming its flag.
func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		check   func(*config) bool
		wantErr []string
	}{
		{
			name: "node plugin of a manifest",
			args: []string{"--endpoint=unix:///var/lib/kubelet/plugins/loopvol.csi.io/csi.sock", "--mode=node", "--node-id=worker-1", "--zone=z1",
				"--pool=default=/var/lib/loopvol/pools/default", "--pool=fast=/mnt/fast", "--kubelet-dir=/k", "--max-volumes-per-node=0", "--v=2"},
			check: func(c *config) bool {
				return c.mode == "node" && c.nodeID == "worker-1" && c.zone == "z1" && c.kubeletDir == "/k" && c.maxVolumes == 0 &&
					slices.Equal(c.pools, poolFlag{{Name: "default", Path: "/var/lib/loopvol/pools/default"}, {Name: "fast", Path: "/mnt/fast"}})
			},
		},
		{
			name: "controller with a config file only, an xfs default and an HTTP endpoint",
			args: []string{"--mode=controller", "--config=/etc/loopvol/pools.yaml", "--default-fstype=xfs", "--http-endpoint=:9808"},
			check: func(c *config) bool {
				return c.configFile == "/etc/loopvol/pools.yaml" && c.defaultFsType == "xfs" && c.httpEndpoint == ":9808"
			},
		},
		{
			name:  "a controller needs no valid node ID",
			args:  []string{"--mode=controller", "--node-id=Not_A_Node", "--pool=a=/a"},
			check: func(c *config) bool { return c.mode == "controller" },
		},
		{
			name:  "a node plugin ignores the default filesystem",
			args:  []string{"--mode=node", "--default-fstype=btrfs", "--pool=a=/a"},
			check: func(c *config) bool { return c.defaultFsType == "btrfs" },
		},
		{
			name: "node plugin with a heartbeat",
			args: []string{"--mode=node", "--pool=a=/a", "--heartbeat-namespace=loopvol", "--kubeconfig=/etc/kubeconfig",
				"--heartbeat-interval=1s", "--fencing-period=30s", "--self-fence-after=20s"},
			check: func(c *config) bool {
				return c.heartbeatNamespace == "loopvol" && c.kubeconfig == "/etc/kubeconfig" && c.heartbeatInterval == time.Second &&
					c.fencingPeriod == 30*time.Second && c.selfFenceAfter == 20*time.Second
			},
		},
		{
			name:  "a heartbeat's durations are checked in mode all too, and not without a namespace",
			args:  []string{"--pool=a=/a", "--self-fence-after=19s"},
			check: func(c *config) bool { return c.selfFenceAfter == 19*time.Second },
		},
		{
			name:    "self-fence too close to the fencing period",
			args:    []string{"--mode=node", "--pool=a=/a", "--heartbeat-namespace=loopvol", "--self-fence-after=15s"},
			wantErr: []string{"--heartbeat-namespace, --heartbeat-interval, --fencing-period, --self-fence-after:", "exceeds the fencing period 20s"},
		},
		{
			name:    "self-fence within two renewals",
			args:    []string{"--mode=node", "--pool=a=/a", "--heartbeat-namespace=loopvol", "--heartbeat-interval=3s", "--self-fence-after=5s", "--fencing-period=60s"},
			wantErr: []string{"--self-fence-after:", "shorter than two renew intervals"},
		},
		{
			name:    "bad heartbeat namespace",
			args:    []string{"--mode=node", "--pool=a=/a", "--heartbeat-namespace=Not_A_Namespace"},
			wantErr: []string{"--heartbeat-namespace", `the namespace "Not_A_Namespace" is not a valid namespace name`},
		},
		{
			name:    "a heartbeat in controller mode",
			args:    []string{"--mode=controller", "--pool=a=/a", "--heartbeat-namespace=loopvol"},
			wantErr: []string{"--heartbeat-namespace: only a node plugin (--mode=node or all) renews a heartbeat, not --mode=controller"},
		},
		{
			name:    "durations must be positive",
			args:    []string{"--pool=a=/a", "--heartbeat-interval=0s", "--fencing-period=-1s", "--self-fence-after=0"},
			wantErr: []string{"--heartbeat-interval=0s must be positive", "--fencing-period=-1s must be positive", "--self-fence-after=0s must be positive"},
		},
		{name: "bad duration", args: []string{"--fencing-period=soon"}, wantErr: []string{`invalid value "soon" for flag -fencing-period`}},
		{name: "--version skips validation", args: []string{"--version", "--mode=bogus"}, check: func(c *config) bool { return c.showVersion }},
		{name: "unknown mode", args: []string{"--mode=bogus", "--pool=a=/a"}, wantErr: []string{`--mode="bogus": want controller, node or all`}},
		{name: "endpoint not a unix socket", args: []string{"--endpoint=tcp://1.2.3.4:5", "--pool=a=/a"}, wantErr: []string{"--endpoint:"}},
		{name: "empty driver name", args: []string{"--driver-name=", "--pool=a=/a"}, wantErr: []string{"--driver-name must not be empty"}},
		{name: "empty zone", args: []string{"--zone=", "--pool=a=/a"}, wantErr: []string{"--zone must not be empty"}},
		{name: "negative limit", args: []string{"--max-volumes-per-node=-1", "--pool=a=/a"}, wantErr: []string{"--max-volumes-per-node must not be negative"}},
		{name: "bad node ID in node mode", args: []string{"--mode=node", "--node-id=../etc", "--pool=a=/a"}, wantErr: []string{"--node-id:"}},
		{name: "pod UID a path", args: []string{"--mode=node", "--pod-uid=../../etc", "--pool=a=/a"}, wantErr: []string{`--pod-uid: pod UID "../../etc" is not a Pod's UID`}},
		{name: "pod UID of the Downward API", args: []string{"--mode=node", "--pod-uid=7d9aeb6f-53b7-4ac8-bf9a-f11ce7633dec", "--pool=a=/a"},
			check: func(c *config) bool { return c.podUID == "7d9aeb6f-53b7-4ac8-bf9a-f11ce7633dec" }},
		{name: "unsupported default filesystem", args: []string{"--default-fstype=btrfs", "--pool=a=/a"}, wantErr: []string{`--default-fstype="btrfs": want one of ext4, xfs`}},
		{name: "no pools", args: []string{"--mode=all"}, wantErr: []string{"no pools: give --pool NAME=PATH or --config FILE"}},
		{name: "pool without a path", args: []string{"--pool=noequals"}, wantErr: []string{`invalid value "noequals" for flag -pool: want NAME=PATH`}},
		{name: "HTTP endpoint without a port", args: []string{"--http-endpoint=localhost", "--pool=a=/a"}, wantErr: []string{`--http-endpoint "localhost" is not host:port`}},
		{name: "unknown flag", args: []string{"--no-such-flag"}, wantErr: []string{"flag provided but not defined: -no-such-flag"}},
		{name: "bad number", args: []string{"--max-volumes-per-node=many"}, wantErr: []string{`invalid value "many" for flag -max-volumes-per-node`}},
		{name: "positional argument", args: []string{"--pool=a=/a", "serve"}, wantErr: []string{"unexpected arguments"}},
		{
			name:    "every mistake at once",
			args:    []string{"--mode=bogus", "--zone=", "--driver-name="},
			wantErr: []string{"--mode=", "--zone must not be empty", "--driver-name must not be empty", "no pools"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseFlags(tc.args, io.Discard, testHost)
			var msg string
			if err != nil {
				msg = err.Error()
			}
			switch {
			case len(tc.wantErr) == 0 && err != nil:
				t.Fatalf("%q refused: %v", tc.args, err)
			case len(tc.wantErr) == 0 && tc.check != nil && !tc.check(cfg):
				t.Errorf("%q gave %+v", tc.args, cfg)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(msg, want) {
					t.Errorf("%q: error %q does not say %q", tc.args, msg, want)
				}
			}
		})
	}
}

// TestExitCodes: 0 after --version and --help, 2 and a short message for a
// bad command line, 1 when run fails.
func TestExitCodes(t *testing.T) {
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	socket := "--endpoint=unix://" + filepath.Join(t.TempDir(), "csi.sock")
	for name, tc := range map[string]struct {
		args        []string
		code        int
		out, errOut string
	}{
		"version":                   {args: []string{"--version"}, code: 0, out: "driver dev\n"},
		"help":                      {args: []string{"-h"}, code: 0, out: "Usage: driver [flags]"},
		"bad value":                 {args: []string{"--mode=bogus", "--pool=a=/a"}, code: 2, errOut: "driver: --mode=\"bogus\": want controller, node or all\nRun 'driver --help' for the flags.\n"},
		"unknown flag":              {args: []string{"--no-such-flag"}, code: 2, errOut: "flag provided but not defined: -no-such-flag"},
		"a pool that does not open": {args: []string{"--mode=controller", "--pool=p1=" + notADir, socket}, code: 1},
	} {
		var stdout, stderr strings.Builder
		code := mainWithCode(tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String(), tc.out) || !strings.Contains(stderr.String(), tc.errOut) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want %d, stdout with %q, stderr with %q",
				name, code, stdout.String(), stderr.String(), tc.code, tc.out, tc.errOut)
		}
		if tc.code == 2 && strings.Contains(stderr.String(), "-kubelet-dir") {
			t.Errorf("%s: a mistake printed the whole help", name)
		}
	}
}

// TestHelpShowsEveryFlag: --help prints every flag with its help text.
func TestHelpShowsEveryFlag(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseFlags([]string{"--help"}, &out, testHost); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("parseFlags(--help) = %v, want flag.ErrHelp", err)
	}
	help := out.String()
	newFlagSet(&config{logging: logsapi.NewLoggingConfiguration()}, testHost).VisitAll(func(f *flag.Flag) {
		first, _, _ := strings.Cut(f.Usage, ".")
		if !strings.Contains(help, "  -"+f.Name) || !strings.Contains(help, first) {
			t.Errorf("--help lacks --%s or its help %q", f.Name, first)
		}
	})
}

// testDriver is a driver run by run in this process, on a pool and a
// socket of its own: controller mode unless flags say otherwise.
type testDriver struct {
	cfg    *config
	socket string
	pool   string
	done   chan error
	stop   context.CancelFunc
	http   chan string // the HTTP endpoint's address, once it listens
}

func startDriver(t *testing.T, listen listenFunc, flags ...string) *testDriver {
	t.Helper()
	dir := t.TempDir()
	d := &testDriver{socket: filepath.Join(dir, "csi.sock"), pool: filepath.Join(dir, "pool"), done: make(chan error, 1), http: make(chan string, 1)}
	args := []string{"--mode=controller", "--endpoint=unix://" + d.socket, "--pool=p1=" + d.pool, "--http-endpoint=127.0.0.1:0"}
	cfg, err := parseFlags(append(args, flags...), io.Discard, testHost)
	if err != nil {
		t.Fatal(err)
	}
	d.cfg = cfg
	_, ctx := ktesting.NewTestContext(t)
	ctx, d.stop = context.WithCancel(ctx)
	t.Cleanup(d.stop)
	go func() {
		d.done <- run(ctx, cfg, func(network, address string) (net.Listener, error) {
			ln, err := listen(network, address)
			if err == nil {
				d.http <- ln.Addr().String()
			}
			return ln, err
		})
	}()
	return d
}

// get waits for the HTTP endpoint and returns the code and body of path.
func (d *testDriver) get(t *testing.T, path string) (int, string) {
	t.Helper()
	var addr string
	select {
	case addr = <-d.http:
		d.http <- addr
	case err := <-d.done:
		t.Fatalf("run returned %v before it listened", err)
	}
	// The endpoint is served once the CSI socket is: the listener queues
	// the connection until then.
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (d *testDriver) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-d.done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return")
		return nil
	}
}

// TestRunServesUntilStopped: metrics and health are served beside the CSI
// socket; /healthz follows the pools; a signal stops everything cleanly
// and removes the socket.
func TestRunServesUntilStopped(t *testing.T) {
	d := startDriver(t, net.Listen)
	if code, body := d.get(t, "/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz = %d %q, want 200 ok", code, body)
	}
	if code, body := d.get(t, "/metrics"); code != http.StatusOK || !strings.Contains(body, `loopvol_pool_available_bytes{pool="p1",zone="default"}`) {
		t.Errorf("/metrics = %d without the pool gauges:\n%s", code, body)
	}
	if _, err := os.Stat(d.socket); err != nil {
		t.Errorf("CSI socket: %v", err)
	}
	if err := os.Remove(filepath.Join(d.pool, ".loopvol-pool")); err != nil {
		t.Fatal(err)
	}
	if code, body := d.get(t, "/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no pool is usable") {
		t.Errorf("/healthz with a broken pool = %d %q, want 503", code, body)
	}
	d.stop() // SIGTERM
	if err := d.wait(t); err != nil {
		t.Errorf("run after a signal = %v, want nil", err)
	}
	if _, err := os.Stat(d.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CSI socket after the stop: %v, want it removed", err)
	}
}

// TestRunStopsWhenTheHTTPEndpointFails: the metrics and health listener
// failing while the driver serves (here closed under its server) stops the
// whole driver with its error, instead of leaving it running without
// probes or metrics.
func TestRunStopsWhenTheHTTPEndpointFails(t *testing.T) {
	lns := make(chan net.Listener, 1)
	d := startDriver(t, func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err == nil {
			lns <- ln
		}
		return ln, err
	})
	if code, _ := d.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d before the failure, want 200", code)
	}
	(<-lns).Close()
	err := d.wait(t)
	if !errors.Is(err, net.ErrClosed) || !strings.Contains(err.Error(), "HTTP endpoint 127.0.0.1:0: ") {
		t.Errorf("run = %v, want the HTTP endpoint's failure", err)
	}
	if _, err := os.Stat(d.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("CSI socket after the failure: %v, want the CSI server stopped too", err)
	}
}

// TestRunRefusesAnAddressInUse: an endpoint that cannot listen fails run at
// once, before any pool is opened (or a node record written).
func TestRunRefusesAnAddressInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	cfg, err := parseFlags([]string{"--mode=all", "--endpoint=unix://" + filepath.Join(dir, "csi.sock"), "--pool=p1=" + filepath.Join(dir, "pool"),
		"--kubelet-dir=" + dir, "--http-endpoint=" + taken.Addr().String()}, io.Discard, testHost)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	err = run(ctx, cfg, net.Listen)
	if err == nil || !strings.Contains(err.Error(), "--http-endpoint: ") || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("run = %v, want the address in use", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "pool")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pool directory after the refused start: %v; want it untouched (not even made)", err)
	}
}

// TestHeartbeatClientConfig: the heartbeat's API server comes from
// --kubeconfig, or from the in-cluster config, whose absence says what to
// do.
func TestHeartbeatClientConfig(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	if _, err := (&config{}).restConfig(); err == nil || !strings.Contains(err.Error(), "give --kubeconfig, or no --heartbeat-namespace") {
		t.Errorf("no --kubeconfig outside a cluster: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "none")
	if _, err := (&config{kubeconfig: missing}).restConfig(); err == nil || !strings.HasPrefix(err.Error(), "--kubeconfig:") {
		t.Errorf("--kubeconfig of a missing file: %v", err)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	data := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n" +
		"users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
	if err := os.WriteFile(kc, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := (&config{kubeconfig: kc}).restConfig()
	if err != nil || rc.Host != "https://127.0.0.1:6443" {
		t.Errorf("--kubeconfig %s: %v, %+v", kc, err, rc)
	}
}
