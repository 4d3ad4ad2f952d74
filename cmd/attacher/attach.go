package main

import (
	"github.com/loopvol/loopvol/pkg/attach"
)

// buildAttach builds the VolumeAttachment controller (external-attacher).
func buildAttach(d *deps) (*runner, error) {
	var node string
	if d.cfg.nodeDeployment {
		node = d.cfg.nodeName
	}
	c, err := attach.New(attach.Config{
		DriverName:         d.driver,
		Client:             d.client,
		Informers:          d.informers,
		CSI:                d.csi,
		Workers:            int(d.cfg.workerThreads),
		RetryIntervalStart: d.cfg.retryIntervalStart,
		RetryIntervalMax:   d.cfg.retryIntervalMax,
		ReconcileSync:      d.cfg.reconcileSync,
		Timeout:            d.cfg.timeout,
		DefaultFSType:      d.cfg.defaultFSType,
		Registerer:         d.registry,
		NodeName:           node,
	})
	if err != nil {
		return nil, err
	}
	return &runner{lease: attach.LeaseName(d.driver), run: c.Run}, nil
}
