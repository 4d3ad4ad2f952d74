package e2ek8s

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/loopvol/loopvol/internal/harness/cluster"
)

// The node's SSH endpoint, for the suite's disruptive specs. They reach
// the node through e2essh (port 22 of its InternalIP, the key in
// KUBE_SSH_KEY_PATH, the user in KUBE_SSH_USER) to run shell commands
// there (mount | grep, ls, find) and `systemctl stop|start|restart
// kubelet`. This node has no sshd, and its kubelet is a process of the
// test, not a systemd unit. So the test serves SSH itself (golang.org/x/
// crypto/ssh: no sshd to configure, nothing installed on the host) inside
// its network namespace, where the address exists: a command runs with
// sh -c on the host, as root; the systemctl commands for kubelet stop and
// start the cluster's real kubelet; `sudo` is taken away (everything runs
// as root already, and the host may have no sudo).

const (
	// nodeCommandTimeout bounds one command of the suite.
	nodeCommandTimeout = 2 * time.Minute
	// suiteKubeletDir is where the suite looks for kubelet's pod
	// directories, hard-coded in the block specs; the test cluster's
	// kubelet has its own (Cluster.KubeletDir).
	suiteKubeletDir = "/var/lib/kubelet"
)

var (
	kubeletUnitRE = regexp.MustCompile(`^systemctl (stop|start|restart) kubelet$`)
	kubeletShowRE = regexp.MustCompile(`^systemctl show kubelet --property ActiveState --value$`)
)

// nodeSSH is the endpoint; Close stops it.
type nodeSSH struct {
	c        *cluster.Cluster
	listener net.Listener
	config   *ssh.ServerConfig
	wg       sync.WaitGroup
	// kubeletMu serializes the kubelet commands: a restart is a stop and
	// a start.
	kubeletMu sync.Mutex
	logf      func(format string, args ...any)
}

// startNodeSSH serves SSH on addr (host:port) for c's node and returns the
// private key file the suite is to use; the endpoint stops at the test's
// end.
func startNodeSSH(t *testing.T, c *cluster.Cluster, addr, dir string) string {
	t.Helper()
	hostKey, _ := newSSHKey(t)
	client, clientPriv := newSSHKey(t)
	authorized := client.PublicKey()
	block, err := ssh.MarshalPrivateKey(clientPriv, "loopvol e2e-k8s")
	if err != nil {
		t.Fatal(err)
	}
	keyPath := filepath.Join(dir, "node-ssh-key")
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	config := &ssh.ServerConfig{
		PublicKeyCallback: func(_ ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if !bytes.Equal(key.Marshal(), authorized.Marshal()) {
				return nil, errors.New("unknown key")
			}
			return nil, nil
		},
	}
	config.AddHostKey(hostKey)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("node SSH endpoint: %v", err)
	}
	n := &nodeSSH{c: c, listener: l, config: config, logf: t.Logf}
	n.wg.Add(1)
	go n.serve()
	t.Cleanup(n.close)
	t.Logf("node SSH endpoint on %s (key %s)", addr, keyPath)
	return keyPath
}

// newSSHKey makes an ed25519 key: its signer and the private key.
func newSSHKey(t *testing.T) (ssh.Signer, ed25519.PrivateKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return signer, priv
}

func (n *nodeSSH) close() {
	n.listener.Close()
	n.wg.Wait()
}

func (n *nodeSSH) serve() {
	defer n.wg.Done()
	for {
		conn, err := n.listener.Accept()
		if err != nil {
			return // closed
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.handle(conn)
		}()
	}
}

func (n *nodeSSH) handle(conn net.Conn) {
	defer conn.Close()
	sc, chans, reqs, err := ssh.NewServerConn(conn, n.config)
	if err != nil {
		return
	}
	defer sc.Close()
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.UnknownChannelType, "only sessions")
			continue
		}
		ch, chReqs, err := nc.Accept()
		if err != nil {
			continue
		}
		n.session(ch, chReqs)
	}
}

// session answers one "exec" request of a session and closes it; a shell
// or a terminal is refused (the suite asks for neither).
func (n *nodeSSH) session(ch ssh.Channel, reqs <-chan *ssh.Request) {
	defer ch.Close()
	for req := range reqs {
		if req.Type != "exec" {
			req.Reply(false, nil)
			continue
		}
		var payload struct{ Command string }
		if err := ssh.Unmarshal(req.Payload, &payload); err != nil {
			req.Reply(false, nil)
			continue
		}
		req.Reply(true, nil)
		stdout, stderr, code := n.run(payload.Command)
		ch.Write(stdout)
		ch.Stderr().Write(stderr)
		ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
		return
	}
}

// run runs one command of the suite and returns its output and exit code.
func (n *nodeSSH) run(command string) (stdout, stderr []byte, code int) {
	cmd := strings.TrimSpace(command)
	if cmd == "sudo --version" {
		return []byte("commands run as root on the loopvol test node\n"), nil, 0
	}
	cmd = strings.TrimPrefix(cmd, "sudo ")
	if m := kubeletUnitRE.FindStringSubmatch(cmd); m != nil {
		n.logf("node SSH: %s", command)
		if err := n.kubelet(m[1]); err != nil {
			return nil, []byte(err.Error() + "\n"), 1
		}
		return nil, nil, 0
	}
	if kubeletShowRE.MatchString(cmd) {
		if n.c.KubeletRunning() {
			return []byte("active\n"), nil, 0
		}
		return []byte("inactive\n"), nil, 0
	}
	cmd = strings.ReplaceAll(cmd, suiteKubeletDir, n.c.KubeletDir)
	ctx, cancel := context.WithTimeout(context.Background(), nodeCommandTimeout)
	defer cancel()
	var out, errOut bytes.Buffer
	c := exec.CommandContext(ctx, "sh", "-c", cmd)
	c.Stdout, c.Stderr = &out, &errOut
	err := c.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		fmt.Fprintf(&errOut, "%v\n", err)
		code = 255
	}
	return out.Bytes(), errOut.Bytes(), code
}

// kubelet stops, starts or restarts the cluster's kubelet.
func (n *nodeSSH) kubelet(op string) error {
	n.kubeletMu.Lock()
	defer n.kubeletMu.Unlock()
	if op == "stop" || op == "restart" {
		n.c.StopKubelet()
	}
	if op == "start" || op == "restart" {
		return n.c.StartKubelet()
	}
	return nil
}
