package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/loopvol/loopvol/internal/harness/proc"
)

// sidecar is one attacher process, ours or external-attacher, started the
// same way for both (internal/harness/proc) so that neither is measured
// differently; it adds the CPU and memory readings the benchmark reports.
type sidecar struct{ *proc.Process }

// startSidecar runs bin with args, its output in dir/<name>.log, and stops
// it when tb ends (printing the log tail if tb failed).
func startSidecar(tb testing.TB, dir, name, bin string, args ...string) *sidecar {
	tb.Helper()
	return &sidecar{proc.Start(tb, bin, dir, name, args...)}
}

// memory is a process's memory figures from /proc/<pid>/status, in bytes.
type memory struct {
	peakRSS int64 // VmHWM: the peak resident set size
	anon    int64 // RssAnon now: heap, stacks (what the Go runtime holds)
	file    int64 // RssFile now: mapped pages of the binary and libraries
}

// memory reads the process's memory figures; the process must still run.
func (s *sidecar) memory() (memory, error) {
	var m memory
	if !s.Running() {
		return m, fmt.Errorf("%s has ended: %v", s.Name, s.Err())
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.Pid()))
	if err != nil {
		return m, err
	}
	fields := map[string]*int64{"VmHWM:": &m.peakRSS, "RssAnon:": &m.anon, "RssFile:": &m.file}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text()) // "VmHWM:   12345 kB"
		if len(f) != 3 || fields[f[0]] == nil {
			continue
		}
		if f[2] != "kB" {
			return m, fmt.Errorf("unexpected line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return m, fmt.Errorf("line %q: %w", sc.Text(), err)
		}
		*fields[f[0]] = kb << 10
		delete(fields, f[0])
	}
	if len(fields) > 0 {
		return m, fmt.Errorf("/proc/%d/status lacks some of VmHWM, RssAnon, RssFile", s.Pid())
	}
	return m, nil
}

// cpuTime returns the user plus system CPU time the process has used
// (utime and stime of /proc/<pid>/stat, in clock ticks of 1/100 s, the
// USER_HZ of every Linux architecture Go runs on).
func (s *sidecar) cpuTime() (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.Pid()))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields count from the
	// last ')'. utime and stime are fields 14 and 15.
	i := bytes.LastIndexByte(data, ')')
	f := strings.Fields(string(data[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat %q", s.Pid(), data)
	}
	var ticks int64
	for _, field := range f[11:13] {
		n, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return 0, err
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// otherProcesses counts the processes named comm beyond the first: the
// benchmark's control plane has one kube-apiserver, and another one means
// some other test shares the machine's two cores.
func otherProcesses(comm string) int {
	dirs, _ := os.ReadDir("/proc")
	n := 0
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", d.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(data)) == comm {
			n++
		}
	}
	return max(0, n-1)
}

// cpuSample is the machine's CPU time from /proc/stat, in clock ticks.
type cpuSample struct{ busy, total int64 }

func readCPUSample() cpuSample {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return cpuSample{}
	}
	var c cpuSample
	for i, field := range f[1:9] {
		n, _ := strconv.ParseInt(field, 10, 64)
		c.total += n
		if i != 3 && i != 4 { // idle, iowait
			c.busy += n
		}
	}
	return c
}

// busySince returns the busy share of the CPU time between s0 and c.
func (c cpuSample) busySince(s0 cpuSample) float64 {
	if c.total <= s0.total {
		return 0
	}
	return float64(c.busy-s0.busy) / float64(c.total-s0.total)
}
