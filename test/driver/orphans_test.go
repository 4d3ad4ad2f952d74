package driver

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/test/internal/driverproc"
)

// TestOrphanMetrics: the driver's /metrics counts the images of a pool that
// have no record (a young orphan is kept during the sweep's grace) and their
// size, at each scrape.
func TestOrphanMetrics(t *testing.T) {
	driverproc.RequireRoot(t)
	dir := t.TempDir()
	poolDir := filepath.Join(dir, "pool")
	os.MkdirAll(poolDir, 0o750)
	const addr = "127.0.0.1:39809"
	d := driverproc.Start(t, dir, "--mode=controller", "--pool=p1="+poolDir, "--http-endpoint="+addr)
	ctrl := csi.NewControllerClient(d.Conn)
	scrape := func(want ...string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// Values as the text format writes them: 33554432 is 3.3554432e+07.
		for _, w := range want {
			if !strings.Contains(string(body), w+"\n") {
				t.Errorf("metrics lack %q", w)
			}
		}
	}
	scrape(`loopvol_pool_orphan_images{pool="p1",zone="default"} 0`, `loopvol_pool_orphan_bytes{pool="p1",zone="default"} 0`)
	var hashes []string
	for i, size := range []int64{8 * mib, 24 * mib} {
		resp, err := ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: fmt.Sprintf("o-%d", i), CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{blockCap(snw)}})
		if err != nil {
			t.Fatal(err)
		}
		hashes = append(hashes, volumeHash(resp.Volume.VolumeId))
	}
	// A create that died between the image and the record leaves this.
	for _, h := range hashes {
		if err := os.Remove(filepath.Join(poolDir, "volumes", h+".json")); err != nil {
			t.Fatal(err)
		}
	}
	scrape(`loopvol_pool_orphan_images{pool="p1",zone="default"} 2`, `loopvol_pool_orphan_bytes{pool="p1",zone="default"} `+strconv.FormatFloat(float64(32*mib), 'g', -1, 64))
}
