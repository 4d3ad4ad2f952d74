package kube

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/utils/clock"
)

// ValidateController reports the first of the settings that every
// controller of the sidecar has which cannot work, or nil: each
// controller's Config.Validate starts with it, so that the same mistake
// reads the same whichever controller it is made for. csi is the
// controller's driver connection, as whichever interface of it the
// controller uses.
func ValidateController(driverName string, client Client, informers *Informers, csi any, workers int, retryStart, retryMax time.Duration) error {
	switch {
	case driverName == "":
		return errors.New("the driver name is empty")
	case client == nil:
		return errors.New("no Kubernetes client")
	case informers == nil:
		return errors.New("no shared informers")
	case csi == nil:
		return errors.New("no CSI driver connection")
	case workers < 1:
		return fmt.Errorf("workers must be at least 1, not %d", workers)
	}
	return ValidateBackoff(retryStart, retryMax)
}

// Every calls f each period of clk until ctx ends. The first call comes
// one period after the start: the controllers queue everything when they
// start anyway, and a periodic pass (a reconcile, a poll) is for what
// changes later.
func Every(ctx context.Context, clk clock.WithTicker, period time.Duration, f func()) {
	t := clk.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			f()
		}
	}
}
