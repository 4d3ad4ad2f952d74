package main

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/pkg/capacity"
)

// capacityConfig holds the flags of the capacity controller, with the
// upstream external-provisioner's names.
type capacityConfig struct {
	pollInterval     time.Duration
	ownerrefLevel    int
	immediateBinding bool
	threads          uint
	kubeAPIQPS       float64
	kubeAPIBurst     int
}

// addFlags declares the capacity controller's flags.
func (c *capacityConfig) addFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.pollInterval, "capacity-poll-interval", time.Minute,
		"capacity: how often every CSIStorageCapacity is checked against the driver's GetCapacity even when nothing changed in Kubernetes, for capacity that changes behind its back. "+
			"Volumes created, resized or deleted (their PersistentVolumes), classes, CSINodes and Node labels update the objects at once, without waiting for it. Nothing is written when nothing changed.")
	fs.IntVar(&c.ownerrefLevel, "capacity-ownerref-level", 1,
		"capacity: owner of the CSIStorageCapacity objects, counted up the ownership chain from the Pod $POD_NAME in $NAMESPACE: -1 none, 0 the Pod, 1 its StatefulSet or DaemonSet, 2 the Deployment of its ReplicaSet, and so on. "+
			"The objects are garbage-collected with the owner.")
	fs.BoolVar(&c.immediateBinding, "capacity-for-immediate-binding", false,
		"capacity: also publish for StorageClasses with Immediate volume binding. The scheduler reads capacity only for WaitForFirstConsumer classes; this is for other consumers or debugging.")
	fs.UintVar(&c.threads, "capacity-threads", 4,
		"capacity: concurrent syncs of CSIStorageCapacity objects (a GetCapacity call and, when the figures changed, one write). "+
			"4 (upstream: 1) keeps the writes of --kube-api-capacity-qps flowing while a slow GetCapacity or a write waits on its answer.")
	fs.Float64Var(&c.kubeAPIQPS, "kube-api-capacity-qps", 20,
		"capacity: sustained rate of CSIStorageCapacity writes, a budget of their own (a separate client), so capacity never delays attaches. "+
			"Writes happen only when a figure changed, so 20 (upstream: 1) is idle in steady state; it publishes 3000 objects (1000 nodes, 3 classes) in about 2.5 minutes where upstream's 1 needs 50.")
	fs.IntVar(&c.kubeAPIBurst, "kube-api-capacity-burst", 100,
		"capacity: burst of CSIStorageCapacity writes above --kube-api-capacity-qps (upstream: 5). 100 publishes a new class on 100 nodes at once.")
}

// validate checks the capacity controller's flags; called only when it runs.
func (c *capacityConfig) validate(cfg *config) error {
	switch {
	case c.pollInterval <= 0:
		return fmt.Errorf("--capacity-poll-interval must be positive, not %s", c.pollInterval)
	case c.ownerrefLevel < -1:
		return fmt.Errorf("--capacity-ownerref-level must be -1 (no owner) or more, not %d", c.ownerrefLevel)
	case c.threads == 0:
		return errors.New("--capacity-threads must be greater than zero")
	case c.threads > 1000:
		return fmt.Errorf("--capacity-threads=%d is more than 1000", c.threads)
	case c.kubeAPIQPS <= 0:
		return fmt.Errorf("--kube-api-capacity-qps must be greater than zero, not %g", c.kubeAPIQPS)
	case c.kubeAPIBurst < 1:
		return fmt.Errorf("--kube-api-capacity-burst must be at least 1, not %d", c.kubeAPIBurst)
	}
	return nil
}

// buildCapacity builds the capacity controller (external-provisioner's
// --enable-capacity). Its objects live in $NAMESPACE; with an owner level
// of 0 or more $POD_NAME names the Pod the owner is found from. With
// --node-deployment it publishes the node's own segment and needs no Lease
// (each node's instance manages only its own objects).
func buildCapacity(d *deps) (*runner, error) {
	c := &d.cfg.capacity
	ns := d.env("NAMESPACE")
	if ns == "" {
		return nil, errors.New("$NAMESPACE is empty: it names the namespace of the CSIStorageCapacity objects (set it from metadata.namespace with the downward API)")
	}
	// Writes get a client of their own, with their own rate limiter: the
	// shared one is the budget of every other controller.
	rc := rest.CopyConfig(d.rest)
	rc.QPS, rc.Burst = float32(c.kubeAPIQPS), c.kubeAPIBurst
	rc.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(rc.QPS, rc.Burst)
	writer, err := kube.NewClient(rc)
	if err != nil {
		return nil, err
	}
	var owner capacity.OwnerFunc
	if c.ownerrefLevel >= 0 {
		pod := d.env("POD_NAME")
		if pod == "" {
			return nil, fmt.Errorf("$POD_NAME is empty: --capacity-ownerref-level=%d finds the owner of the CSIStorageCapacity objects from this Pod (set it from metadata.name with the downward API, or use -1 for no owner)", c.ownerrefLevel)
		}
		getter, err := capacity.NewMetadataGetter(d.rest)
		if err != nil {
			return nil, err
		}
		owner = capacity.OwnerLookup(getter, ns, pod, c.ownerrefLevel)
	}
	var node string
	if d.cfg.nodeDeployment {
		node = d.cfg.nodeName
	}
	ctrl, err := capacity.New(capacity.Config{
		DriverName:         d.driver,
		Client:             writer,
		Informers:          d.informers,
		CSI:                d.csi,
		Namespace:          ns,
		NodeName:           node,
		Owner:              owner,
		PollInterval:       c.pollInterval,
		ImmediateBinding:   c.immediateBinding,
		Workers:            int(c.threads),
		RetryIntervalStart: d.cfg.retryIntervalStart,
		RetryIntervalMax:   d.cfg.retryIntervalMax,
		Registerer:         d.registry,
	})
	if err != nil {
		return nil, err
	}
	r := &runner{lease: capacity.LeaseName(d.driver), run: ctrl.Run}
	if node != "" {
		r.lease = ""
	}
	return r, nil
}
