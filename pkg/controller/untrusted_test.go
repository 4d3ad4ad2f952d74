package controller

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec/volspectest"
	"google.golang.org/grpc/codes"
)

// hostile plants, next to good volumes, one volume of each kind of hostile
// pool entry and returns the volume IDs by kind.
func hostile(t *testing.T, f *fixture, p *pool.Pool) map[string]string {
	t.Helper()
	c := ctx(t)
	ids := map[string]string{}
	host := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(host, []byte("host data"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"good", "symlinked image", "FIFO record", "directory record", "oversized record"} {
		resp, err := f.s.CreateVolume(c, createReq(kind, 16*mib, volspectest.Block(snw)))
		if err != nil {
			t.Fatal(err)
		}
		id, _ := pool.ParseVolumeID(resp.Volume.VolumeId)
		ids[kind] = id.String()
		img := p.ImagePath(id)
		rec := filepath.Join(p.Path, "volumes", id.Hash+".json")
		switch kind {
		case "symlinked image":
			os.Remove(img)
			err = os.Symlink(host, img)
		case "FIFO record":
			os.Remove(rec)
			err = syscall.Mkfifo(rec, 0o600)
		case "directory record":
			os.Remove(rec)
			err = os.Mkdir(rec, 0o700)
		case "oversized record":
			err = os.Truncate(rec, 1<<30)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// TestHostilePoolEntries: each hostile entry is reported on its own, the
// rest of the pool is served, and nothing is followed or hangs.
func TestHostilePoolEntries(t *testing.T) {
	f := newFixture(t, map[string]string{"a": "z1"})
	f.addNode(t, "a", "n1", 0)
	c := ctx(t)
	ids := hostile(t, f, f.pools["a"])

	list, err := f.s.ListVolumes(c, &csi.ListVolumesRequest{})
	if err != nil || len(list.Entries) != len(ids) {
		t.Fatalf("ListVolumes = %v, %v; want %d entries", list, err, len(ids))
	}
	health, err := f.s.ControllerListVolumeHealth(c, &csi.ControllerListVolumeHealthRequest{})
	if err != nil || len(health.Entries) != len(ids) {
		t.Fatalf("ControllerListVolumeHealth = %v, %v; want %d entries", health, err, len(ids))
	}
	want := map[string]string{
		ids["good"]:             "",
		ids["symlinked image"]:  reasonImageUntrusted,
		ids["FIFO record"]:      reasonRecordCorrupt,
		ids["directory record"]: reasonRecordCorrupt,
		ids["oversized record"]: reasonRecordCorrupt,
	}
	for _, h := range health.Entries {
		reason := ""
		if len(h.HealthStatuses) > 0 {
			reason = h.HealthStatuses[0].Reason
		}
		if reason != want[h.VolumeId] {
			t.Errorf("health of %s: reason %q (%v), want %q", h.VolumeId, reason, h.HealthStatuses, want[h.VolumeId])
		}
	}
	if _, err := f.s.GetCapacity(c, &csi.GetCapacityRequest{}); err != nil {
		t.Fatalf("GetCapacity: %v", err)
	}
	// Publishing a volume whose record is a FIFO answers at once and
	// releases the volume lock.
	cap := volspectest.Block(snw)
	for i := 0; i < 2; i++ {
		_, err = f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: ids["FIFO record"], NodeId: "n1", VolumeCapability: cap})
		wantCode(t, err, codes.Internal)
	}
	if _, err := f.s.ControllerPublishVolume(c, &csi.ControllerPublishVolumeRequest{VolumeId: ids["good"], NodeId: "n1", VolumeCapability: cap}); err != nil {
		t.Fatalf("publish the good volume: %v", err)
	}
	_, err = f.s.ControllerExpandVolume(c, &csi.ControllerExpandVolumeRequest{VolumeId: ids["symlinked image"], CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mib}})
	wantCode(t, err, codes.Internal)
}
