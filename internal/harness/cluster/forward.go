package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// forwardEnv tells the process InNetNSForwarding started which ports its
// inherited listeners stand for: a comma-separated list whose i-th entry
// is the port of the listener at file descriptor 3+i (exec.Cmd.ExtraFiles).
const forwardEnv = "LOOPVOL_CLUSTER_FORWARD"

// forwardDialTimeout bounds the dial to the port inside the namespace; a
// loopback dial fails at once when nothing listens, so this only matters
// when the namespace's server is too busy to accept.
const forwardDialTimeout = 10 * time.Second

// InNetNSForwarding is InNetNS with a way in from the calling network
// namespace (the host's): each of hostPorts, a TCP port on 127.0.0.1 there,
// reaches the same port on 127.0.0.1 in the new namespace. A cluster kept
// up in the namespace (make demo KEEP=1) is then reachable with its
// kubeconfig (https://127.0.0.1:<Config.APIPort>, a name the apiserver's
// certificate holds) from any shell of the host, while nothing else of it
// is.
//
// The listeners are made here, before the program runs again, so that a
// port already taken is an error at once and no process in the host's
// namespace has to outlive the call: the new process inherits them
// (exec.Cmd.ExtraFiles), accepts on them and copies each connection to and
// from its own 127.0.0.1:<port>. They close when it exits. Called in that
// process (child true), it starts the forwarding and returns at once.
// A connection accepted while nothing listens inside is closed.
func InNetNSForwarding(nodeIP string, hostPorts ...int) (code int, child bool, err error) {
	if os.Getenv(netnsEnv) != "" {
		// The process started below, or one in a namespace for another
		// address: inNetNS tells them apart.
		return inNetNS(nodeIP, os.Args[1:], nil)
	}
	var ls []*net.TCPListener
	for _, p := range hostPorts {
		if p < 1 || p > 65535 {
			closeListeners(ls)
			return 0, false, fmt.Errorf("forwarded port %d out of range", p)
		}
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: p})
		if err != nil {
			closeListeners(ls)
			return 0, false, fmt.Errorf("port %d forwarded into the cluster's network namespace: %w", p, err)
		}
		ls = append(ls, l)
	}
	defer closeListeners(ls)
	return inNetNS(nodeIP, os.Args[1:], ls)
}

func closeListeners(ls []*net.TCPListener) {
	for _, l := range ls {
		l.Close()
	}
}

// forwardFiles are the listeners as files for exec.Cmd.ExtraFiles, and the
// environment entry that names their ports (forwardEnv). It is always one
// entry, empty without listeners, so that a value inherited from further
// up never names descriptors this process did not pass on.
func forwardFiles(ls []*net.TCPListener) ([]*os.File, string, error) {
	var files []*os.File
	var ports []string
	for _, l := range ls {
		f, err := l.File()
		if err != nil {
			closeFiles(files)
			return nil, "", err
		}
		files = append(files, f)
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	return files, forwardEnv + "=" + strings.Join(ports, ","), nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// serveForwarded starts forwarding on the listeners this process inherited
// (forwardEnv), each to the same port on 127.0.0.1 of its own namespace.
// It unsets forwardEnv, so that a second call, or a program this one
// starts, never takes other descriptors for the listeners.
func serveForwarded() error {
	spec := os.Getenv(forwardEnv)
	os.Unsetenv(forwardEnv)
	if spec == "" {
		return nil
	}
	var errs []error
	for i, p := range strings.Split(spec, ",") {
		port, err := strconv.Atoi(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%s: %w", forwardEnv, spec, err))
			continue
		}
		f := os.NewFile(uintptr(3+i), "forwarded-"+p)
		// FileListener takes a descriptor of its own (close-on-exec);
		// the inherited one is closed, or every daemon started from
		// here would hold the port too.
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("forwarded port %d: %w", port, err))
			continue
		}
		go forward(l, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	}
	return errors.Join(errs...)
}

// forward accepts on l until it is closed and copies each connection to
// and from target.
func forward(l net.Listener, target string) {
	for {
		conn, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, say: try again rather than drop the
			// way in for good.
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go proxy(conn, target)
	}
}

// proxy copies in to a new connection to target and back. Each direction
// passes its end on as a half-close (the client's request, say, complete
// while it still reads the answer); both closes wait for both directions.
func proxy(in net.Conn, target string) {
	defer in.Close()
	out, err := net.DialTimeout("tcp", target, forwardDialTimeout)
	if err != nil {
		return
	}
	defer out.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err != nil {
			// src failed (a reset): dst gets no half-close but the
			// whole close, which also ends the other direction's read.
			dst.Close()
			src.Close()
		} else if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}
