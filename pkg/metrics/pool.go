package metrics

import "github.com/prometheus/client_golang/prometheus"

// PoolUsage is one pool's space at scrape time.
type PoolUsage struct {
	Pool, Zone     string
	SizeBytes      int64
	AvailableBytes int64
}

var (
	poolSizeDesc = prometheus.NewDesc("loopvol_pool_size_bytes",
		"Size of the filesystem that holds the pool.", []string{"pool", "zone"}, nil)
	poolAvailableDesc = prometheus.NewDesc("loopvol_pool_available_bytes",
		"Bytes new volumes may still get in the pool: free space minus space promised to sparse images minus the reserve.", []string{"pool", "zone"}, nil)
)

// PoolCollector reports pool gauges computed when Prometheus scrapes, so the
// figures are never stale and nothing polls in between.
type PoolCollector struct {
	// Usage returns every pool's figures; pools it cannot measure are left out.
	Usage func() []PoolUsage
}

// Describe implements prometheus.Collector.
func (c PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolSizeDesc
	ch <- poolAvailableDesc
}

// Collect implements prometheus.Collector.
func (c PoolCollector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.Usage() {
		ch <- prometheus.MustNewConstMetric(poolSizeDesc, prometheus.GaugeValue, float64(u.SizeBytes), u.Pool, u.Zone)
		ch <- prometheus.MustNewConstMetric(poolAvailableDesc, prometheus.GaugeValue, float64(u.AvailableBytes), u.Pool, u.Zone)
	}
}
