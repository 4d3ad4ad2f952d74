package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// KillAPIServer kills kube-apiserver with SIGKILL (etcd keeps running),
// for tests of what clients do while the API server is gone, and returns a
// func that starts it again with the same command line (same port,
// certificates and etcd) and waits until it serves. Call the returned func
// exactly once; Stop ends the new process like the first.
func (e *Env) KillAPIServer() (restart func() error, err error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(bin, "kube-apiserver")
	certDir := e.te.ControlPlane.APIServer.CertDir
	e.restartMu.Lock()
	defer e.restartMu.Unlock()
	pids := childrenRunning([]string{path}, []string{certDir})
	if len(pids) != 1 {
		return nil, fmt.Errorf("testenv: found %d kube-apiserver processes of this Env, want 1", len(pids))
	}
	pid := pids[0]
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil, fmt.Errorf("testenv: read the kube-apiserver command line: %w", err)
	}
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return nil, fmt.Errorf("testenv: kill kube-apiserver: %w", err)
	}
	if e.restarted != nil && e.restarted.Process.Pid == pid {
		_ = e.restarted.Wait()
		e.restarted = nil
	} else {
		// envtest's own process: its waiter reaps it.
		for deadline := time.Now().Add(30 * time.Second); ; {
			if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("testenv: kube-apiserver (pid %d) still there 30s after SIGKILL", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return func() error {
		e.restartMu.Lock()
		defer e.restartMu.Unlock()
		cmd := exec.Command(path)
		for _, a := range args[1:] {
			cmd.Args = append(cmd.Args, string(a))
		}
		cmd.Stdout, cmd.Stderr = e.output, e.output
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("testenv: start kube-apiserver again: %w", err)
		}
		e.restarted = cmd
		// The watchdog knew the old process only.
		e.watchdog.stop()
		e.watchdog = startWatchdog([]string{path, filepath.Join(bin, "etcd")}, e.watchdogDirs)
		started := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		for {
			// /readyz, not a first answer: it passes only once the
			// authorizer's caches have synced (see WarmUps).
			err := e.Client.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx).Error()
			if err == nil {
				e.warmUps = append(e.warmUps, Window{Start: started, End: time.Now()})
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("testenv: kube-apiserver did not serve within %s of its restart: %w%s", startTimeout, err, e.output.report())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}, nil
}

// stopRestarted ends a kube-apiserver that KillAPIServer's restart started.
func (e *Env) stopRestarted() error {
	e.restartMu.Lock()
	defer e.restartMu.Unlock()
	if e.restarted == nil {
		return nil
	}
	cmd := e.restarted
	e.restarted = nil
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
	return nil
}
