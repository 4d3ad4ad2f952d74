package controller

import (
	"os"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSweepCountsAbnormalVolumes: the sweep sets loopvol_volumes_abnormal
// per pool and reason from what health finds: zero for a healthy pool,
// the count of a truncated and a missing image, and back to zero once the
// broken volumes are deleted.
func TestSweepCountsAbnormalVolumes(t *testing.T) {
	f := newFixture(t, map[string]string{"sick": "z1", "well": "z1"})
	c := ctx(t)
	var ids []string
	for _, name := range []string{"pvc-truncated", "pvc-missing", "pvc-fine"} {
		req := createReq(name, 16*mib)
		req.Parameters = map[string]string{ParameterPool: "sick"}
		vol, err := f.s.CreateVolume(c, req)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, vol.Volume.VolumeId)
	}
	wellReq := createReq("pvc-well", 16*mib)
	wellReq.Parameters = map[string]string{ParameterPool: "well"}
	if _, err := f.s.CreateVolume(c, wellReq); err != nil {
		t.Fatal(err)
	}
	p, truncated, _ := f.s.lookup(ids[0])
	_, missing, _ := f.s.lookup(ids[1])
	if err := os.Truncate(p.ImagePath(truncated), 4*mib); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p.ImagePath(missing)); err != nil {
		t.Fatal(err)
	}
	f.s.Sweep(c)
	for _, tc := range []struct {
		pool, reason string
		want         float64
	}{
		{"sick", reasonImageTruncated, 1}, {"sick", reasonImageMissing, 1}, {"sick", reasonRecordCorrupt, 0},
		{"well", reasonImageTruncated, 0}, {"well", reasonModifyPending, 0},
	} {
		if got := testutil.ToFloat64(abnormalVolumes.WithLabelValues(tc.pool, tc.reason)); got != tc.want {
			t.Errorf("loopvol_volumes_abnormal{pool=%q,reason=%q} = %v, want %v", tc.pool, tc.reason, got, tc.want)
		}
	}
	for _, id := range ids[:2] {
		if _, err := f.s.DeleteVolume(c, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("DeleteVolume of a broken volume: %v", err)
		}
	}
	f.s.Sweep(c)
	if got := testutil.ToFloat64(abnormalVolumes.WithLabelValues("sick", reasonImageMissing)); got != 0 {
		t.Errorf("after the broken volumes were deleted: %v missing images, want 0", got)
	}
}
