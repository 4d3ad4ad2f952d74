package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/pkg/csiclient"
)

// ClaimConfig is the part of a claim controller's Config that the claim
// controllers (resize.Config, modify.Config) share; cmd/attacher fills one
// for both, as upstream's external-resizer gives its two controllers the
// same flags.
type ClaimConfig struct {
	// DriverName is the CSI driver's name: only claims bound to
	// PersistentVolumes of this driver are acted on.
	DriverName string
	// Client talks to the Kubernetes API.
	Client Client
	// Informers are the process's shared informers; the caller starts
	// them. The controllers read PersistentVolumeClaims and
	// PersistentVolumes (the modify controller VolumeAttributesClasses
	// too).
	Informers *Informers
	// Recorder records the Events on claims. Optional: when nil, each
	// controller records through its own broadcaster to the Events API
	// while it runs.
	Recorder record.EventRecorder
	// Workers is the number of claims a controller syncs at once.
	Workers int
	// Resync is how often every claim is looked at again even when nothing
	// changed; zero: only the informers' own resync.
	Resync time.Duration
	// RetryIntervalStart and RetryIntervalMax bound the per-claim
	// exponential backoff after a failure.
	RetryIntervalStart time.Duration
	RetryIntervalMax   time.Duration
	// Registerer receives the controllers' metrics. Optional.
	Registerer prometheus.Registerer
	// NodeName, when set, limits the controllers to the volumes whose node
	// affinity admits that node (--node-deployment: one sidecar per node,
	// next to a driver that serves only that node's pools; VolumeOnNode).
	NodeName string
	// Clock is the controllers' clock (condition times, retry windows, the
	// times of their own writes). Optional: nil is the real clock.
	Clock clock.PassiveClock
}

// ClaimDriver is the part of a CSI driver connection every claim
// controller uses; *csiclient.Client implements it. Each controller's own
// interface adds the RPCs it calls.
type ClaimDriver interface {
	// WaitReady blocks until the driver is connected and ready, or ctx
	// ends (then it returns ctx's error). Workers wait here while the
	// driver socket is gone, instead of failing every claim.
	WaitReady(ctx context.Context) error
	// Capabilities returns the driver's current capabilities.
	Capabilities() csiclient.Capabilities
}

// Validate reports the first field of c that cannot work, or that driver,
// the controller's CSI driver connection, is nil.
func (c ClaimConfig) Validate(driver ClaimDriver) error {
	switch {
	case c.DriverName == "":
		return errors.New("the driver name is empty")
	case c.Client == nil:
		return errors.New("no Kubernetes client")
	case driver == nil:
		return errors.New("no CSI driver connection")
	case c.Informers == nil:
		return errors.New("no shared informers")
	case c.Workers < 1:
		return fmt.Errorf("workers must be at least 1, not %d", c.Workers)
	case c.Resync < 0:
		return fmt.Errorf("the resync period must not be negative, not %s", c.Resync)
	}
	return ValidateBackoff(c.RetryIntervalStart, c.RetryIntervalMax)
}
