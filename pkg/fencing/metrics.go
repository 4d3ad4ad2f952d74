package fencing

import "github.com/prometheus/client_golang/prometheus"

// metrics are the fencing controller's own; the driver counts the volumes
// it fenced (loopvol_fenced_volumes_total) and how long each took.
type metrics struct {
	fenceCalls  *prometheus.CounterVec
	nodesFenced prometheus.Counter
	nodesBack   prometheus.Counter
	taints      *prometheus.CounterVec
	detection   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		fenceCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopvol_fencing_calls_total",
			Help: "FenceNode calls to the driver, by result (ok, error).",
		}, []string{"result"}),
		nodesFenced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopvol_fenced_nodes_total",
			Help: "Nodes fenced: their heartbeat went unrenewed for the fencing period while their kubelet was not Ready.",
		}),
		nodesBack: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "loopvol_fenced_nodes_back_total",
			Help: "Fenced nodes that renewed their heartbeat again.",
		}),
		taints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loopvol_fencing_out_of_service_taints_total",
			Help: "node.kubernetes.io/out-of-service taints the fencing controller added and removed (--fencing-taint-out-of-service).",
		}, []string{"change"}),
		detection: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "loopvol_fencing_heartbeat_age_seconds",
			Help:    "How long a node's heartbeat had gone unrenewed, as the fencing controller saw it, when the node was fenced.",
			Buckets: prometheus.LinearBuckets(5, 5, 24), // 5 s … 2 min
		}),
	}
	if reg != nil {
		reg.MustRegister(m.fenceCalls, m.nodesFenced, m.nodesBack, m.taints, m.detection)
	}
	return m
}
