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
}

// newMetrics builds the metrics and registers them, with the queue gauges
// computed from pending at scrape time, on reg (when not nil).
func newMetrics(pending *pendingTracker, reg prometheus.Registerer) (*metrics, error) {
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
	}
	if reg == nil {
		return m, nil
	}
	for _, col := range []prometheus.Collector{m.attaches, m.attachErrors, m.detaches, m.detachErrors, m.reconcileRepairs, queueCollector{pending}} {
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
)

// queueCollector computes the backlog gauges at scrape time.
type queueCollector struct{ pending *pendingTracker }

func (q queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueDepthDesc
	ch <- queueOldestDesc
}

func (q queueCollector) Collect(ch chan<- prometheus.Metric) {
	for _, op := range []operation{opAttach, opDetach} {
		n, oldest := q.pending.stats(op)
		ch <- prometheus.MustNewConstMetric(queueDepthDesc, prometheus.GaugeValue, float64(n), string(op))
		ch <- prometheus.MustNewConstMetric(queueOldestDesc, prometheus.GaugeValue, oldest.Seconds(), string(op))
	}
}
