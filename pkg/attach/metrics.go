package attach

import (
	"github.com/prometheus/client_golang/prometheus"
)

// noCode is the grpc_status_code label of failures that carry no gRPC code:
// the driver was not called or did not answer with a status (a missing
// PersistentVolume, an unknown node ID, an API error).
const noCode = "None"

// metrics are the controller's own Prometheus metrics, next to the CSI call
// latency (csi_sidecar_operations_seconds, from the csiclient connection)
// and the workqueue metrics (queues named AttachQueueName, DetachQueueName,
// PVQueueName).
type metrics struct {
	attaches         prometheus.Counter
	attachErrors     *prometheus.CounterVec
	detaches         prometheus.Counter
	detachErrors     *prometheus.CounterVec
	reconcileRepairs prometheus.Counter
	leaksRepaired    prometheus.Counter
	callTimeouts     *prometheus.CounterVec
}

// newMetrics builds the metrics and registers them on reg (when not nil),
// with gauges computed at scrape time from tracked: the queue backlog and
// the sizes of the per-VolumeAttachment maps.
func newMetrics(tracked func() trackedObjects, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		attaches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopvol_attacher_attaches_total",
			Help: "VolumeAttachments marked attached (after a successful ControllerPublishVolume, or without one for drivers that do not publish).",
		}),
		attachErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopvol_attacher_attach_errors_total",
			Help: "Failed attach attempts by gRPC code (" + noCode + ": failed before the driver answered, e.g. a missing PersistentVolume or node ID).",
		}, []string{"grpc_status_code"}),
		detaches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopvol_attacher_detaches_total",
			Help: "VolumeAttachments detached (ControllerUnpublishVolume succeeded and the finalizer was removed).",
		}),
		detachErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopvol_attacher_detach_errors_total",
			Help: "Failed detach attempts by gRPC code (" + noCode + ": failed before the driver answered).",
		}, []string{"grpc_status_code"}),
		reconcileRepairs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopvol_attacher_reconcile_resyncs_total",
			Help: "VolumeAttachments the ListVolumes reconcile found disagreeing with the driver and synced again.",
		}),
		leaksRepaired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopvol_attacher_leaked_publishes_unpublished_total",
			Help: "Volumes the reconcile unpublished from a node because the driver listed them published there while no VolumeAttachment wanted them for the whole grace period (e.g. left by a replica that acted after losing its Lease).",
		}),
		callTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopvol_attacher_csi_call_timeouts_total",
			Help: "ControllerPublishVolume and ControllerUnpublishVolume calls that ran out of their timeout (--timeout, grown per VolumeAttachment after a timeout).",
		}, []string{"method"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{m.attaches, m.attachErrors, m.detaches, m.detachErrors, m.reconcileRepairs,
		m.leaksRepaired, m.callTimeouts, queueCollector{tracked}} {
		if err := reg.Register(col); err != nil {
			return nil, err
		}
	}
	return m, nil
}

var (
	queueDepthDesc = prometheus.NewDesc("loopvol_attacher_queue_depth",
		"VolumeAttachments waiting for an attach or a detach: queued, in backoff after a failure, or being processed.",
		[]string{"operation"}, nil)
	queueOldestDesc = prometheus.NewDesc("loopvol_attacher_queue_oldest_item_age_seconds",
		"Age of the oldest VolumeAttachment waiting for an attach or a detach (0 when none waits): how long the worst backlog has lasted.",
		[]string{"operation"}, nil)
	trackedDesc = prometheus.NewDesc("loopvol_attacher_tracked_objects",
		"Entries of the controller's per-object state, by map: pending (waiting for work), written (own last write), forced (reconcile verdicts), "+
			"timeouts (grown call timeouts), locked (being synced), failing (in backoff after a failure) and leaks (published volumes no VolumeAttachment wants, in their grace period). "+
			"With no VolumeAttachment left and nothing in flight every one is 0; one that stays above that leaks memory.",
		[]string{"map"}, nil)
)

// trackedObjects is one reading of the controller's state.
type trackedObjects struct {
	pending *pendingTracker
	sizes   map[string]int
}

// trackedObjects reads the sizes of the controller's per-object maps.
func (c *Controller) trackedObjects() trackedObjects {
	written, force, timeout := c.state.sizes()
	return trackedObjects{pending: c.pending, sizes: map[string]int{
		"pending":  c.pending.size(),
		"written":  written,
		"forced":   force,
		"timeouts": timeout,
		"locked":   c.locks.size(),
		"failing":  c.attachQ.Failing() + c.detachQ.Failing() + c.pvQ.Failing(),
		"leaks":    c.leaks.size(),
	}}
}

// queueCollector computes the backlog and state gauges at scrape time.
type queueCollector struct{ tracked func() trackedObjects }

func (q queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueDepthDesc
	ch <- queueOldestDesc
	ch <- trackedDesc
}

func (q queueCollector) Collect(ch chan<- prometheus.Metric) {
	t := q.tracked()
	for _, op := range []operation{opAttach, opDetach} {
		n, oldest := t.pending.stats(op)
		ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(n), string(op))
		ch <- prometheus.MustNewConstMetric(queueOldestDesc, prometheus.GaugeValue, oldest.Seconds(), string(op))
	}
	for name, n := range t.sizes {
		ch <- prometheus.MustNewConstMetric(trackedDesc, prometheus.GaugeValue, float64(n), name)
	}
}
