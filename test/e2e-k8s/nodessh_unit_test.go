package e2ek8s

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// TestNodeSSH: the node's SSH endpoint runs the suite's commands with
// their output and exit code, maps /var/lib/kubelet to the cluster's
// kubelet directory, answers for sudo and for kubelet's unit, and lets in
// only the key it made.
func TestNodeSSH(t *testing.T) {
	dir := t.TempDir()
	c := &cluster.Cluster{KubeletDir: filepath.Join(dir, "kubelet")}
	if err := os.MkdirAll(filepath.Join(c.KubeletDir, "pods", "uid-1"), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	keyPath := startNodeSSH(t, c, addr, dir)

	key, err := os.ReadFile(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	client, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.InsecureIgnoreHostKey()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for _, tc := range []struct {
		cmd            string
		stdout, stderr string
		code           int
	}{
		{cmd: "echo out; echo err >&2; exit 3", stdout: "out\n", stderr: "err\n", code: 3},
		{cmd: "sudo --version", stdout: "commands run as root on the loopvol test node\n"},
		{cmd: `sudo sh -c "ls /var/lib/kubelet/pods/ | grep uid"`, stdout: "uid-1\n"},
		{cmd: "systemctl show kubelet --property ActiveState --value", stdout: "inactive\n"},
	} {
		s, err := client.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		var stdout, stderr strings.Builder
		s.Stdout, s.Stderr = &stdout, &stderr
		err = s.Run(tc.cmd)
		code := 0
		var exit *ssh.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitStatus()
		} else if err != nil {
			t.Fatalf("%q: %v", tc.cmd, err)
		}
		if stdout.String() != tc.stdout || stderr.String() != tc.stderr || code != tc.code {
			t.Errorf("%q: stdout %q, stderr %q, code %d; want %q, %q, %d", tc.cmd, stdout.String(), stderr.String(), code, tc.stdout, tc.stderr, tc.code)
		}
	}

	otherSigner, _ := newSSHKey(t)
	if c, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{User: "root", Auth: []ssh.AuthMethod{ssh.PublicKeys(otherSigner)}, HostKeyCallback: ssh.InsecureIgnoreHostKey()}); err == nil {
		c.Close()
		t.Error("another key was let in")
	}
}
