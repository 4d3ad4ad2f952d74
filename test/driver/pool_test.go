package driver

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// controllers starts n controller processes of the real driver on one pool
// directory, as two controller replicas sharing an NFS export would run.
func controllers(t *testing.T, n int, args ...string) ([]csi.ControllerClient, []*driverproc.Driver) {
	t.Helper()
	var clients []csi.ControllerClient
	var procs []*driverproc.Driver
	for i := 0; i < n; i++ {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("ctrl-%d", i))
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		d := driverproc.Start(t, dir, append([]string{"--mode=controller"}, args...)...)
		procs = append(procs, d)
		clients = append(clients, csi.NewControllerClient(d.Conn))
	}
	return clients, procs
}

func volumeHash(id string) string { return id[strings.LastIndex(id, ".")+1:] }

// TestHostilePoolFiles: a pool holding a symlinked image, a FIFO, a
// directory and a 1 GiB file in place of records is served by the real
// driver: each bad volume is reported on its own, the good one as usual,
// nothing is followed, nothing hangs.
func TestHostilePoolFiles(t *testing.T) {
	driverproc.RequireRoot(t)
	poolDir := filepath.Join(t.TempDir(), "pool")
	host := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(host, []byte("host data"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctrls, _ := controllers(t, 1, "--pool=p="+poolDir)
	ctrl := ctrls[0]
	cap := blockCap(snw)
	ids := map[string]string{}
	for _, kind := range []string{"good", "symlinked-image", "fifo-record", "directory-record", "oversized-record"} {
		resp, err := ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: kind, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 * mib}, VolumeCapabilities: []*csi.VolumeCapability{cap}})
		if err != nil {
			t.Fatal(err)
		}
		ids[kind] = resp.Volume.VolumeId
		base := filepath.Join(poolDir, "volumes", volumeHash(resp.Volume.VolumeId))
		switch kind {
		case "symlinked-image":
			os.Remove(base + ".img")
			err = os.Symlink(host, base+".img")
		case "fifo-record":
			os.Remove(base + ".json")
			err = syscall.Mkfifo(base+".json", 0o600)
		case "directory-record":
			os.Remove(base + ".json")
			err = os.Mkdir(base+".json", 0o700)
		case "oversized-record":
			err = os.Truncate(base+".json", 1<<30)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	list, err := ctrl.ListVolumes(bg(), &csi.ListVolumesRequest{})
	if err != nil || len(list.Entries) != len(ids) {
		t.Fatalf("ListVolumes = %v, %v; want %d entries", list, err, len(ids))
	}
	health, err := ctrl.ControllerListVolumeHealth(bg(), &csi.ControllerListVolumeHealthRequest{})
	if err != nil || len(health.Entries) != len(ids) {
		t.Fatalf("ControllerListVolumeHealth = %v, %v", health, err)
	}
	want := map[string]string{ids["good"]: "", ids["symlinked-image"]: "ImageUntrusted", ids["fifo-record"]: "RecordCorrupt", ids["directory-record"]: "RecordCorrupt", ids["oversized-record"]: "RecordCorrupt"}
	for _, h := range health.Entries {
		reason := ""
		if len(h.HealthStatuses) > 0 {
			reason = h.HealthStatuses[0].Reason
			t.Logf("%s: %s: %s", h.VolumeId, reason, h.HealthStatuses[0].Message)
		}
		if reason != want[h.VolumeId] {
			t.Errorf("health of %s = %q, want %q", h.VolumeId, reason, want[h.VolumeId])
		}
	}
	for kind, id := range ids {
		_, err := ctrl.ControllerGetVolumeHealth(bg(), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			t.Errorf("ControllerGetVolumeHealth %s: %v", kind, err)
		}
	}
	if _, err := ctrl.GetCapacity(bg(), &csi.GetCapacityRequest{}); err != nil {
		t.Fatalf("GetCapacity: %v", err)
	}
	_, err = ctrl.ControllerExpandVolume(bg(), &csi.ControllerExpandVolumeRequest{VolumeId: ids["symlinked-image"], CapacityRange: &csi.CapacityRange{RequiredBytes: 16 * mib}})
	if status.Code(err) == codes.OK {
		t.Fatal("expanded a volume whose image is a symlink")
	}
	if data, err := os.ReadFile(host); err != nil || string(data) != "host data" {
		t.Fatalf("the host file behind the symlink changed: %q, %v", data, err)
	}
	if _, err := ctrl.DeleteVolume(bg(), &csi.DeleteVolumeRequest{VolumeId: ids["good"]}); err != nil {
		t.Fatalf("DeleteVolume of the good volume: %v", err)
	}
}

// TestTwoControllerProcesses: two controller processes on one pool create
// the same names at once. Every name gets one volume and one image; an image
// is never replaced after either process returned it.
func TestTwoControllerProcesses(t *testing.T) {
	driverproc.RequireRoot(t)
	poolDir := filepath.Join(t.TempDir(), "pool")
	ctrls, _ := controllers(t, 2, "--pool=p="+poolDir)
	const names = 16
	cap := blockCap(snw)
	var mu sync.Mutex
	inode := map[string]uint64{}
	var wg sync.WaitGroup
	for _, ctrl := range ctrls {
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for round := 0; round < 3; round++ {
					for n := 0; n < names; n++ {
						name := fmt.Sprintf("pvc-%d", n)
						resp, err := ctrl.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 4 * mib}, VolumeCapabilities: []*csi.VolumeCapability{cap}})
						if status.Code(err) == codes.Aborted {
							continue
						}
						if err != nil {
							t.Errorf("CreateVolume %s: %v", name, err)
							return
						}
						var st unix.Stat_t
						if err := unix.Stat(filepath.Join(poolDir, "volumes", volumeHash(resp.Volume.VolumeId)+".img"), &st); err != nil {
							t.Errorf("image of %s: %v", name, err)
							return
						}
						mu.Lock()
						if prev, ok := inode[resp.Volume.VolumeId]; ok && prev != st.Ino {
							t.Errorf("%s: the image returned before (inode %d) was replaced (inode %d)", name, prev, st.Ino)
						}
						inode[resp.Volume.VolumeId] = st.Ino
						mu.Unlock()
					}
				}
			}()
		}
	}
	wg.Wait()
	images, _ := filepath.Glob(filepath.Join(poolDir, "volumes", "*.img"))
	records, _ := filepath.Glob(filepath.Join(poolDir, "volumes", "*.json"))
	if len(inode) != names || len(images) != names || len(records) != names {
		t.Fatalf("%d volumes returned, %d images, %d records; want %d", len(inode), len(images), len(records), names)
	}
	for id, ino := range inode {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(poolDir, "volumes", volumeHash(id)+".img"), &st); err != nil || st.Ino != ino {
			t.Errorf("%s: image inode %d now (%v), %d when returned", id, st.Ino, err, ino)
		}
	}
}

// TestTwoControllerProcessesKeepTheReserve: parallel creates of different
// names on two controller processes, more than the pool can hold, on a
// tmpfs (its free space is exact): free space never falls below the
// reserve.
func TestTwoControllerProcessesKeepTheReserve(t *testing.T) {
	driverproc.RequireRoot(t)
	dir := t.TempDir()
	poolDir := looptest.Tmpfs(t, "96m")
	const reserve = 32 * mib
	cfg := filepath.Join(dir, "pools.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("pools:\n- name: p\n  zone: z\n  path: %s\n  reserveBytes: %d\n", poolDir, reserve)), 0o600)
	ctrls, procs := controllers(t, 2, "--config="+cfg)
	// Registered after the umount: the processes stop first.
	t.Cleanup(func() {
		for _, p := range procs {
			p.Stop()
		}
	})
	var wg sync.WaitGroup
	var mu sync.Mutex
	made, refused := 0, 0
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := ctrls[i%2].CreateVolume(bg(), &csi.CreateVolumeRequest{Name: fmt.Sprintf("v-%d", i), CapacityRange: &csi.CapacityRange{RequiredBytes: 4 * mib}, VolumeCapabilities: []*csi.VolumeCapability{blockCap(snw)}})
			mu.Lock()
			defer mu.Unlock()
			switch status.Code(err) {
			case codes.OK:
				made++
			case codes.ResourceExhausted:
				refused++
			default:
				t.Errorf("CreateVolume v-%d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	var st unix.Statfs_t
	if err := unix.Statfs(poolDir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	t.Logf("%d created, %d refused, %d bytes free, reserve %d", made, refused, free, reserve)
	if free < reserve {
		t.Fatalf("free space %d fell below the reserve %d with %d volumes", free, reserve, made)
	}
	if made == 0 || refused == 0 {
		t.Fatalf("%d created, %d refused: want both", made, refused)
	}
}

// TestLeftoversSweptAtRestart: a controller killed (SIGKILL) in the middle
// of creates leaves temporaries and orphan images; the restarted process
// removes every temporary before it serves, keeps a young orphan (a retry
// finishes it), reclaims an old one that holds no data and keeps one that
// holds data.
func TestLeftoversSweptAtRestart(t *testing.T) {
	driverproc.RequireRoot(t)
	dir := t.TempDir()
	poolDir := filepath.Join(dir, "pool")
	vols := filepath.Join(poolDir, "volumes")
	ctrlDir := filepath.Join(dir, "ctrl")
	os.MkdirAll(ctrlDir, 0o750)
	var cur *driverproc.Driver
	start := func() csi.ControllerClient {
		if cur != nil {
			cur.Stop()
		}
		cur = driverproc.Start(t, ctrlDir, "--mode=controller", "--pool=p="+poolDir)
		return csi.NewControllerClient(cur.Conn)
	}
	create := func(c csi.ControllerClient, name string) (string, error) {
		resp, err := c.CreateVolume(bg(), &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 4 * mib}, VolumeCapabilities: []*csi.VolumeCapability{blockCap(snw)}})
		if err != nil {
			return "", err
		}
		return resp.Volume.VolumeId, nil
	}

	// Creates in flight when the process is killed.
	ctrl := start()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if _, err := create(ctrl, fmt.Sprintf("storm-%d-%d", g, i)); err != nil {
					return
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // let the storm run; not an assertion
	cur.Kill()
	cur = nil
	wg.Wait()

	// What a writer killed mid-write leaves, in case the kill landed
	// elsewhere: a temporary record, and orphan images (image complete,
	// record not written): one old and never written, one old that holds
	// data, one young.
	ctrl = start()
	orphan := func(name string, age time.Duration, data bool) string {
		id, err := create(ctrl, name)
		if err != nil {
			t.Fatal(err)
		}
		img := filepath.Join(vols, volumeHash(id)+".img")
		os.Remove(filepath.Join(vols, volumeHash(id)+".json"))
		if data {
			f, err := os.OpenFile(img, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt([]byte("filesystem"), 4096)
			f.Close()
		}
		mtime := time.Now().Add(-age)
		os.Chtimes(img, mtime, mtime)
		return img
	}
	oldEmpty := orphan("orphan-old-empty", time.Hour, false)
	oldData := orphan("orphan-old-data", time.Hour, true)
	young := orphan("orphan-young", 0, false)
	temp := filepath.Join(vols, "."+pool.DeriveVolumeID("p", "storm-0-0").Hash+".json.tmp-killed")
	if err := os.WriteFile(temp, []byte(`{"id": "p.`), 0o600); err != nil {
		t.Fatal(err)
	}
	cur.Kill()
	cur = nil

	ctrl = start()
	if left, _ := filepath.Glob(filepath.Join(vols, ".*.tmp-*")); len(left) != 0 {
		t.Errorf("temporaries left after the restart: %v", left)
	}
	if _, err := os.Stat(oldEmpty); !os.IsNotExist(err) {
		t.Errorf("the old orphan that holds no data was not reclaimed: %v", err)
	}
	for _, img := range []string{oldData, young} {
		if _, err := os.Stat(img); err != nil {
			t.Errorf("orphan %s was removed: %v", filepath.Base(img), err)
		}
	}
	if !strings.Contains(cur.Log(), "Kept an orphan image that holds data") {
		t.Errorf("the orphan with data was not reported in the log")
	}
	// A retry of the young orphan's create finishes it.
	if _, err := create(ctrl, "orphan-young"); err != nil {
		t.Fatalf("retry of the young orphan's create: %v", err)
	}
	if _, err := os.Stat(strings.TrimSuffix(young, ".img") + ".json"); err != nil {
		t.Fatalf("the retried create wrote no record: %v", err)
	}
}
