package testenv

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
)

// watchdog is a small shell process that kills the control plane and removes
// its directories if the test binary dies without calling Stop: envtest puts
// kube-apiserver and etcd in process groups of their own (Setpgid), so a
// -timeout panic, ^C or os.Exit would otherwise leave them running, holding
// ports and temp dirs, until someone noticed.
//
// The kernel tells the watchdog of the death (PR_SET_PDEATHSIG). That signal
// follows the thread that started the watchdog, not the process, so the
// thread is locked to a goroutine that lives until stop.
type watchdog struct {
	cmd     *exec.Cmd
	release chan struct{}
	done    chan struct{}
}

// watchdogScript gets the number of process ids, the ids, then directories.
// It waits for SIGTERM (sent by the kernel when the test binary dies), then
// kills each process group, waits briefly for the processes to go and
// removes the directories. Stop kills it with SIGKILL, which it cannot trap.
// It says "ready" once its trap is set: a SIGTERM before that would end the
// shell without cleaning up (a test binary that dies at once after Launch,
// on a loaded CI machine where the shell had not yet read its script), so
// startWatchdog returns only after that line.
const watchdogScript = `
n=$1; shift
cleanup() {
	trap '' TERM HUP INT
	kill "$sleeper" 2>/dev/null
	i=0
	for a in "$@"; do
		# dash's kill takes no "--"; "-KILL -PID" is the form both shells read.
		if [ "$i" -lt "$n" ]; then kill -KILL "-$a" 2>/dev/null; kill -KILL "$a" 2>/dev/null; fi
		i=$((i+1))
	done
	i=0
	for a in "$@"; do
		if [ "$i" -lt "$n" ]; then
			t=0
			while kill -0 "$a" 2>/dev/null && [ "$t" -lt 50 ]; do sleep 0.1; t=$((t+1)); done
		fi
		i=$((i+1))
	done
	i=0
	for a in "$@"; do
		if [ "$i" -ge "$n" ]; then rm -rf -- "$a"; fi
		i=$((i+1))
	done
	exit 0
}
trap 'cleanup "$@"' TERM HUP INT
echo ready
exec >/dev/null
sleep 2147483647 &
sleeper=$!
wait "$sleeper"
`

// startWatchdog watches the children of this process that run one of exes
// with one of dirs on their command line (so only this Env's processes), and
// the dirs. It is best effort: without /bin/sh or /proc it returns nil,
// and the control plane still stops normally through Stop.
func startWatchdog(exes, dirs []string) *watchdog {
	var keep []string
	for _, d := range dirs {
		if d != "" {
			keep = append(keep, d)
		}
	}
	pids := childrenRunning(exes, keep)
	if len(pids) == 0 && len(keep) == 0 {
		return nil
	}
	args := []string{"-c", watchdogScript, "testenv-watchdog", strconv.Itoa(len(pids))}
	for _, pid := range pids {
		args = append(args, strconv.Itoa(pid))
	}
	args = append(args, keep...)

	w := &watchdog{release: make(chan struct{}), done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer close(w.done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command("/bin/sh", args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		out, err := cmd.StdoutPipe()
		if err != nil {
			started <- err
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "ready\n" {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			started <- fmt.Errorf("watchdog did not start: %q, %v", line, err)
			return
		}
		w.cmd = cmd
		started <- nil
		<-w.release
	}()
	if err := <-started; err != nil {
		return nil
	}
	return w
}

// stop ends the watchdog without letting it act.
func (w *watchdog) stop() {
	if w == nil {
		return
	}
	_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
	_ = w.cmd.Wait()
	close(w.release)
	<-w.done
}

// childrenRunning returns the ids of this process's children whose
// executable is one of exes and whose command line mentions one of dirs.
func childrenRunning(exes, dirs []string) []int {
	want := map[string]bool{}
	for _, e := range exes {
		want[e] = true
		if r, err := filepath.EvalSymlinks(e); err == nil {
			want[r] = true
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		proc := "/proc/" + ent.Name()
		stat, err := os.ReadFile(proc + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		fields := bytes.Fields(stat[i+1:])
		if len(fields) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(string(fields[1])); err != nil || ppid != self {
			continue
		}
		exe, err := os.Readlink(proc + "/exe")
		if err != nil {
			continue
		}
		exe = string(bytes.TrimSuffix([]byte(exe), []byte(" (deleted)")))
		if !want[exe] {
			continue
		}
		cmdline, err := os.ReadFile(proc + "/cmdline")
		if err != nil {
			continue
		}
		for _, d := range dirs {
			if bytes.Contains(cmdline, []byte(d)) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}
