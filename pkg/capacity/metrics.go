package capacity

import (
	"github.com/prometheus/client_golang/prometheus"
	storagev1 "k8s.io/api/storage/v1"
)

// The object gauges, with the upstream external-provisioner's names and
// meanings, computed from the caches at scrape time. The latency of each
// GetCapacity call is csi_sidecar_operations_seconds of the driver
// connection; the queue is QueueName in the workqueue metrics.
var (
	goalDesc = prometheus.NewDesc("csistoragecapacities_desired_goal",
		"Number of CSIStorageCapacity objects that are supposed to be managed automatically: wanted storage classes times topology segments.",
		nil, nil)
	currentDesc = prometheus.NewDesc("csistoragecapacities_desired_current",
		"Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.",
		nil, nil)
	obsoleteDesc = prometheus.NewDesc("csistoragecapacities_obsolete",
		"Number of CSIStorageCapacity objects that exist and will be deleted automatically (their class or segment is gone). Objects that exist and may need an update are not counted.",
		nil, nil)
)

// collector computes the object gauges at scrape time.
type collector struct{ c *Controller }

func (m collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- goalDesc
	ch <- currentDesc
	ch <- obsoleteDesc
}

func (m collector) Collect(ch chan<- prometheus.Metric) {
	goal, current, obsolete := m.c.objectCounts()
	ch <- prometheus.MustNewConstMetric(goalDesc, prometheus.GaugeValue, float64(goal))
	ch <- prometheus.MustNewConstMetric(currentDesc, prometheus.GaugeValue, float64(current))
	ch <- prometheus.MustNewConstMetric(obsoleteDesc, prometheus.GaugeValue, float64(obsolete))
}

// objectCounts returns how many objects should exist, how many of those do
// (a duplicate counts once), and how many existing ones should not.
func (c *Controller) objectCounts() (goal, current, obsolete int) {
	classes := c.wantedClasses()
	segs := c.topo.keys()
	wanted := make(map[workItem]bool, len(classes)*len(segs))
	for _, class := range classes {
		for _, seg := range segs {
			wanted[workItem{class: class, segment: seg}] = true
		}
	}
	seen := map[workItem]bool{}
	for _, obj := range c.objects.List() {
		o, ok := obj.(*storagev1.CSIStorageCapacity)
		if !ok {
			continue
		}
		it := itemOf(o)
		switch {
		case !wanted[it]:
			obsolete++
		case !seen[it]:
			seen[it] = true
			current++
		}
	}
	return len(wanted), current, obsolete
}
