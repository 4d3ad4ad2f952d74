package poolmetrics

import (
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/prometheus/client_golang/prometheus"
)

// Usage is one pool's space at scrape time.
type Usage struct {
	Pool, Zone     string
	SizeBytes      int64
	AvailableBytes int64
	// FreeBytes is what the filesystem still has for an unprivileged
	// writer, and PromisedBytes what sparse images may still take of it
	// (pool.Usage): a pool can have little available and much free (it
	// promised much), or, overcommitted, the other way round.
	FreeBytes     int64
	PromisedBytes int64
	// OrphanImages and OrphanBytes are the images without a record and
	// their size: kept during the sweep's grace or because they hold data
	// (pool.Usage).
	OrphanImages int
	OrphanBytes  int64
	// CowReserveBytes are kept for the copy-on-write of blocks volumes
	// share with snapshots and clones (pool.Usage).
	CowReserveBytes int64
	// Usable says the pool passed its check (pool.Check: marker, and a
	// file can be created in it); a full or broken pool cannot take new
	// volumes, snapshots or attachments' locks.
	Usable bool
	// Unmeasured says the pool's space could not be read: only
	// loopvol_pool_usable is reported for it.
	Unmeasured bool
}

var (
	poolSizeDesc = prometheus.NewDesc("loopvol_pool_size_bytes",
		"Size of the filesystem that holds the pool.", []string{"pool", "zone"}, nil)
	poolAvailableDesc = prometheus.NewDesc("loopvol_pool_available_bytes",
		"Bytes new volumes may still get in the pool: free space minus space promised to sparse images, minus the copy-on-write reserve, minus the reserve.", []string{"pool", "zone"}, nil)
	poolFreeDesc = prometheus.NewDesc("loopvol_pool_free_bytes",
		"Free space of the filesystem that holds the pool, for an unprivileged writer: what the volumes' next writes can really get, whatever was promised.", []string{"pool", "zone"}, nil)
	poolPromisedDesc = prometheus.NewDesc("loopvol_pool_promised_bytes",
		"Bytes promised to the pool's sparse images and not yet allocated: what their volumes may still write.", []string{"pool", "zone"}, nil)
	poolCowReserveDesc = prometheus.NewDesc("loopvol_pool_cow_reserve_bytes",
		"Bytes kept out of the pool's available space for copy-on-write: the blocks volume images share with reflinked snapshots and clones, which a volume needs again when it writes over them.", []string{"pool", "zone"}, nil)
	poolUsableDesc = prometheus.NewDesc("loopvol_pool_usable",
		"1 while the pool is usable (its marker is there and a file can be created in it), 0 while it is full, read-only or broken: its volumes cannot be created, snapshotted or attached then, and the other pools are served all the same.", []string{"pool", "zone"}, nil)
	poolOrphanImagesDesc = prometheus.NewDesc("loopvol_pool_orphan_images",
		"Images in the pool without a volume record: left by a create that died (reclaimed after a grace if they hold no data) or a volume whose record was lost (kept).", []string{"pool", "zone"}, nil)
	poolOrphanBytesDesc = prometheus.NewDesc("loopvol_pool_orphan_bytes",
		"Size of the images in the pool without a volume record; this space is not available to new volumes.", []string{"pool", "zone"}, nil)
)

// Collector reports the pool gauges, computed when Prometheus scrapes, so
// the figures are never stale and nothing polls in between.
type Collector struct {
	// Usage returns every pool's figures (Measure); pools it cannot
	// measure are left out.
	Usage func() []Usage
}

// Describe implements prometheus.Collector.
func (c Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolSizeDesc
	ch <- poolAvailableDesc
	ch <- poolFreeDesc
	ch <- poolPromisedDesc
	ch <- poolCowReserveDesc
	ch <- poolOrphanImagesDesc
	ch <- poolOrphanBytesDesc
	ch <- poolUsableDesc
}

// Collect implements prometheus.Collector.
func (c Collector) Collect(ch chan<- prometheus.Metric) {
	for _, u := range c.Usage() {
		usable := 0.0
		if u.Usable {
			usable = 1
		}
		ch <- prometheus.MustNewConstMetric(poolUsableDesc, prometheus.GaugeValue, usable, u.Pool, u.Zone)
		if u.Unmeasured {
			continue
		}
		ch <- prometheus.MustNewConstMetric(poolSizeDesc, prometheus.GaugeValue, float64(u.SizeBytes), u.Pool, u.Zone)
		ch <- prometheus.MustNewConstMetric(poolAvailableDesc, prometheus.GaugeValue, float64(u.AvailableBytes), u.Pool, u.Zone)
		ch <- prometheus.MustNewConstMetric(poolFreeDesc, prometheus.GaugeValue, float64(u.FreeBytes), u.Pool, u.Zone)
		ch <- prometheus.MustNewConstMetric(poolPromisedDesc, prometheus.GaugeValue, float64(u.PromisedBytes), u.Pool, u.Zone)
		ch <- prometheus.MustNewConstMetric(poolCowReserveDesc, prometheus.GaugeValue, float64(u.CowReserveBytes), u.Pool, u.Zone)
		ch <- prometheus.MustNewConstMetric(poolOrphanImagesDesc, prometheus.GaugeValue, float64(u.OrphanImages), u.Pool, u.Zone)
		ch <- prometheus.MustNewConstMetric(poolOrphanBytesDesc, prometheus.GaugeValue, float64(u.OrphanBytes), u.Pool, u.Zone)
	}
}

// Measure checks and measures the pools now, for Collector.Usage. A pool
// that cannot be measured is reported unmeasured (its health check and the
// driver's log say why).
func Measure(pools []*pool.Pool) []Usage {
	var out []Usage
	for _, p := range pools {
		usable := p.Check() == nil
		u, err := p.Usage()
		if err != nil {
			out = append(out, Usage{Pool: p.Name, Zone: p.Zone, Usable: usable, Unmeasured: true})
			continue
		}
		out = append(out, Usage{Pool: p.Name, Zone: p.Zone, SizeBytes: u.TotalBytes, AvailableBytes: u.AvailableBytes,
			FreeBytes: u.FreeBytes, PromisedBytes: u.PromisedBytes,
			OrphanImages: u.OrphanImages, OrphanBytes: u.OrphanBytes, CowReserveBytes: u.CowReserveBytes, Usable: usable})
	}
	return out
}
