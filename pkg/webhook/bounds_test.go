package webhook

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/loopvol/loopvol/internal/harness/testcert"
	"github.com/loopvol/loopvol/internal/kube"
)

// memory is the Go heap in use and the process's resident set, in MiB.
type memory struct{ heap, rss float64 }

func (m memory) String() string { return fmt.Sprintf("heap %.0f MiB, RSS %.0f MiB", m.heap, m.rss) }

// measure reads the memory now; settled collects the garbage and returns
// freed pages to the OS first, so that only what is still held counts.
func measure(t *testing.T, settled bool) memory {
	if settled {
		runtime.GC()
		debug.FreeOSMemory()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(statm))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	const mib = 1 << 20
	return memory{heap: float64(ms.HeapInuse) / mib, rss: float64(pages*int64(os.Getpagesize())) / mib}
}

// peakMemory samples the memory every 20 ms until stop is called, which
// returns the largest figures seen (a sample may miss a peak, never
// invent one).
func peakMemory(t *testing.T) (stop func() memory) {
	var peak memory
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			m := measure(t, false)
			peak.heap, peak.rss = max(peak.heap, m.heap), max(peak.rss, m.rss)
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() memory {
		close(quit)
		<-done
		return peak
	}
}

// TestRunBoundsHostileClients runs the real server on loopback and
// attacks it over real TLS connections: 60 clients each send the headers
// of a 7 MB review and 6 MiB of its body, then nothing; one sends half a
// request line; one asks once and then idles. The server closes every one
// of them (ReadTimeout, ReadHeaderTimeout, IdleTimeout), never has more
// than MaxConnections open, never reads more than MaxRequestsInFlight
// bodies at once, and what the stalled bodies held is freed. The memory
// figures before, at the peak and after are logged. Without the bounds
// every stalled body is read at once (60 × 6 MiB in the heap) and no
// connection is ever closed.
func TestRunBoundsHostileClients(t *testing.T) {
	const (
		stalled     = 60
		sent        = 6 << 20
		connections = 32
		inFlight    = 4
	)
	dir := t.TempDir()
	ca := testcert.Loopback(t).Write(t, dir)
	addr := freeAddress(t)
	client := fake.NewClientset()
	ctx, clk, w, _ := start(t, Config{
		DriverName: testDriver, Informers: kube.NewInformers(client, 0), Namespace: "loopvol", CSI: &fakeCSI{},
		Address: addr, CertDir: dir,
		ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second, IdleTimeout: time.Second,
		MaxConnections: connections, MaxRequestsInFlight: inFlight,
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	tlsConfig := &tls.Config{RootCAs: pool, NextProtos: []string{"h2", "http/1.1"}}
	review := reviewBody(t, pvcRequest(t, admissionv1.Create, claim("lv", gi, ""), nil))
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig.Clone(), DisableKeepAlives: true}, Timeout: 5 * time.Second}
	if err := stepUntil(ctx, clk, func(context.Context) (bool, error) {
		rsp, err := hc.Post("https://"+addr+Path, "application/json", bytes.NewReader(review))
		if err != nil {
			return false, nil
		}
		rsp.Body.Close()
		if rsp.ProtoMajor != 1 {
			t.Errorf("served over %s: want HTTP/1.1 only", rsp.Proto)
		}
		return rsp.StatusCode == http.StatusOK, nil
	}); err != nil {
		t.Fatalf("never served: %v", err)
	}

	// dial opens a TLS connection and registers its close. The handshake
	// of one beyond MaxConnections waits until the server accepts it.
	var open sync.WaitGroup
	dial := func() *tls.Conn {
		c, err := tls.Dial("tcp", addr, tlsConfig)
		if err != nil {
			t.Error(err)
			return nil
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// closedBy waits until the server closes c and returns the status
	// line it answered with, if any.
	closedBy := func(c *tls.Conn) string {
		r := bufio.NewReader(c)
		line, _ := r.ReadString('\n')
		_, _ = io.Copy(io.Discard, r)
		return strings.TrimSpace(line)
	}

	before := measure(t, true)
	stop := peakMemory(t)
	body := bytes.Repeat([]byte("x"), sent)
	var mu sync.Mutex
	answers := map[string]int{}
	var closed atomic.Int32
	for range stalled {
		open.Add(1)
		go func() {
			defer open.Done()
			c := dial()
			if c == nil {
				return
			}
			go func() {
				fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", Path, addr, MaxBodyBytes)
				_, _ = c.Write(body) // and then nothing more: it stalls
			}()
			line := closedBy(c)
			closed.Add(1)
			mu.Lock()
			answers[line]++
			mu.Unlock()
		}()
	}
	// Half a request line, then silence; and a client that asks once and
	// then keeps its connection idle.
	var slowHeader, idle string
	open.Add(2)
	go func() {
		defer open.Done()
		if c := dial(); c != nil {
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\n", Path)
			slowHeader = closedBy(c)
		}
	}()
	go func() {
		defer open.Done()
		c := dial()
		if c == nil {
			return
		}
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", Path, addr, len(review), review)
		r := bufio.NewReader(c)
		rsp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Errorf("idle client's review: %v", err)
			return
		}
		_, _ = io.Copy(io.Discard, rsp.Body)
		rsp.Body.Close()
		idle = rsp.Status
		if _, err := r.ReadByte(); err == nil {
			t.Error("the idle connection sent more than its answer")
		}
	}()
	all := make(chan struct{})
	go func() { open.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(90 * time.Second):
		peak := stop()
		t.Fatalf("after 90 s, %d of %d stalled connections are still open (and the slow and idle ones unless logged): before %s, peak %s, %d connections open at most",
			stalled-int(closed.Load()), stalled, before, peak, w.peakConns.Load())
	}
	peak := stop()
	after := measure(t, true)
	t.Logf("%d stalled connections with %d MiB sent each: before %s; peak %s; after all were closed %s", stalled, sent>>20, before, peak, after)
	t.Logf("answers to the stalled connections: %v; half a request line: %q; idle after one review (%s): closed", answers, slowHeader, idle)
	t.Logf("connections open at most: %d (limit %d)", w.peakConns.Load(), connections)

	if n := w.peakConns.Load(); n > connections {
		t.Errorf("%d connections open at once, more than MaxConnections %d", n, connections)
	}
	// Bodies held at once: at most inFlight of them; each costs up to
	// twice its size while io.ReadAll grows, and garbage waits for the
	// collector, hence the factor 2, and 96 MiB for the rest of the
	// test (the clients' buffers, TLS, and the race detector's heavier
	// allocations: a -race run of make test peaked at 130 MiB against a
	// margin of 64). Without the bound, the 32 connections' bodies alone
	// would hold 192 MiB or more.
	if bound := before.heap + float64(inFlight*MaxBodyBytes*2>>20) + 96; peak.heap > bound {
		t.Errorf("heap peaked at %.0f MiB, above %.0f MiB: more than %d bodies were held at once", peak.heap, bound, inFlight)
	}
	if after.heap > before.heap+16 {
		t.Errorf("heap %.0f MiB after the connections were closed, %.0f MiB before: the stalled bodies were not freed", after.heap, before.heap)
	}
	for line := range answers {
		if line != "" && !strings.Contains(line, " 400 ") && !strings.Contains(line, " 503 ") {
			t.Errorf("a stalled connection was answered %q, want 400 (body not read in time) or 503 (no turn)", line)
		}
	}
}
