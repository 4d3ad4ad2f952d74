package testenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// modulePath identifies the repository root among the go.mod files above the
// working directory (hack/tools has modules of its own).
const modulePath = "github.com/loopvol/loopvol"

// Binaries are the files in bin/ that a control plane needs.
var Binaries = []string{"kube-apiserver", "etcd"}

// startTimeout replaces envtest's 20s default: `go test ./...` runs several
// packages at once on two cores, and a kube-apiserver starting next to a
// compiler can take longer than that.
const startTimeout = 90 * time.Second

var repoRoot = sync.OnceValues(func() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if mod, err := readModulePath(filepath.Join(dir, "go.mod")); err == nil && mod == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("testenv: no go.mod of module %s above the working directory", modulePath)
		}
		dir = parent
	}
})

func readModulePath(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "module"); ok && rest != "" && (rest[0] == ' ' || rest[0] == '\t') {
			if i := strings.Index(rest, "//"); i >= 0 {
				rest = rest[:i]
			}
			return strings.Trim(strings.TrimSpace(rest), `"`+"`"), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s has no module line", gomod)
}

// RepoRoot returns the loopvol repository root: the nearest directory above
// the working directory (a test's package directory) whose go.mod is the
// loopvol module.
func RepoRoot() (string, error) { return repoRoot() }

// BinDir returns the repository's bin/ directory, where `make tools` puts
// kube-apiserver and etcd (and the Makefile puts loopvol's own binaries).
func BinDir() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "bin"), nil
}

// MissingBinaries returns the names in [Binaries] that bin/ lacks (all of
// them if the repository root cannot be found).
func MissingBinaries() []string {
	bin, err := BinDir()
	if err != nil {
		return Binaries
	}
	var missing []string
	for _, name := range Binaries {
		if fi, err := os.Stat(filepath.Join(bin, name)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, name)
		}
	}
	return missing
}

// inCI reports whether the tests run under CI, where a missing control plane
// is a broken build rather than a reason to skip.
func inCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// SkipIfNoBinaries skips the test when bin/kube-apiserver or bin/etcd is
// missing, saying how to build them. Under CI (CI=true) it fails the test
// instead, so that a CI run cannot pass by skipping every control-plane test.
func SkipIfNoBinaries(tb testing.TB) {
	tb.Helper()
	missing := MissingBinaries()
	if len(missing) == 0 {
		return
	}
	bin, err := BinDir()
	if err != nil {
		bin = "bin"
	}
	msg := fmt.Sprintf("testenv: %s missing from %s: run `make tools` (hack/tools/build.sh) to build them (~10 minutes the first time)",
		strings.Join(missing, " and "), bin)
	if inCI() {
		tb.Fatal(msg + " [CI=true, so this fails instead of skipping]")
	}
	tb.Skip(msg)
}

// Env is a running kube-apiserver with its etcd.
type Env struct {
	// Config reaches the API server as an admin (group system:masters).
	// It is shared: copy it (rest.CopyConfig) before changing it.
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
	// AuditLogPath is kube-apiserver's audit log (JSON lines), with
	// Options.AuditLog; else empty.
	AuditLogPath string

	te         *envtest.Environment
	kubeconfig []byte
	auditDir   string
	output     *tail
	watchdog   *watchdog

	userMu   sync.Mutex
	stopOnce sync.Once
	stopErr  error

	// restartMu guards restarted (a kube-apiserver started again by
	// KillAPIServer's restart, nil if none) and the watchdog's replacement.
	restartMu    sync.Mutex
	restarted    *exec.Cmd
	watchdogDirs []string
	warmUps      []Window
}

// Window is a span of time, End after Start.
type Window struct{ Start, End time.Time }

// Contains reports whether t falls in w.
func (w Window) Contains(t time.Time) bool { return !t.Before(w.Start) && !t.After(w.End) }

// WarmUps returns the spans during which a kube-apiserver started again by
// KillAPIServer's restart served requests but was not ready yet: until its
// informers have synced, its RBAC authorizer knows no binding and refuses
// (403) what the shipped roles allow, as any kube-apiserver does before
// /readyz passes. A check of who was refused what must leave these out.
func (e *Env) WarmUps() []Window {
	e.restartMu.Lock()
	defer e.restartMu.Unlock()
	return slices.Clone(e.warmUps)
}

// setLogger gives envtest (controller-runtime) a logger. Without one,
// controller-runtime prints a stack trace to stderr the first time it logs
// 30s after start, which in a long test package is every time. klog is what
// loopvol logs with, so envtest's errors land in the same stream.
var setLogger = sync.OnceFunc(func() { ctrllog.SetLogger(klog.NewKlogr()) })

// Launch starts kube-apiserver and etcd from bin/ and waits until the API
// server serves. stop (the same as env.Stop) ends both processes and removes
// their directories; call it exactly when the control plane is no longer
// needed, typically after m.Run in TestMain. Most tests want [Start] or
// [Shared] instead.
func Launch() (env *Env, stop func() error, err error) {
	return LaunchWith(Options{})
}

// Options change how the control plane starts.
type Options struct {
	// AuditLog makes kube-apiserver write an audit log (Metadata level: who
	// did what to which resource, and the response code) to
	// Env.AuditLogPath, for tests of what each component really calls.
	// Off by default: it costs the API server time on every request, which
	// the benchmarks would measure.
	AuditLog bool
}

// auditPolicy logs every request once (when its response is complete) at
// Metadata level: user, verb, resource, subresource, namespace, code.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
`

// LaunchWith is [Launch] with options.
func LaunchWith(opts Options) (env *Env, stop func() error, err error) {
	bin, err := BinDir()
	if err != nil {
		return nil, nil, err
	}
	if missing := MissingBinaries(); len(missing) > 0 {
		return nil, nil, fmt.Errorf("testenv: %s missing from %s: run `make tools`", strings.Join(missing, " and "), bin)
	}
	setLogger()

	apiserverPath := filepath.Join(bin, "kube-apiserver")
	etcdPath := filepath.Join(bin, "etcd")
	noExisting := false
	te := &envtest.Environment{
		// The paths are set, not looked up, so that KUBEBUILDER_ASSETS and
		// TEST_ASSET_* cannot swap in other versions behind the test's back.
		ControlPlane: envtest.ControlPlane{
			APIServer:   &envtest.APIServer{Path: apiserverPath},
			Etcd:        &envtest.Etcd{Path: etcdPath},
			KubectlPath: filepath.Join(bin, "kubectl"),
		},
		BinaryAssetsDirectory: bin,
		DownloadBinaryAssets:  false,
		UseExistingCluster:    &noExisting,
	}
	if os.Getenv("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT") == "" {
		te.ControlPlaneStartTimeout = startTimeout
	}
	out := newTail(64 << 10)
	if attach, _ := strconv.ParseBool(os.Getenv("KUBEBUILDER_ATTACH_CONTROL_PLANE_OUTPUT")); !attach {
		// Kept, not discarded, so that a failed start can say why.
		te.ControlPlane.APIServer.Out, te.ControlPlane.APIServer.Err = out, out
		te.ControlPlane.Etcd.Out, te.ControlPlane.Etcd.Err = out, out
	}

	var auditDir string
	if opts.AuditLog {
		auditDir, err = os.MkdirTemp("", "loopvol-audit-")
		if err != nil {
			return nil, nil, fmt.Errorf("testenv: audit log directory: %w", err)
		}
		policy := filepath.Join(auditDir, "policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
			return nil, nil, fmt.Errorf("testenv: audit policy: %w", err)
		}
		args := te.ControlPlane.GetAPIServer().Configure()
		args.Set("audit-policy-file", policy)
		args.Set("audit-log-path", filepath.Join(auditDir, "audit.log"))
		args.Set("audit-log-format", "json")
		args.Set("audit-log-mode", "blocking")
	}

	if _, err := te.Start(); err != nil {
		stopErr := te.Stop()
		return nil, nil, errors.Join(
			fmt.Errorf("testenv: starting kube-apiserver and etcd from %s: %w%s", bin, err, out.report()),
			stopErr)
	}
	e := &Env{Config: te.Config, te: te, kubeconfig: te.KubeConfig, output: out, auditDir: auditDir}
	if auditDir != "" {
		e.AuditLogPath = filepath.Join(auditDir, "audit.log")
	}
	// Claimed before anything below can fail, so that every exit stops it.
	dirs := []string{
		te.ControlPlane.APIServer.CertDir,
		te.ControlPlane.Etcd.DataDir,
		te.WebhookInstallOptions.LocalServingCertDir,
	}
	if auditDir != "" {
		dirs = append(dirs, auditDir)
	}
	e.watchdogDirs = dirs
	e.watchdog = startWatchdog([]string{apiserverPath, etcdPath}, dirs)
	client, err := kubernetes.NewForConfig(te.Config)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("testenv: clientset: %w", err), e.Stop())
	}
	e.Client = client
	return e, e.Stop, nil
}

// Start starts a control plane for one test and stops it when the test ends.
// It skips the test (fails it under CI) when bin/ lacks the binaries.
func Start(tb testing.TB) *Env {
	tb.Helper()
	SkipIfNoBinaries(tb)
	env, stop, err := Launch()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Errorf("testenv: stopping the control plane: %v", err)
		}
	})
	return env
}

// Stop ends kube-apiserver and etcd and removes their directories. It may
// be called more than once; later calls return the first call's result.
func (e *Env) Stop() error {
	e.stopOnce.Do(func() {
		e.stopErr = errors.Join(e.stopRestarted(), e.te.Stop())
		// Only now: had the test binary died during te.Stop, the watchdog
		// would still have finished the job.
		e.restartMu.Lock()
		e.watchdog.stop()
		e.restartMu.Unlock()
		if e.auditDir != "" {
			e.stopErr = errors.Join(e.stopErr, os.RemoveAll(e.auditDir))
		}
		if e.stopErr != nil {
			e.stopErr = fmt.Errorf("%w%s", e.stopErr, e.output.report())
		}
	})
	return e.stopErr
}

// Kubeconfig writes a kubeconfig file with the admin (system:masters)
// credentials of Config into a fresh tb.TempDir() and returns its path, for
// running separate binaries (loopvol's controller, attacher, kubectl)
// against this API server. The certificates are embedded, so the file alone
// is enough.
func (e *Env) Kubeconfig(tb testing.TB) string {
	tb.Helper()
	return writeKubeconfig(tb, e.kubeconfig)
}

// UserConfig provisions a user with the given name and groups (client
// certificate authentication) and returns a rest.Config for it, for tests of
// what RBAC lets loopvol's components do.
func (e *Env) UserConfig(tb testing.TB, name string, groups ...string) *rest.Config {
	tb.Helper()
	return e.addUser(tb, name, groups).Config()
}

// UserKubeconfig is [Env.UserConfig] written as a kubeconfig file into a
// fresh tb.TempDir(); it returns the file's path.
func (e *Env) UserKubeconfig(tb testing.TB, name string, groups ...string) string {
	tb.Helper()
	data, err := e.addUser(tb, name, groups).KubeConfig()
	if err != nil {
		tb.Fatalf("testenv: kubeconfig for user %s: %v", name, err)
	}
	return writeKubeconfig(tb, data)
}

func (e *Env) addUser(tb testing.TB, name string, groups []string) *envtest.AuthenticatedUser {
	tb.Helper()
	e.userMu.Lock()
	defer e.userMu.Unlock()
	u, err := e.te.AddUser(envtest.User{Name: name, Groups: groups}, &rest.Config{QPS: e.Config.QPS, Burst: e.Config.Burst})
	if err != nil {
		tb.Fatalf("testenv: adding user %s: %v", name, err)
	}
	return u
}

func writeKubeconfig(tb testing.TB, data []byte) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatalf("testenv: writing kubeconfig: %v", err)
	}
	return path
}

// Namespace creates a namespace with a unique name for one test and returns
// the name. Tests sharing a control plane each take their own, since a
// deleted namespace is never finalized here (no controller-manager runs).
func (e *Env) Namespace(tb testing.TB) string {
	tb.Helper()
	ns, err := e.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "loopvol-test-"},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("testenv: creating a namespace: %v", err)
	}
	return ns.Name
}

// Shared is one control plane for all the tests of a package, started by
// the first test that asks for it and stopped after the last:
//
//	var cluster testenv.Shared
//
//	func TestMain(m *testing.M) { os.Exit(cluster.Run(m)) }
//
//	func TestSomething(t *testing.T) {
//		env := cluster.Env(t) // skips (fails under CI) without bin/
//		...
//	}
//
// Starting on first use means that `go test -run` of tests that need no
// control plane, and packages on a clone without bin/, pay nothing.
type Shared struct {
	// Options are how the control plane starts; set them before the first
	// Env.
	Options Options

	once sync.Once
	mu   sync.Mutex
	env  *Env
	err  error
}

// Env returns the package's control plane, starting it on the first call.
// If it could not start, every caller's test fails with the same error.
func (s *Shared) Env(tb testing.TB) *Env {
	tb.Helper()
	SkipIfNoBinaries(tb)
	s.once.Do(func() {
		env, _, err := LaunchWith(s.Options)
		s.mu.Lock()
		s.env, s.err = env, err
		s.mu.Unlock()
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		tb.Fatal(s.err)
	}
	return s.env
}

// Stop stops the control plane if one was started. Env fails after Stop.
func (s *Shared) Stop() error {
	s.once.Do(func() {})
	s.mu.Lock()
	env := s.env
	s.env, s.err = nil, errors.New("testenv: Shared.Env called after Stop")
	s.mu.Unlock()
	if env == nil {
		return nil
	}
	return env.Stop()
}

// Run is for TestMain: it runs the tests, then stops the control plane, and
// returns the exit code (non-zero also when stopping failed).
func (s *Shared) Run(m *testing.M) int {
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: stopping the control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// tail keeps the last bytes the control plane printed.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func newTail(max int) *tail { return &tail{max: max} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// report returns the kept output, indented, for an error message.
func (t *tail) report() string {
	if t == nil {
		return ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.buf))
	if s == "" {
		return ""
	}
	return "\nlast output of kube-apiserver and etcd:\n\t" + strings.ReplaceAll(s, "\n", "\n\t")
}
