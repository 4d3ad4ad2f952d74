package cluster

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// echoServer answers each connection, once the client has half-closed it,
// with "echo:" and all the client sent, then closes it: a reply that only
// comes if the forwarder passed the client's half-close on.
func echoServer(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, err := io.ReadAll(c)
				if err != nil {
					return
				}
				_, _ = c.Write(append([]byte("echo:"), b...))
			}()
		}
	}()
	return l
}

// ask sends msg to addr, half-closes, and returns all that comes back.
func ask(addr, msg string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// readLine reads one line from addr, without its newline ("" on an error),
// and closes the connection.
func readLine(addr string) string {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(line, "\n")
}

// TestForward: the forwarder copies both ways, passes half-closes on, serves
// connections side by side, closes a connection it cannot take further, and
// stops when its listener closes.
func TestForward(t *testing.T) {
	front := func(t *testing.T, target string) (net.Listener, chan struct{}) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		stopped := make(chan struct{})
		go func() { forward(l, target); close(stopped) }()
		return l, stopped
	}

	t.Run("a request and its answer → both ways, the half-close passed on", func(t *testing.T) {
		l, _ := front(t, echoServer(t).Addr().String())
		msg := strings.Repeat("x", 1<<20) // more than one socket buffer
		got, err := ask(l.Addr().String(), msg)
		if err != nil {
			t.Fatal(err)
		}
		if got != "echo:"+msg {
			t.Errorf("got %d bytes back, want %d", len(got), len("echo:"+msg))
		}
	})

	t.Run("20 connections at once → each its own answer", func(t *testing.T) {
		l, _ := front(t, echoServer(t).Addr().String())
		var wg sync.WaitGroup
		errs := make(chan error, 20)
		for i := range 20 {
			wg.Go(func() {
				msg := fmt.Sprintf("client %d", i)
				got, err := ask(l.Addr().String(), msg)
				if err == nil && got != "echo:"+msg {
					err = fmt.Errorf("client %d got %q", i, got)
				}
				if err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("nothing listens behind → the connection closed", func(t *testing.T) {
		gone, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		target := gone.Addr().String()
		gone.Close()
		l, _ := front(t, target)
		got, err := ask(l.Addr().String(), "hello")
		if got != "" {
			t.Errorf("got %q back from nowhere (%v)", got, err)
		}
	})

	t.Run("the listener closed → forward returns", func(t *testing.T) {
		l, stopped := front(t, echoServer(t).Addr().String())
		l.Close()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			t.Fatal("forward still accepting after its listener was closed")
		}
	})
}

// helperEnv makes the test binary TestForwardedHelperProcess's helper.
const helperEnv = "LOOPVOL_TEST_FORWARD_HELPER"

// TestForwardedHelperProcess is not a test: it is the process that
// TestForwardFilesToAProcess starts with listeners to inherit. It forwards
// them (serveForwarded), says whether forwardEnv is gone, and runs until
// its standard input closes.
func TestForwardedHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("the helper of TestForwardFilesToAProcess")
	}
	if err := serveForwarded(); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Printf("forwarding; %s=%q\n", forwardEnv, os.Getenv(forwardEnv))
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestForwardFilesToAProcess: the listeners forwardFiles passes on reach,
// through the process that inherits them, the same ports on 127.0.0.1;
// that process takes forwardEnv out of its environment, and once it exits
// the ports are free again: nothing else holds them. All in this network
// namespace: the listeners are on 127.0.0.2 (loopback too), the backends
// at the same ports on 127.0.0.1.
func TestForwardFilesToAProcess(t *testing.T) {
	var ls []*net.TCPListener
	backends := map[int]bool{}
	for len(ls) < 2 {
		b := echoServer(t)
		port := b.Addr().(*net.TCPAddr).Port
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: port})
		if err != nil {
			continue // taken on 127.0.0.2: another port
		}
		ls = append(ls, l)
		backends[port] = true
	}
	files, entry, err := forwardFiles(ls)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestForwardedHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", entry)
	cmd.ExtraFiles = files
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	closeFiles(files)
	closeListeners(ls)
	defer func() {
		stdin.Close()
		_ = cmd.Wait()
	}()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	if want := fmt.Sprintf("forwarding; %s=%q\n", forwardEnv, ""); line != want {
		t.Fatalf("helper said %q, want %q", line, want)
	}
	for port := range backends {
		addr := net.JoinHostPort("127.0.0.2", strconv.Itoa(port))
		got, err := ask(addr, "through "+addr)
		if err != nil {
			t.Fatal(err)
		}
		if got != "echo:through "+addr {
			t.Errorf("%s: got %q", addr, got)
		}
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v", err)
	}
	for port := range backends {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
		if err != nil {
			t.Errorf("port %d still held after the helper exited: %v", port, err)
			continue
		}
		l.Close()
	}
}

// forwardTestIP is the node address of TestInNetNSForwarding's namespace,
// and forwardTestPortEnv tells the test in there which port to serve.
const (
	forwardTestIP      = "10.200.0.77"
	forwardTestPortEnv = "LOOPVOL_TEST_FORWARD_PORT"
)

// TestInNetNSForwarding, in network namespaces (root): a port of the
// host's namespace reaches a server on 127.0.0.1 in the namespace that
// InNetNSForwarding made, which answers with its own namespace: not the
// host's. The test binary runs this test again in there (child), serves one
// answer and exits; the host's side gets exit code 0.
func TestInNetNSForwarding(t *testing.T) {
	if NetNSNodeIP() == forwardTestIP {
		// The child, in the namespace: the forwarding starts as in a
		// program's main.
		if _, child, err := InNetNSForwarding(forwardTestIP); err != nil || !child {
			t.Fatalf("InNetNSForwarding in its namespace: child %t, %v", child, err)
		}
		port, err := strconv.Atoi(os.Getenv(forwardTestPortEnv))
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		// Not for ever if the host's side gave up.
		_ = l.SetDeadline(time.Now().Add(30 * time.Second))
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ns, err := os.Readlink("/proc/self/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(c, ns+"\n"); err != nil {
			t.Fatal(err)
		}
		// Until the host's side has read it and closed: this process's
		// exit would end the forwarding with the answer still in it.
		_, _ = io.Copy(io.Discard, c)
		return
	}
	testenv.RequireRoot(t)
	if NetNSNodeIP() != "" {
		t.Skip("already in a namespace of InNetNS")
	}
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	t.Setenv(forwardTestPortEnv, strconv.Itoa(port))
	type result struct {
		code int
		err  error
	}
	done := make(chan result, 1)
	go func() {
		code, _, err := inNetNS(forwardTestIP, []string{"-test.run=^TestInNetNSForwarding$"}, []*net.TCPListener{l})
		done <- result{code, err}
	}()
	host, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	timeout := time.After(30 * time.Second)
	var got string
	for got == "" {
		select {
		case r := <-done:
			t.Fatalf("InNetNS returned before the child answered: code %d, %v", r.code, r.err)
		case <-timeout:
			t.Fatal("no answer from the child in 30s")
		default:
		}
		// Closed without an answer until the child listens.
		if got = readLine(addr); got == "" {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !strings.HasPrefix(got, "net:[") || got == host {
		t.Errorf("the answer through port %d: %q, want another network namespace than this one's %s", port, got, host)
	}
	select {
	case r := <-done:
		if r.err != nil || r.code != 0 {
			t.Errorf("InNetNS: code %d, %v", r.code, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not exit")
	}
}
