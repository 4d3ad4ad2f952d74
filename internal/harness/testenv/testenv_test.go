package testenv

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestControlPlane(t *testing.T) {
	env := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The binaries from bin/ are the pinned ones, not whatever envtest found.
	v, err := env.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if v.GitVersion != "v1.37.2" {
		t.Errorf("kube-apiserver reports %s, want v1.37.2 (bin/ built without hack/tools/build.sh?)", v.GitVersion)
	}

	ns, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: "testenv-smoke"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	want := map[string]string{"size": "1Gi", "fs": "ext4"}
	if _, err := env.Client.CoreV1().ConfigMaps(ns.Name).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "pool"},
		Data:       want,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create configmap: %v", err)
	}
	got, err := env.Client.CoreV1().ConfigMaps(ns.Name).Get(ctx, "pool", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get configmap: %v", err)
	}
	if got.Data["size"] != "1Gi" || got.Data["fs"] != "ext4" || len(got.Data) != 2 {
		t.Errorf("configmap data = %v, want %v", got.Data, want)
	}

	// The API server validates, unlike a fake clientset.
	_, err = env.Client.CoreV1().ConfigMaps(ns.Name).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "Not_A_Valid_Name"},
	}, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Errorf("creating a configmap with an invalid name: err = %v, want Invalid", err)
	}

	// What a separate binary would do: load the kubeconfig file, list.
	path := env.Kubeconfig(t)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig %s: %v, mode %v; want 0600", path, err, fi.Mode().Perm())
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	fromFile, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset from kubeconfig: %v", err)
	}
	list, err := fromFile.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list namespaces through the kubeconfig: %v", err)
	}
	var names []string
	for _, n := range list.Items {
		names = append(names, n.Name)
	}
	for _, n := range []string{"default", "kube-system", "testenv-smoke"} {
		if !slices.Contains(names, n) {
			t.Errorf("namespaces = %v, missing %s", names, n)
		}
	}

	// RBAC is on: a user in no group may not read other namespaces' objects,
	// and Namespace gives each test a fresh one.
	nobody, err := kubernetes.NewForConfig(env.UserConfig(t, "nobody"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nobody.CoreV1().ConfigMaps(ns.Name).Get(ctx, "pool", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("unprivileged get: err = %v, want Forbidden", err)
	}
	if a, b := env.Namespace(t), env.Namespace(t); a == b || !strings.HasPrefix(a, "loopvol-test-") {
		t.Errorf("Namespace gave %q and %q", a, b)
	}
}

// TestStopLeavesNothing checks what Stop promises: no process, directory or
// listening port left.
func TestStopLeavesNothing(t *testing.T) {
	SkipIfNoBinaries(t)
	env, stop, err := Launch()
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{
		env.te.ControlPlane.APIServer.CertDir,
		env.te.ControlPlane.Etcd.DataDir,
		env.te.WebhookInstallOptions.LocalServingCertDir,
	}
	pids := childrenRunning([]string{
		filepath.Join(env.te.BinaryAssetsDirectory, "kube-apiserver"),
		filepath.Join(env.te.BinaryAssetsDirectory, "etcd"),
	}, dirs)
	if len(pids) != 2 {
		t.Errorf("found %d control-plane processes (%v), want 2", len(pids), pids)
	}
	if env.watchdog == nil {
		t.Error("no watchdog")
	}
	host := env.Config.Host
	if err := stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := env.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("process %d still exists after Stop", pid)
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Stop (%v)", d, err)
		}
	}
	if _, err := env.Client.Discovery().ServerVersion(); err == nil {
		t.Errorf("API server at %s still answers after Stop", host)
	}
}

// TestWatchdogAfterCrash runs a copy of this test binary that starts a
// control plane and exits without stopping it, as a -timeout panic would;
// the watchdog must then kill both processes and remove their directories.
func TestWatchdogAfterCrash(t *testing.T) {
	if os.Getenv("TESTENV_CRASH_CHILD") == "1" {
		env, _, err := Launch()
		if err != nil {
			fmt.Println("error", err)
			os.Exit(3)
		}
		bin := env.te.BinaryAssetsDirectory
		dirs := []string{env.te.ControlPlane.APIServer.CertDir, env.te.ControlPlane.Etcd.DataDir, env.te.WebhookInstallOptions.LocalServingCertDir}
		for _, pid := range childrenRunning([]string{filepath.Join(bin, "kube-apiserver"), filepath.Join(bin, "etcd")}, dirs) {
			fmt.Println("pid", pid)
		}
		for _, d := range dirs {
			fmt.Println("dir", d)
		}
		os.Exit(7) // no Stop
	}
	SkipIfNoBinaries(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestWatchdogAfterCrash$")
	cmd.Env = append(os.Environ(), "TESTENV_CRASH_CHILD=1")
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var pids []int
	var dirs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		kind, val, _ := strings.Cut(sc.Text(), " ")
		switch kind {
		case "pid":
			pid, _ := strconv.Atoi(val)
			pids = append(pids, pid)
		case "dir":
			dirs = append(dirs, val)
		}
	}
	if len(pids) != 2 || len(dirs) != 3 {
		t.Fatalf("child reported pids %v and dirs %v:\n%s", pids, dirs, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var left []string
		for _, pid := range pids {
			if alive(pid) {
				left = append(left, fmt.Sprint("process ", pid))
			}
		}
		for _, d := range dirs {
			if _, err := os.Stat(d); err == nil {
				left = append(left, d)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, pid := range pids {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
			for _, d := range dirs {
				_ = os.RemoveAll(d)
			}
			t.Fatalf("20s after the test binary died, still there: %v", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWatchdogExitAtOnce is the race TestWatchdogAfterCrash once lost on a
// loaded CI machine: the test binary dies the moment the watchdog is started,
// before a slow shell could have set its trap. startWatchdog must not return
// before the watchdog is able to clean up.
func TestWatchdogExitAtOnce(t *testing.T) {
	if dir := os.Getenv("TESTENV_EXIT_CHILD_DIR"); dir != "" {
		if startWatchdog(nil, []string{dir}) == nil {
			os.Exit(3)
		}
		os.Exit(7)
	}
	parent := t.TempDir()
	for round := range 20 {
		dir := filepath.Join(parent, strconv.Itoa(round))
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestWatchdogExitAtOnce$")
		cmd.Env = append(os.Environ(), "TESTENV_EXIT_CHILD_DIR="+dir)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
			t.Fatalf("round %d: child: %v\n%s", round, err, out)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			if _, err := os.Stat(dir); os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: 20s after the test binary died, %s is still there", round, dir)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// alive reports whether pid exists and is not a zombie waiting for a reaper.
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || !bytes.HasPrefix(bytes.TrimSpace(stat[i+1:]), []byte("Z"))
}

func TestShared(t *testing.T) {
	var s Shared
	a := s.Env(t)
	if b := s.Env(t); a != b {
		t.Error("Shared.Env started a second control plane")
	}
	if _, err := a.Client.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{}); err != nil {
		t.Error(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestRepoRootAndBinDir(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if mod, err := readModulePath(filepath.Join(root, "go.mod")); err != nil || mod != modulePath {
		t.Errorf("RepoRoot %s: module %q, %v", root, mod, err)
	}
	if _, err := os.Stat(filepath.Join(root, "internal", "harness", "testenv")); err != nil {
		t.Errorf("RepoRoot %s does not hold internal/harness/testenv: %v", root, err)
	}
	bin, _ := BinDir()
	if bin != filepath.Join(root, "bin") {
		t.Errorf("BinDir = %s", bin)
	}
}

func TestReadModulePath(t *testing.T) {
	dir := t.TempDir()
	for text, want := range map[string]string{
		"module github.com/loopvol/loopvol\n\ngo 1.26\n":     modulePath,
		"// c\nmodule \"github.com/loopvol/loopvol\" // x\n": modulePath,
		"module github.com/loopvol/loopvol/hack/tools\n":     modulePath + "/hack/tools",
		"modulex foo\nmodule\tgithub.com/loopvol/loopvol\n":  modulePath,
	} {
		p := filepath.Join(dir, "go.mod")
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := readModulePath(p); err != nil || got != want {
			t.Errorf("readModulePath(%q) = %q, %v; want %q", text, got, err, want)
		}
	}
}

func TestTailKeepsTheEnd(t *testing.T) {
	tl := newTail(8)
	tl.Write([]byte("abcdef"))
	tl.Write([]byte("ghijkl"))
	if got := string(tl.buf); got != "efghijkl" {
		t.Errorf("tail = %q", got)
	}
	if r := tl.report(); !strings.Contains(r, "efghijkl") {
		t.Errorf("report = %q", r)
	}
	if r := newTail(8).report(); r != "" {
		t.Errorf("empty report = %q", r)
	}
}
