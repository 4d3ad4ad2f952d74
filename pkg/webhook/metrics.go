package webhook

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the webhook's own Prometheus metrics.
type metrics struct {
	reviews     *prometheus.HistogramVec
	connections prometheus.GaugeFunc
}

// reviewBuckets are in seconds: the answers come from caches in well under
// a millisecond, a class check calls the driver (bounded at 2 s), and the
// configuration's timeouts are 3 and 5 s.
var reviewBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}

// newMetrics builds the metrics; conns reports the open connections.
func newMetrics(reg prometheus.Registerer, conns func() float64) (*metrics, error) {
	m := &metrics{
		reviews: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "loopvol_webhook_review_duration_seconds",
			Help: "Time to answer one AdmissionReview, from the request read to the response written, by kind reviewed " +
				"(PersistentVolumeClaim, StorageClass; \"\" for a malformed review), operation and whether it was allowed.",
			Buckets: reviewBuckets,
		}, []string{"kind", "operation", "allowed"}),
		connections: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "loopvol_webhook_connections",
			Help: "Open connections to the webhook's HTTPS port, at most --webhook-max-connections (more wait to be accepted).",
		}, conns),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.reviews, m.connections} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// observe records one answer; a Webhook built without New has no metrics.
func (m *metrics) observe(kind, operation string, allowed bool, start time.Time) {
	if m == nil {
		return
	}
	m.reviews.WithLabelValues(kind, operation, strconv.FormatBool(allowed)).Observe(time.Since(start).Seconds())
}
