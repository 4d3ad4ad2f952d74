package leasewatch

import (
	"errors"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection"
)

// HealthTimeout is how long past a missed Lease renewal a Health check
// still passes (upstream's value).
const HealthTimeout = 20 * time.Second

// Health watches every Lease this process runs for, for one health check
// (the sidecars' /healthz/leader-election). The zero value watches none.
type Health struct {
	mu       sync.Mutex
	adaptors []*leaderelection.HealthzAdaptor
}

// Add returns the watchdog of one more Lease, for its Config.Health.
func (h *Health) Add() *leaderelection.HealthzAdaptor {
	a := leaderelection.NewLeaderHealthzAdaptor(HealthTimeout)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.adaptors = append(h.adaptors, a)
	return a
}

// Check fails while the leader of any Lease watched has missed its
// renewal by more than HealthTimeout; a replica that is not leading passes.
func (h *Health) Check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for _, a := range h.adaptors {
		errs = append(errs, a.Check(nil))
	}
	return errors.Join(errs...)
}
