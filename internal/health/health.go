package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Checks are the named checks behind /healthz; all must pass. Apart from
// them, a check added with AddOwn is served at /healthz/<name> only. The
// zero value has no check, and all methods may be called at any time from
// any goroutine.
type Checks struct {
	mu     sync.Mutex
	names  []string
	checks []func() error
	own    map[string]func() error
}

// Add adds a check; /healthz fails while it returns an error.
func (h *Checks) Add(name string, check func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.names = append(h.names, name)
	h.checks = append(h.checks, check)
}

// AddOwn serves check at /healthz/<name> and leaves /healthz out of it:
// for a controller whose trouble must not make the whole process unready
// (a webhook waiting for its certificate Secret fails open; the controllers
// beside it must keep the pod Ready).
func (h *Checks) AddOwn(name string, check func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.own == nil {
		h.own = map[string]func() error{}
	}
	h.own[name] = check
}

// Check runs every check of Add and reports the failing ones, each named.
func (h *Checks) Check() error {
	h.mu.Lock()
	names, checks := slices.Clone(h.names), slices.Clone(h.checks)
	h.mu.Unlock()
	var errs []error
	for i, c := range checks {
		if err := c(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", names[i], err))
		}
	}
	return errors.Join(errs...)
}

// Register serves the checks on mux: Check at /healthz and the checks of
// AddOwn under /healthz/ (an unknown name is 404). A failing check answers
// 503 Service Unavailable.
func (h *Checks) Register(mux *http.ServeMux) {
	mux.Handle("/healthz", Handler(h.Check, http.StatusServiceUnavailable))
	mux.Handle("/healthz/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		check := h.own[strings.TrimPrefix(r.URL.Path, "/healthz/")]
		h.mu.Unlock()
		if check == nil {
			http.NotFound(w, r)
			return
		}
		Handler(check, http.StatusServiceUnavailable).ServeHTTP(w, r)
	}))
}

// Handler serves check: "ok" while it passes, else its error with
// failCode.
func Handler(check func() error, failCode int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err := check(); err != nil {
			http.Error(w, err.Error(), failCode)
			return
		}
		fmt.Fprint(w, "ok")
	})
}

// shutdownGrace is how long Serve lets open requests finish once ctx ended.
const shutdownGrace = 5 * time.Second

// Serve serves h on ln until ctx ends, then shuts the server down, open
// requests getting a few seconds to finish, and returns nil. When the
// server stops before (ln failed), Serve returns why at once: the caller
// should then stop the whole process, whose probes and metrics are gone,
// rather than run on unobserved. The caller listens first (net.Listen), so
// that a bad address fails before anything slow starts.
func Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		_ = srv.Close() // requests still open after the grace
	}
	<-served // http.ErrServerClosed
	return nil
}
