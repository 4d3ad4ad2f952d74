package poolmetrics

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func gather(t *testing.T, c prometheus.Collector, want string, names ...string) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
}

const (
	availableHelp = `# HELP loopvol_pool_available_bytes Bytes new volumes may still get in the pool: free space minus space promised to sparse images, minus the copy-on-write reserve, minus the reserve.
# TYPE loopvol_pool_available_bytes gauge
`
	cowReserveHelp = `# HELP loopvol_pool_cow_reserve_bytes Bytes kept out of the pool's available space for copy-on-write: the blocks volume images share with reflinked snapshots and clones, which a volume needs again when it writes over them.
# TYPE loopvol_pool_cow_reserve_bytes gauge
`
	orphanBytesHelp = `# HELP loopvol_pool_orphan_bytes Size of the images in the pool without a volume record; this space is not available to new volumes.
# TYPE loopvol_pool_orphan_bytes gauge
`
	orphanImagesHelp = `# HELP loopvol_pool_orphan_images Images in the pool without a volume record: left by a create that died (reclaimed after a grace if they hold no data) or a volume whose record was lost (kept).
# TYPE loopvol_pool_orphan_images gauge
`
	freeHelp = `# HELP loopvol_pool_free_bytes Free space of the filesystem that holds the pool, for an unprivileged writer: what the volumes' next writes can really get, whatever was promised.
# TYPE loopvol_pool_free_bytes gauge
`
	promisedHelp = `# HELP loopvol_pool_promised_bytes Bytes promised to the pool's sparse images and not yet allocated: what their volumes may still write.
# TYPE loopvol_pool_promised_bytes gauge
`
	sizeHelp = `# HELP loopvol_pool_size_bytes Size of the filesystem that holds the pool.
# TYPE loopvol_pool_size_bytes gauge
`
	usableHelp = `# HELP loopvol_pool_usable 1 while the pool is usable (its marker is there and a file can be created in it), 0 while it is full, read-only or broken: its volumes cannot be created, snapshotted or attached then, and the other pools are served all the same.
# TYPE loopvol_pool_usable gauge
`
)

func TestCollector(t *testing.T) {
	c := Collector{Usage: func() []Usage {
		return []Usage{
			{Pool: "a", Zone: "z1", SizeBytes: 1000, AvailableBytes: 400, FreeBytes: 700, PromisedBytes: 200, OrphanImages: 2, OrphanBytes: 300, CowReserveBytes: 100, Usable: true},
			{Pool: "b", Zone: "z2", SizeBytes: 50, AvailableBytes: 50},
			{Pool: "c", Zone: "z2", Unmeasured: true},
		}
	}}
	gather(t, c, availableHelp+`loopvol_pool_available_bytes{pool="a",zone="z1"} 400
loopvol_pool_available_bytes{pool="b",zone="z2"} 50
`+cowReserveHelp+`loopvol_pool_cow_reserve_bytes{pool="a",zone="z1"} 100
loopvol_pool_cow_reserve_bytes{pool="b",zone="z2"} 0
`+freeHelp+`loopvol_pool_free_bytes{pool="a",zone="z1"} 700
loopvol_pool_free_bytes{pool="b",zone="z2"} 0
`+orphanBytesHelp+`loopvol_pool_orphan_bytes{pool="a",zone="z1"} 300
loopvol_pool_orphan_bytes{pool="b",zone="z2"} 0
`+orphanImagesHelp+`loopvol_pool_orphan_images{pool="a",zone="z1"} 2
loopvol_pool_orphan_images{pool="b",zone="z2"} 0
`+promisedHelp+`loopvol_pool_promised_bytes{pool="a",zone="z1"} 200
loopvol_pool_promised_bytes{pool="b",zone="z2"} 0
`+sizeHelp+`loopvol_pool_size_bytes{pool="a",zone="z1"} 1000
loopvol_pool_size_bytes{pool="b",zone="z2"} 50
`+usableHelp+`loopvol_pool_usable{pool="a",zone="z1"} 1
loopvol_pool_usable{pool="b",zone="z2"} 0
loopvol_pool_usable{pool="c",zone="z2"} 0
`)
}

// TestMeasureCountsOrphans: real pools measured at each scrape; an image
// whose record is removed shows as an orphan of its pool with its size from
// the next scrape on, and goes when the image does.
func TestMeasureCountsOrphans(t *testing.T) {
	root := t.TempDir()
	var pools []*pool.Pool
	for _, name := range []string{"a", "b"} {
		p, err := pool.Open(pool.Options{Name: name, Zone: "z-" + name, Path: filepath.Join(root, name)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		pools = append(pools, p)
	}
	c := Collector{Usage: func() []Usage { return Measure(pools) }}
	orphans := func(images, bytes int) string {
		return fmt.Sprintf(orphanBytesHelp+`loopvol_pool_orphan_bytes{pool="a",zone="z-a"} %d
loopvol_pool_orphan_bytes{pool="b",zone="z-b"} 0
`+orphanImagesHelp+`loopvol_pool_orphan_images{pool="a",zone="z-a"} %d
loopvol_pool_orphan_images{pool="b",zone="z-b"} 0
`, bytes, images)
	}
	names := []string{"loopvol_pool_orphan_images", "loopvol_pool_orphan_bytes"}
	var hashes []string
	for i, size := range []int64{1 << 20, 3 << 20} {
		v, err := pools[0].CreateVolume(t.Context(), pool.VolumeSpec{Name: fmt.Sprintf("v-%d", i), SizeBytes: size, AccessType: pool.AccessBlock, AccessModes: []string{"SINGLE_NODE_WRITER"}})
		if err != nil {
			t.Fatal(err)
		}
		id, err := pool.ParseVolumeID(v.ID)
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, id.Hash)
	}
	gather(t, c, orphans(0, 0), names...)
	vols := filepath.Join(root, "a", "volumes")
	for _, h := range hashes {
		if err := os.Remove(filepath.Join(vols, h+".json")); err != nil {
			t.Fatal(err)
		}
	}
	gather(t, c, orphans(2, 4<<20), names...)
	if err := os.Remove(filepath.Join(vols, hashes[1]+".img")); err != nil {
		t.Fatal(err)
	}
	gather(t, c, orphans(1, 1<<20), names...)
}
