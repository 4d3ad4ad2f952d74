package main

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestColourOnlyOnATerminal(t *testing.T) {
	for _, args := range [][]string{{"status"}, {"volumes", "-A"}, {"doctor"}, {"describe", "pvc", "logs-web-0"}} {
		f := newFixture(t)
		plain, _, _ := f.run(t, "default", false, args...)
		colour, _, _ := f.run(t, "default", true, args...)
		if strings.Contains(plain, "\x1b[") {
			t.Errorf("%v without a terminal has colour", args)
		}
		if !strings.Contains(colour, "\x1b[") {
			t.Errorf("%v on a terminal has no colour", args)
		}
		// Colour moves no column: without its sequences the screen is the plain one.
		stripped := colour
		for _, seq := range []string{ansi[good], ansi[bad], ansi[warn], reset} {
			stripped = strings.ReplaceAll(stripped, seq, "")
		}
		if stripped != plain {
			t.Errorf("%v: the coloured screen without its colours differs from the plain one:\n%s\n---\n%s", args, stripped, plain)
		}
	}
}

func TestBadOutputFormat(t *testing.T) {
	f := newFixture(t)
	_, stderr, code := f.run(t, "default", false, "status", "-o", "wide")
	if code != 1 || !strings.Contains(stderr, `--output "wide"`) {
		t.Errorf("exit %d, stderr %q; want 1 and the bad format named", code, stderr)
	}
}

func TestNodeErrorShownNotFatal(t *testing.T) {
	f := newFixture(t)
	f.nodes.err["worker-2"] = errors.New(`/driver status in loopvol/loopvol-node-9fj3d: container "driver" not found`)
	out, stderr, code := f.run(t, "default", false, "status")
	if code != 0 {
		t.Fatalf("exit code %d; stderr %s", code, stderr)
	}
	if !strings.Contains(out, `worker-2: /driver status in loopvol/loopvol-node-9fj3d: container "driver" not found`) {
		t.Errorf("the node's error is not shown:\n%s", out)
	}
	if !strings.Contains(out, "worker-3  default") {
		t.Errorf("the other nodes' pools are missing:\n%s", out)
	}
}

func TestNoSnapshotCRD(t *testing.T) {
	f := newFixture(t)
	f.noSnapshotCRD = true
	out, stderr, code := f.run(t, "default", false, "volumes")
	if code != 0 {
		t.Fatalf("exit code %d; stderr %s", code, stderr)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
		if !strings.HasSuffix(l, "  -") {
			t.Errorf("snapshots not unknown without the CRD: %q", l)
		}
	}
}

func TestDecodeStatus(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "loopvol", Name: "loopvol-node-4xk2p"}}
	buf := func(s string) *limitedBuffer {
		b := &limitedBuffer{max: 64}
		_, _ = b.Write([]byte(s))
		return b
	}
	st, err := decodeStatus(p, buf(`{"nodeID":"worker-1","pools":[{"name":"default","health":"ok"}]}`), "", nil)
	if err != nil || st.NodeID != "worker-1" || len(st.Pools) != 1 {
		t.Errorf("got %+v, %v", st, err)
	}
	_, err = decodeStatus(p, buf(""), "starting\nstatus: dial unix /csi/csi.sock: connect: no such file or directory\n", errors.New("command terminated with exit code 1"))
	if err == nil || !strings.Contains(err.Error(), "loopvol/loopvol-node-4xk2p: command terminated with exit code 1: status: dial unix") {
		t.Errorf("error %v: want the Pod, the exec error and stderr's last line", err)
	}
	_, err = decodeStatus(p, buf("not json"), "", nil)
	if err == nil || !strings.Contains(err.Error(), "no NodeStatus") {
		t.Errorf("error %v for output that is no JSON", err)
	}
	_, err = decodeStatus(p, buf(strings.Repeat("x", 100)), "", nil)
	if err == nil || !strings.Contains(err.Error(), "more than 64 bytes") {
		t.Errorf("error %v for output over the bound", err)
	}
}

func TestBytesIEC(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1023: "1023", 1536: "1.5Ki", 10 << 30: "10Gi", 200 << 30: "200Gi", 1 << 40: "1Ti", 3 << 29: "1.5Gi"} {
		if got := bytesIEC(n); got != want {
			t.Errorf("bytesIEC(%d) = %q, want %q", n, got, want)
		}
	}
}
