package registrar

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/unixsock"
)

// registration serves kubelet's plugin registration API on the
// registration socket and keeps the socket in place:
//
//   - a socket left by an earlier run is replaced at the start;
//   - a socket that vanishes (deleted by hand, by a terminating old
//     instance, by a cleanup of the directory) is created again at once, so
//     kubelet's plugin watcher sees it and registers the driver again;
//   - a socket that another process replaced is left to that process (a
//     newer instance of this sidecar: two instances fighting over the path
//     would make kubelet register and deregister the driver in a loop);
//   - when kubelet reports that the registration failed, the socket is
//     created again after an exponential backoff, which makes kubelet try
//     again; the process never exits for it.
//
// Kubelet tells the plugin the outcome of a registration with
// NotifyRegistrationStatus; until it reported success on the current
// socket, registered returns an error.
type registration struct {
	registerapi.UnimplementedRegistrationServer

	driver     string
	endpoint   string
	path       string
	checkEvery time.Duration
	retryStart time.Duration
	retryMax   time.Duration
	clock      clock.WithTicker
	// onRegistered is called after each successful registration; may be
	// nil.
	onRegistered func()

	// kicked is signalled when kubelet reported an outcome.
	kicked chan struct{}

	mu sync.Mutex
	// ctx is the context of run while it serves (nil otherwise): the
	// GetInfo that live sends over the socket ends with it.
	ctx       context.Context
	confirmed bool      // kubelet confirmed on the current socket
	failure   string    // kubelet's error of the last failed registration
	since     time.Time // when the current state began
	serving   bool      // the socket is in place and served
}

func newRegistration(cfg Config, onRegistered func()) *registration {
	return &registration{
		driver:       cfg.DriverName,
		endpoint:     cfg.KubeletRegistrationPath,
		path:         socketPath(cfg.PluginRegistrationPath, cfg.DriverName),
		checkEvery:   cfg.SocketCheckInterval,
		retryStart:   cfg.RetryIntervalStart,
		retryMax:     cfg.RetryIntervalMax,
		clock:        cfg.Clock,
		onRegistered: onRegistered,
		kicked:       make(chan struct{}, 1),
		since:        cfg.Clock.Now(),
	}
}

// GetInfo is kubelet's first call: what kind of plugin this is, its name,
// where its CSI socket is and which versions it speaks.
func (r *registration) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	klog.FromContext(ctx).V(5).Info("Sending the plugin info")
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.driver,
		Endpoint:          r.endpoint,
		SupportedVersions: slices.Clone(supportedVersions),
	}, nil
}

// NotifyRegistrationStatus is kubelet's report of the outcome. A failure is
// logged and retried by creating the socket again after a backoff; it never
// ends the process (upstream's registrar exits, and its container restarts
// in a loop while the cause lasts).
func (r *registration) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	logger := klog.FromContext(ctx)
	failure := ""
	if !st.GetPluginRegistered() {
		failure = st.GetError()
		if failure == "" {
			failure = "kubelet gave no reason"
		}
	}
	r.mu.Lock()
	was := r.confirmed
	r.confirmed = st.GetPluginRegistered()
	r.failure = failure
	if was != r.confirmed || !r.confirmed {
		r.since = r.clock.Now()
	}
	r.mu.Unlock()
	if st.GetPluginRegistered() {
		if was {
			logger.V(2).Info("Kubelet confirmed the registration again", "socket", r.path)
		} else {
			logger.Info("Kubelet registered the driver", "socket", r.path, "endpoint", r.endpoint)
		}
		if r.onRegistered != nil {
			r.onRegistered()
		}
	} else {
		logger.Error(errors.New(failure), "Kubelet failed to register the driver; the registration socket will be created again to retry", "socket", r.path)
	}
	select {
	case r.kicked <- struct{}{}:
	default:
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// registered returns nil when kubelet confirmed the registration on the
// current socket, else why not.
func (r *registration) registered() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	waited := r.clock.Since(r.since).Round(time.Second)
	switch {
	case r.confirmed:
		return nil
	case r.failure != "":
		return fmt.Errorf("kubelet reported %s ago that the registration failed: %s", waited, r.failure)
	case !r.serving:
		return fmt.Errorf("this process does not serve the registration socket %s (for %s): it is being created again, or another process replaced it", r.path, waited)
	default:
		return fmt.Errorf("kubelet has not confirmed the registration on %s yet (waiting for %s)", r.path, waited)
	}
}

// live sends GetInfo over the registration socket, as kubelet does, and
// checks the answer: the socket exists, something answers on it, and it
// names this driver. The call is bounded by timeout and ends with run: a
// registrar that stopped serving is not live, whoever answers.
func (r *registration) live(timeout time.Duration) error {
	st, err := os.Lstat(r.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("the registration socket %s does not exist", r.path)
	case err != nil:
		return fmt.Errorf("the registration socket: %w", err)
	case st.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("%s is not a socket", r.path)
	}
	r.mu.Lock()
	runCtx := r.ctx
	r.mu.Unlock()
	if runCtx == nil {
		return fmt.Errorf("this process does not serve the registration socket %s", r.path)
	}
	conn, err := grpc.NewClient("unix://"+r.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to the registration socket %s: %w", r.path, err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(runCtx, timeout)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo over the registration socket %s: %w", r.path, err)
	}
	if info.GetName() != r.driver {
		return fmt.Errorf("the registration socket %s serves driver %q, not %q", r.path, info.GetName(), r.driver)
	}
	return nil
}

// run puts the socket in place and serves it until ctx ends, then removes
// it. It returns an error only when the first socket cannot be made.
func (r *registration) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	l, err := unixsock.Listen(r.path, 0o600)
	if err != nil {
		return fmt.Errorf("registration socket: %w", err)
	}
	r.mu.Lock()
	r.ctx = ctx
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.ctx = nil
		r.mu.Unlock()
	}()
	backoff := r.retryStart
	for {
		start := r.clock.Now()
		srv := r.serve(ctx, l)
		logger.Info("Serving the plugin registration socket", "socket", r.path)
		again := r.watch(ctx, l, &backoff)
		srv.Stop() // closes l, which removes the socket if it is still ours
		_ = l.Close()
		r.stopServing()
		if !again {
			logger.Info("Stopped serving the plugin registration socket", "socket", r.path, "servedFor", r.clock.Since(start).Round(time.Second))
			return nil
		}
		// Create it again; failures here (a full disk, a file put in the
		// way) are retried with backoff, not fatal: kubelet registered
		// the driver before, and the cause may pass.
		for {
			if l, err = unixsock.Listen(r.path, 0o600); err == nil {
				break
			}
			logger.Error(err, "Could not create the registration socket again; retrying", "socket", r.path, "retryAfter", backoff)
			if !r.sleep(ctx, backoff) {
				return nil
			}
			backoff = min(2*backoff, r.retryMax)
		}
	}
}

// serve starts a gRPC server of the registration API on l.
func (r *registration) serve(ctx context.Context, l *unixsock.Listener) *grpc.Server {
	logger := klog.FromContext(ctx)
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		return handler(klog.NewContext(ctx, logger.WithValues("method", info.FullMethod)), req)
	}))
	registerapi.RegisterRegistrationServer(srv, r)
	r.mu.Lock()
	// A new socket is a new registration: kubelet deregistered the driver
	// when the old one went, and says nothing until it registered again.
	// The last failure, if any, stays the reason until then.
	r.confirmed = false
	r.serving = true
	if r.failure == "" {
		r.since = r.clock.Now()
	}
	r.mu.Unlock()
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			logger.Error(err, "Registration server failed", "socket", r.path)
		}
	}()
	return srv
}

// stopServing records that this process no longer serves the socket
// kubelet sees: kubelet's registration, if any, is not this process's.
func (r *registration) stopServing() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.serving = false
	r.confirmed = false
	r.since = r.clock.Now()
}

// watch waits until ctx ends (false) or the socket must be created again
// (true): it vanished, or kubelet reported a failed registration and the
// backoff passed. backoff is the wait before the next retry; it doubles
// with each failure and starts again after a success.
func (r *registration) watch(ctx context.Context, l *unixsock.Listener, backoff *time.Duration) bool {
	logger := klog.FromContext(ctx)
	tick := r.clock.NewTicker(r.checkEvery)
	defer tick.Stop()
	var retry <-chan time.Time
	replaced := false
	for {
		select {
		case <-ctx.Done():
			return false
		case <-r.kicked:
			r.mu.Lock()
			ok := r.confirmed
			r.mu.Unlock()
			switch {
			case ok:
				retry = nil
				*backoff = r.retryStart
			case retry == nil:
				logger.Info("Creating the registration socket again after a pause, so that kubelet retries the registration", "socket", r.path, "after", *backoff)
				retry = r.clock.After(*backoff)
				*backoff = min(2**backoff, r.retryMax)
			}
		case <-retry:
			return true
		case <-tick.C():
			mine, err := l.InPlace()
			if err != nil {
				logger.V(2).Info("Could not check the registration socket", "socket", r.path, "err", err.Error())
				continue
			}
			if mine {
				replaced = false
				continue
			}
			if _, err := os.Lstat(r.path); errors.Is(err, fs.ErrNotExist) {
				logger.Info("The registration socket vanished; creating it again", "socket", r.path)
				return true
			}
			if !replaced {
				// Another process put its socket here: a newer instance
				// of this sidecar. It owns the registration now; taking
				// the path back would make kubelet re-register in a loop.
				logger.Info("Another process replaced the registration socket; leaving it to that process", "socket", r.path)
				replaced = true
				r.stopServing()
			}
		}
	}
}

// sleep waits d or until ctx ends (false).
func (r *registration) sleep(ctx context.Context, d time.Duration) bool {
	t := r.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
