package kube

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"time"

	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// DefaultProbeInterval is how often an APIHealth probes an unreachable API
// server.
const DefaultProbeInterval = 500 * time.Millisecond

// APIHealth knows whether the API server answers. A request that fails
// without an answer (connection refused or reset, a broken stream) marks
// it down; a successful request or probe marks it up again. While it is
// down, Run probes it every interval, so its return is noticed within
// that time, and then calls the OnRecovered funcs.
//
// Controllers wait in WaitUp before acting: work whose outcome cannot be
// recorded is not worth doing (a driver called for every VolumeAttachment
// again and again, since nothing saves that it was done). The shared
// informers wait there too before listing and watching, instead of
// backing off further with each failure, so their caches catch up as soon
// as the server is back.
//
// The methods of a nil *APIHealth report a server that is always up.
type APIHealth struct {
	probe    func(context.Context) error
	interval time.Duration

	mu        sync.Mutex
	up        bool
	upCh      chan struct{} // closed while up
	downCh    chan struct{} // closed while down
	since     time.Time
	problem   error
	recovered []func()
}

// NewAPIHealth returns an APIHealth that starts up and probes with probe
// (nil: a GET of /readyz through client) every interval (zero:
// DefaultProbeInterval).
func NewAPIHealth(client Client, probe func(context.Context) error, interval time.Duration) *APIHealth {
	if probe == nil {
		probe = readyzProbe(client)
	}
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	h := &APIHealth{probe: probe, interval: interval, up: true, upCh: make(chan struct{}), downCh: make(chan struct{})}
	close(h.upCh)
	return h
}

// readyzProbe GETs /readyz, which every client may read
// (system:public-info-viewer). Fake clientsets have no REST client: their
// server is always up.
func readyzProbe(client Client) func(context.Context) error {
	return func(ctx context.Context) error {
		if client == nil {
			return nil
		}
		rc := client.CoreV1().RESTClient()
		if c, ok := rc.(*rest.RESTClient); rc == nil || ok && c == nil {
			return nil
		}
		return rc.Get().AbsPath("/readyz").Do(ctx).Error()
	}
}

// IsUnreachable reports whether err is a request that got no answer from
// the API server: the connection was refused, reset or broken. An error
// the server answered with (any API status), a gRPC error (a CSI driver's,
// not the API server's) and the end of the caller's context are not.
func IsUnreachable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var st apierrors.APIStatus
	var gs interface{ GRPCStatus() *status.Status }
	if errors.As(err, &st) || errors.As(err, &gs) {
		return false
	}
	if utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) {
		return true
	}
	var ne net.Error
	var ue *url.Error
	return errors.As(err, &ne) || errors.As(err, &ue)
}

// refusalsAreUp is how many probes in a row must be refused with a client
// error before the server counts as up anyway: /readyz is refused (403)
// while a restarted server loads its RBAC roles, when it is not ready yet,
// but always to a client whose cluster took /readyz away from it.
const refusalsAreUp = 20

// answered reports whether err is an answer of a serving API server: a
// client error (403), not a 5xx or 429 of one that is starting or
// overloaded.
func answered(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	code := st.Status().Code
	return code >= 400 && code < 500 && code != 429
}

// Observe records the outcome of one request: an unreachable server marks
// it down, a success marks it up.
func (h *APIHealth) Observe(err error) {
	if h == nil {
		return
	}
	switch {
	case err == nil:
		h.setUp()
	case IsUnreachable(err):
		h.setDown(err)
	}
}

// Gate returns a ready func for Queue.ProcessNext: it waits for first (the
// driver; nil: nothing) and then for the API server to be up.
func (h *APIHealth) Gate(first func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if first != nil {
			if err := first(ctx); err != nil {
				return err
			}
		}
		return h.WaitUp(ctx)
	}
}

// Observing wraps a sync for Queue.ProcessNext so that an error of a
// request that got no answer marks the API server down: the workers then
// wait in Gate instead of failing every item in turn.
func Observing[T any](h *APIHealth, sync func(context.Context, T) error) func(context.Context, T) error {
	return func(ctx context.Context, key T) error {
		err := sync(ctx, key)
		if IsUnreachable(err) {
			h.Observe(err)
		}
		return err
	}
}

// Up reports whether the API server answered the last request.
func (h *APIHealth) Up() bool {
	if h == nil {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.up
}

// WaitUp blocks until the API server is up or ctx ends (then it returns
// ctx's error).
func (h *APIHealth) WaitUp(ctx context.Context) error {
	if h == nil {
		return ctx.Err()
	}
	h.mu.Lock()
	ch := h.upCh
	h.mu.Unlock()
	select {
	case <-ch:
		return ctx.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// OnRecovered adds f to the funcs called (each in a goroutine of its own)
// when the API server is back after being down; remove takes it out again.
// Controllers use it to retry at once what failed while it was down,
// instead of waiting out each item's backoff.
func (h *APIHealth) OnRecovered(f func()) (remove func()) {
	if h == nil {
		return func() {}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recovered = append(h.recovered, f)
	i := len(h.recovered) - 1
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.recovered[i] = nil
	}
}

// Healthy returns nil while the server is up, else since when and why it
// is not.
func (h *APIHealth) Healthy() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.up {
		return nil
	}
	return errors.Join(errors.New("the API server has been unreachable since "+h.since.Format(time.RFC3339)), h.problem)
}

func (h *APIHealth) setDown(problem error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.problem = problem
	if !h.up {
		return
	}
	h.up, h.since = false, time.Now()
	h.upCh = make(chan struct{})
	close(h.downCh)
}

func (h *APIHealth) setUp() {
	h.mu.Lock()
	if h.up {
		h.mu.Unlock()
		return
	}
	h.up, h.problem = true, nil
	close(h.upCh)
	h.downCh = make(chan struct{})
	fs := make([]func(), 0, len(h.recovered))
	for _, f := range h.recovered {
		if f != nil {
			fs = append(fs, f)
		}
	}
	h.mu.Unlock()
	for _, f := range fs {
		go f()
	}
}

// Run probes the API server every interval while it is down, until ctx
// ends. Log lines mark each outage and its end.
func (h *APIHealth) Run(ctx context.Context) {
	if h == nil {
		return
	}
	logger := klog.FromContext(ctx)
	for {
		h.mu.Lock()
		down := h.downCh
		h.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-down:
		}
		h.mu.Lock()
		since, problem := h.since, h.problem
		h.mu.Unlock()
		logger.Error(problem, "The API server is unreachable; waiting for it before acting", "probeInterval", h.interval)
		t := time.NewTicker(h.interval)
		refused := 0
		for !h.Up() {
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			pctx, cancel := context.WithTimeout(ctx, 5*h.interval)
			err := h.probe(pctx)
			cancel()
			if answered(err) {
				refused++
			} else {
				refused = 0
			}
			if err == nil || refused >= refusalsAreUp {
				h.setUp()
			} else if ctx.Err() == nil && refused > 0 {
				logger.V(4).Info("The API server answers but refuses the readiness probe; probing again", "refusals", refused)
			} else if ctx.Err() == nil {
				logger.V(4).Info("The API server is still unreachable", "err", err.Error())
			}
		}
		t.Stop()
		logger.Info("The API server is reachable again", "unreachableFor", time.Since(since).Round(time.Millisecond))
	}
}
