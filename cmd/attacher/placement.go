package main

import (
	"github.com/loopvol/loopvol/pkg/placement"
)

// buildPlacement builds the controller that explains Pods waiting for the
// node their volume lives on. With --node-deployment each node's sidecar
// speaks of its own volumes.
func buildPlacement(d *deps) (*runner, error) {
	var node string
	if d.cfg.nodeDeployment {
		node = d.cfg.nodeName
	}
	c, err := placement.New(placement.Config{
		DriverName:         d.driver,
		Client:             d.client,
		Informers:          d.informers,
		NodeName:           node,
		Workers:            max(1, int(d.cfg.workerThreads)/8),
		RetryIntervalStart: d.cfg.retryIntervalStart,
		RetryIntervalMax:   d.cfg.retryIntervalMax,
	})
	if err != nil {
		return nil, err
	}
	return &runner{lease: placement.LeaseName(d.driver), run: c.Run}, nil
}
