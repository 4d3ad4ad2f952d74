package capacity

import (
	"time"

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
	// loopvol's own: upstream has no figure of how fresh the objects are.
	oldestCheckDesc = prometheus.NewDesc("loopvol_capacity_oldest_check_seconds",
		"Seconds since the least recently checked CSIStorageCapacity object that should exist was last confirmed against the driver (GetCapacity answered and the object was written or already right), or since the controller started acting for one never confirmed. Only the acting replica reports it; compare with loopvol_capacity_poll_interval_seconds.",
		nil, nil)
	pollIntervalDesc = prometheus.NewDesc("loopvol_capacity_poll_interval_seconds",
		"How often every CSIStorageCapacity object is checked against the driver (--capacity-poll-interval).",
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
	ch <- oldestCheckDesc
	ch <- pollIntervalDesc
}

func (m collector) Collect(ch chan<- prometheus.Metric) {
	goal, current, obsolete := m.c.objectCounts()
	ch <- prometheus.MustNewConstMetric(goalDesc, prometheus.GaugeValue, float64(goal))
	ch <- prometheus.MustNewConstMetric(currentDesc, prometheus.GaugeValue, float64(current))
	ch <- prometheus.MustNewConstMetric(obsoleteDesc, prometheus.GaugeValue, float64(obsolete))
	ch <- prometheus.MustNewConstMetric(pollIntervalDesc, prometheus.GaugeValue, m.c.cfg.PollInterval.Seconds())
	if age, ok := m.c.oldestCheck(); ok {
		ch <- prometheus.MustNewConstMetric(oldestCheckDesc, prometheus.GaugeValue, age.Seconds())
	}
}

// oldestCheck is how long ago the least recently confirmed object that
// should exist was confirmed (since the start for one never confirmed);
// false on a replica that is not acting.
func (c *Controller) oldestCheck() (time.Duration, bool) {
	classes, segs := c.wantedClasses(), c.topo.keys()
	now := c.clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started.IsZero() {
		return 0, false
	}
	oldest := now
	for _, class := range classes {
		for _, seg := range segs {
			at := c.started
			if st := c.items[workItem{class: class, segment: seg}]; st != nil && st.checked.After(at) {
				at = st.checked
			}
			if at.Before(oldest) {
				oldest = at
			}
		}
	}
	return now.Sub(oldest), true
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
