package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/statusapi"
)

// TestStatusCommand: `driver status` asks a running node plugin (real
// loop devices and mounts: run as root) for its status over the socket
// named by $CSI_ENDPOINT or --endpoint, and prints it as JSON.
func TestStatusCommand(t *testing.T) {
	looptest.RequireRoot(t)
	kubelet := t.TempDir()
	d := startDriver(t, net.Listen, "--mode=node", "--node-id=node-1", "--kubelet-dir="+kubelet, "--max-volumes-per-node=7")
	if code, _ := d.get(t, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz = %d", code)
	}
	t.Setenv(endpointEnv, "unix://"+d.socket)
	var stdout, stderr bytes.Buffer
	if code := mainWithCode([]string{"status"}, &stdout, &stderr); code != 0 {
		t.Fatalf("driver status = %d, stderr:\n%s", code, stderr.String())
	}
	var st statusapi.NodeStatus
	if err := json.Unmarshal(stdout.Bytes(), &st); err != nil {
		t.Fatalf("driver status printed no NodeStatus: %v\n%s", err, stdout.String())
	}
	if st.NodeID != "node-1" || st.MaxVolumes != 7 || st.KubeletDir != filepath.Clean(kubelet) || st.Version != version ||
		len(st.Pools) != 1 || st.Pools[0].Name != "p1" || st.Pools[0].Health != statusapi.HealthOK || st.Pools[0].TotalBytes == 0 {
		t.Errorf("driver status = %+v", st)
	}
}

// TestStatusCommandErrors: a command line without an endpoint is refused
// (2), a driver that does not answer fails the command (1), each with a
// message that says what to do.
func TestStatusCommandErrors(t *testing.T) {
	t.Setenv(endpointEnv, "")
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no endpoint", []string{"status"}, 2, "give --endpoint or set $CSI_ENDPOINT"},
		{"not unix", []string{"status", "--endpoint=tcp://127.0.0.1:1"}, 2, "--endpoint: "},
		{"bad timeout", []string{"status", "--endpoint=unix:///x.sock", "--timeout=0s"}, 2, "--timeout=0s must be positive"},
		{"no driver there", []string{"status", "--endpoint=unix://" + filepath.Join(t.TempDir(), "none.sock"), "--timeout=5s"}, 1, "node status from "},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := mainWithCode(c.args, &stdout, &stderr); code != c.code || !strings.Contains(stderr.String(), c.want) || stdout.Len() != 0 {
				t.Errorf("%q = %d, stdout %q, stderr %q; want %d and %q", c.args, code, stdout.String(), stderr.String(), c.code, c.want)
			}
		})
	}
	var stdout bytes.Buffer
	if code := mainWithCode([]string{"status", "--help"}, &stdout, &stdout); code != 0 || !strings.Contains(stdout.String(), "-endpoint") {
		t.Errorf("driver status --help = %d:\n%s", code, stdout.String())
	}
}
