package registrar

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/testing/protocmp"
	"k8s.io/klog/v2/ktesting"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// kubeletConfig is a kubelet-mode registrar in a fresh registration
// directory, with short intervals so the tests need not wait.
func kubeletConfig(t *testing.T, d Driver) Config {
	return Config{
		DriverName:              driver,
		KubeletRegistrationPath: endpoint,
		PluginRegistrationPath:  t.TempDir(),
		Mode:                    ModeKubelet,
		Driver:                  d,
		RetryIntervalStart:      20 * time.Millisecond,
		RetryIntervalMax:        200 * time.Millisecond,
		SocketCheckInterval:     10 * time.Millisecond,
	}
}

// start runs a registrar until the test ends; the cleanup checks that Run
// returned nil.
func start(t *testing.T, cfg Config) *Registrar {
	t.Helper()
	r, stop := run(t, cfg)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// run runs a registrar until stop, which returns what Run returned, or
// until the test ends.
func run(t *testing.T, cfg Config) (*Registrar, func() error) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return r, sync.OnceValue(func() error {
		cancel()
		return <-done
	})
}

// kubelet is the test playing kubelet's plugin watcher.
type kubelet struct {
	t    *testing.T
	path string
}

// call runs f with a registration client on a fresh connection to the
// socket, as kubelet dials again for each registration.
func (k kubelet) call(f func(ctx context.Context, c registerapi.RegistrationClient) error) error {
	conn, err := grpc.NewClient("unix://"+k.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f(ctx, registerapi.NewRegistrationClient(conn))
}

func (k kubelet) getInfo() (*registerapi.PluginInfo, error) {
	var info *registerapi.PluginInfo
	err := k.call(func(ctx context.Context, c registerapi.RegistrationClient) (err error) {
		info, err = c.GetInfo(ctx, &registerapi.InfoRequest{})
		return err
	})
	return info, err
}

func (k kubelet) notify(registered bool, msg string) {
	k.t.Helper()
	err := k.call(func(ctx context.Context, c registerapi.RegistrationClient) error {
		_, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: registered, Error: msg})
		return err
	})
	if err != nil {
		k.t.Fatalf("NotifyRegistrationStatus(%t): %v", registered, err)
	}
}

// waitServed waits until GetInfo over the socket answers.
func (k kubelet) waitServed() {
	k.t.Helper()
	eventually(k.t, "the registration socket answers GetInfo", func() bool {
		_, err := k.getInfo()
		return err == nil
	})
}

// inode is the inode of the file at path, 0 when there is none.
func inode(path string) uint64 {
	st, err := os.Lstat(path)
	if err != nil {
		return 0
	}
	return st.Sys().(*syscall.Stat_t).Ino
}

// pinned returns the inode of the socket at path after giving it a second
// name, so that its inode number cannot be reused by the next socket made
// at path: a changed inode then means a new socket.
func pinned(t *testing.T, path string) uint64 {
	t.Helper()
	pin := filepath.Join(filepath.Dir(path), fmt.Sprintf("pin-%d", time.Now().UnixNano()))
	if err := os.Link(path, pin); err != nil {
		t.Fatal(err)
	}
	return inode(pin)
}

func TestRegistrationHandshake(t *testing.T) {
	d := newFakeDriver(0)
	cfg := kubeletConfig(t, d)
	r := start(t, cfg)
	k := kubelet{t: t, path: filepath.Join(cfg.PluginRegistrationPath, "loopvol.csi.io-reg.sock")}
	if r.SocketPath() != k.path {
		t.Fatalf("socket path %s, want %s (node-driver-registrar's name)", r.SocketPath(), k.path)
	}
	k.waitServed()

	st, err := os.Lstat(k.path)
	if err != nil || st.Mode().Type() != fs.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Fatalf("registration socket %v, %v; want an owner-only socket", st, err)
	}
	info, err := k.getInfo()
	if err != nil {
		t.Fatal(err)
	}
	want := &registerapi.PluginInfo{Type: "CSIPlugin", Name: driver, Endpoint: endpoint, SupportedVersions: []string{"1.0.0"}}
	if diff := cmp.Diff(want, info, protocmp.Transform()); diff != "" {
		t.Errorf("GetInfo (-want +got):\n%s", diff)
	}

	if err := r.Healthy(); err == nil || !strings.Contains(err.Error(), "kubelet has not confirmed the registration") {
		t.Errorf("Healthy() before kubelet's verdict = %v, want 'not confirmed'", err)
	}
	k.notify(true, "")
	if err := r.Healthy(); err != nil {
		t.Errorf("Healthy() after the registration: %v", err)
	}
	// The driver going bad shows too.
	d.setHealthy(errors.New("driver gone"))
	if err := r.Healthy(); err == nil || !strings.Contains(err.Error(), "driver gone") {
		t.Errorf("Healthy() with an unhealthy driver = %v", err)
	}
	d.setHealthy(nil)
	if calls := d.callCount(); calls != 0 {
		t.Errorf("kubelet mode without a client called NodeGetInfo %d times; kubelet does that", calls)
	}
}

// A failed registration is reported, and the socket is made again after a
// backoff so that kubelet tries again; a later success makes it healthy.
func TestRegistrationFailureIsRetried(t *testing.T) {
	cfg := kubeletConfig(t, newFakeDriver(0))
	r := start(t, cfg)
	k := kubelet{t: t, path: socketPath(cfg.PluginRegistrationPath, driver)}
	k.waitServed()
	first := pinned(t, k.path)

	k.notify(false, "plugin validation failed: too old")
	if err := r.Healthy(); err == nil || !strings.Contains(err.Error(), "too old") {
		t.Errorf("Healthy() after a failed registration = %v, want kubelet's reason", err)
	}
	eventually(t, "the socket is made again after the failure", func() bool {
		ino := inode(k.path)
		return ino != 0 && ino != first
	})
	k.waitServed()
	if err := r.Healthy(); err == nil || !strings.Contains(err.Error(), "too old") {
		t.Errorf("Healthy() on the new socket before kubelet's verdict = %v, want the last failure", err)
	}

	// Failing again and again does not end Run, and each retry makes a
	// new socket.
	for range 3 {
		before := pinned(t, k.path)
		k.notify(false, "still failing")
		eventually(t, "another retry", func() bool {
			ino := inode(k.path)
			return ino != 0 && ino != before
		})
		k.waitServed()
	}
	k.notify(true, "")
	if err := r.Healthy(); err != nil {
		t.Errorf("Healthy() after kubelet registered the driver at last: %v", err)
	}
	// A success stops the pending retry: the socket stays.
	stable := inode(k.path)
	for range 20 {
		if _, err := k.getInfo(); err != nil {
			t.Fatal(err)
		}
	}
	if inode(k.path) != stable {
		t.Error("the socket was made again after a successful registration")
	}
}

func TestRegistrationReplacesAStaleSocket(t *testing.T) {
	cfg := kubeletConfig(t, newFakeDriver(0))
	path := socketPath(cfg.PluginRegistrationPath, driver)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	start(t, cfg)
	kubelet{t: t, path: path}.waitServed()
}

func TestRegistrationRefusesAFileInTheWay(t *testing.T) {
	cfg := kubeletConfig(t, newFakeDriver(0))
	path := socketPath(cfg.PluginRegistrationPath, driver)
	if err := os.WriteFile(path, []byte("not mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	if err := r.Run(ctx); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Run with a regular file at the socket path = %v, want a refusal", err)
	}
	if data, _ := os.ReadFile(path); string(data) != "not mine" {
		t.Error("the file was changed")
	}
}

// A socket that vanishes is made again at once, and kubelet must confirm
// again: it deregistered the driver when the socket went.
func TestRegistrationVanishedSocketIsRecreated(t *testing.T) {
	cfg := kubeletConfig(t, newFakeDriver(0))
	r := start(t, cfg)
	k := kubelet{t: t, path: socketPath(cfg.PluginRegistrationPath, driver)}
	k.waitServed()
	k.notify(true, "")
	if err := r.Healthy(); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(k.path); err != nil {
		t.Fatal(err)
	}
	k.waitServed()
	if err := r.Healthy(); err == nil || !strings.Contains(err.Error(), "not confirmed") {
		t.Errorf("Healthy() on the new socket = %v, want 'not confirmed'", err)
	}
	k.notify(true, "")
	if err := r.Healthy(); err != nil {
		t.Errorf("Healthy() after the new registration: %v", err)
	}
}

// A socket another process put at the path is left to it, and it is still
// there after this registrar stopped.
func TestRegistrationLeavesAReplacementAlone(t *testing.T) {
	cfg := kubeletConfig(t, newFakeDriver(0))
	// The other process never answers GetInfo: each Healthy waits this out.
	cfg.HealthTimeout = 50 * time.Millisecond
	r, stop := run(t, cfg)
	k := kubelet{t: t, path: r.SocketPath()}
	k.waitServed()
	k.notify(true, "")

	// Another process puts its socket in place in one step: unixsock.Listen
	// itself refuses a path that this registrar still serves.
	other, err := net.ListenUnix("unix", &net.UnixAddr{Name: k.path + ".new", Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := os.Rename(k.path+".new", k.path); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(k.path, &st); err != nil {
		t.Fatal(err)
	}
	inPlace := func() bool {
		var now syscall.Stat_t
		return syscall.Lstat(k.path, &now) == nil && now.Ino == st.Ino
	}
	eventually(t, "the registrar notices it no longer serves the socket", func() bool {
		err := r.Healthy()
		return err != nil && strings.Contains(err.Error(), "does not serve")
	})
	if !inPlace() {
		t.Fatal("the registrar took the path back")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if !inPlace() {
		t.Fatal("the registrar removed the other process's socket when it stopped")
	}
}

func TestRegistrationRemovesItsSocketAtTheEnd(t *testing.T) {
	r, stop := run(t, kubeletConfig(t, newFakeDriver(0)))
	kubelet{t: t, path: r.SocketPath()}.waitServed()
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(r.SocketPath()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket left after Run returned: %v", err)
	}
	if err := r.Healthy(); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Healthy() after the end = %v, want 'does not exist'", err)
	}
}

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		return Config{
			DriverName: driver, KubeletRegistrationPath: endpoint, PluginRegistrationPath: "/registration",
			Mode: ModeKubelet, Driver: newFakeDriver(0), RetryIntervalStart: time.Second, RetryIntervalMax: time.Minute,
		}
	}
	tests := []struct {
		name    string
		edit    func(*Config)
		wantErr string
	}{
		{name: "kubelet mode needs no client and no node", edit: func(*Config) {}},
		{name: "no driver name", edit: func(c *Config) { c.DriverName = "" }, wantErr: "driver name"},
		{name: "no kubelet registration path", edit: func(c *Config) { c.KubeletRegistrationPath = "" }, wantErr: "kubelet registration path"},
		{name: "relative kubelet registration path", edit: func(c *Config) { c.KubeletRegistrationPath = "csi.sock" }, wantErr: "not absolute"},
		{name: "relative plugin registration path", edit: func(c *Config) { c.PluginRegistrationPath = "registration" }, wantErr: "not absolute"},
		{name: "socket path too long", edit: func(c *Config) { c.PluginRegistrationPath = "/" + strings.Repeat("d", 100) }, wantErr: "longer than 107"},
		{name: "unknown mode", edit: func(c *Config) { c.Mode = "both" }, wantErr: "neither"},
		{name: "direct mode without a client", edit: func(c *Config) { c.Mode = ModeDirect }, wantErr: "needs a Kubernetes client"},
		{name: "no driver connection", edit: func(c *Config) { c.Driver = nil }, wantErr: "no CSI driver"},
		{name: "retry max below start", edit: func(c *Config) { c.RetryIntervalMax = time.Millisecond }, wantErr: "shorter"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.edit(&cfg)
			err := cfg.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestRegisteredGauge: loopvol_registrar_registered is 0 until kubelet
// confirms the registration, 1 after, and 0 again after a failed one.
func TestRegisteredGauge(t *testing.T) {
	cfg := kubeletConfig(t, newFakeDriver(0))
	reg := prometheus.NewPedanticRegistry()
	cfg.Registerer = reg
	r := start(t, cfg)
	k := kubelet{t: t, path: r.SocketPath()}
	k.waitServed()
	gauge := func(want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(`# HELP loopvol_registrar_registered 1 while the driver is registered on this node: kubelet confirmed the registration on the current socket (CSINode mode kubelet), or the CSINode entry is in place (mode direct); else 0.
# TYPE loopvol_registrar_registered gauge
loopvol_registrar_registered `+want+"\n"), "loopvol_registrar_registered"); err != nil {
			t.Error(err)
		}
	}
	gauge("0")
	k.notify(true, "")
	gauge("1")
	k.notify(false, "plugin validation failed")
	gauge("0")
}
