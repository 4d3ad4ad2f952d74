package loop_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
)

// queueAttr reads /sys/block/loopN/<attr>.
func queueAttr(t *testing.T, dev, attr string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), attr))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func setQueueAttr(t *testing.T, dev, attr, value string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join("/sys/block", filepath.Base(dev), "queue", attr), []byte(value), 0); err != nil {
		t.Fatal(err)
	}
}

// checkTuned reads the device's settings back from sysfs; discard says
// whether it must pass discards (a thin volume's) or refuse them.
func checkTuned(t *testing.T, dev, blockSize string, discard bool) {
	t.Helper()
	if got := queueAttr(t, dev, "queue/scheduler"); !strings.Contains(got, "[none]") {
		t.Errorf("%s scheduler = %q, want [none]", dev, got)
	}
	if got := queueAttr(t, dev, "queue/wbt_lat_usec"); got != "0" {
		t.Errorf("%s wbt_lat_usec = %s, want 0", dev, got)
	}
	if got := queueAttr(t, dev, "queue/logical_block_size"); got != blockSize {
		t.Errorf("%s logical_block_size = %s, want %s", dev, got, blockSize)
	}
	if got := queueAttr(t, dev, "loop/dio"); got != "1" {
		t.Errorf("%s dio = %s, want 1 (direct I/O)", dev, got)
	}
	if got := queueAttr(t, dev, "queue/discard_max_bytes"); (got != "0") != discard {
		t.Errorf("%s discard_max_bytes = %s, want discards passed: %v", dev, got, discard)
	}
}

func TestTune(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "vol.img", 64*mib)
	d := loop.New()
	dev, err := d.Attach(context.Background(), image, false)
	if err != nil {
		t.Fatal(err)
	}
	// Before the first write the throttle reads 0 but is not set up yet:
	// Tune must set it anyway, so that the first write does not enable it.
	if err := d.Tune(dev, true); err != nil {
		t.Fatalf("Tune: %v", err)
	}
	writeBlock(t, dev, 'a')
	checkTuned(t, dev, strconv.Itoa(loop.BlockSize), true)
	if err := d.Tune(dev, true); err != nil {
		t.Fatalf("Tune again: %v", err)
	}
	checkTuned(t, dev, strconv.Itoa(loop.BlockSize), true)

	// Settings changed behind its back (a udev rule, an admin) are put back.
	setQueueAttr(t, dev, "scheduler", "mq-deadline")
	setQueueAttr(t, dev, "wbt_lat_usec", "2000")
	if err := d.Tune(dev, true); err != nil {
		t.Fatalf("re-Tune: %v", err)
	}
	checkTuned(t, dev, strconv.Itoa(loop.BlockSize), true)

	if err := d.Detach(dev); err != nil {
		t.Fatal(err)
	}
	if err := d.Tune(dev, true); !errors.Is(err, loop.ErrNotAttached) {
		t.Errorf("Tune of a detached device = %v, want ErrNotAttached", err)
	}
	if err := d.Tune("/dev/sda", true); !errors.Is(err, loop.ErrInvalidDevice) {
		t.Errorf("Tune(/dev/sda) = %v, want ErrInvalidDevice", err)
	}
}

// TestTuneDiscards: a thick volume's device (Tune with discard false)
// refuses discards, so its fallocated image keeps every block; Detach then
// removes the device, so that the limit, which the kernel keeps on the
// number, does not pass to the next user; a thin volume's device punches
// a hole in the image for each discard.
func TestTuneDiscards(t *testing.T) {
	looptest.RequireRoot(t)
	if _, err := exec.LookPath("blkdiscard"); err != nil {
		t.Skip("blkdiscard is not installed")
	}
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "vol.img", 64*mib)
	d := loop.New()
	attach := func(discard bool) string {
		t.Helper()
		dev, err := d.Attach(context.Background(), image, false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Detach(dev) })
		if err := d.Tune(dev, discard); err != nil {
			t.Fatalf("Tune(%s, %v): %v", dev, discard, err)
		}
		checkTuned(t, dev, strconv.Itoa(loop.BlockSize), discard)
		return dev
	}
	discard := func(dev string) error {
		t.Helper()
		out, err := exec.Command("blkdiscard", "--offset", "0", "--length", strconv.Itoa(8*mib), dev).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}

	dev := attach(false)
	allocated := looptest.AllocatedBytes(t, image)
	if err := discard(dev); err == nil {
		t.Errorf("blkdiscard on a thick volume's device succeeded, want it refused")
	}
	if got := looptest.AllocatedBytes(t, image); got != allocated {
		t.Errorf("image allocates %d bytes after the refused discard, want %d", got, allocated)
	}
	if err := d.Detach(dev); err != nil {
		t.Fatal(err)
	}
	// Removed, or (another test's attach took the number at once) made
	// anew without the limit.
	name := filepath.Base(dev)
	if max, err := os.ReadFile(filepath.Join("/sys/block", name, "queue", "discard_max_bytes")); err == nil {
		hw, _ := os.ReadFile(filepath.Join("/sys/block", name, "queue", "discard_max_hw_bytes"))
		if strings.TrimSpace(string(max)) == "0" && strings.TrimSpace(string(hw)) != "0" {
			t.Errorf("%s still refuses discards after the detach (max %s, hw %s)", dev, max, hw)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}

	dev = attach(true)
	if err := discard(dev); err != nil {
		t.Fatalf("blkdiscard on a thin volume's device: %v", err)
	}
	if got := looptest.AllocatedBytes(t, image); got > allocated-8*mib {
		t.Errorf("image allocates %d bytes after discarding 8 MiB, want at most %d", got, allocated-8*mib)
	}
	if err := d.Detach(dev); err != nil {
		t.Fatal(err)
	}
}

// TestTuneOldDevice: a device attached the old way, with 512-byte sectors
// (losetup's default on older kernels, or a device attached by hand), is
// still found, and Tune tunes its queue without touching its block size,
// which cannot change under the filesystem on it.
func TestTuneOldDevice(t *testing.T) {
	looptest.RequireRoot(t)
	if _, err := exec.LookPath("losetup"); err != nil {
		t.Skip("losetup is not installed")
	}
	dir := looptest.DirectIODir(t)
	image := newImage(t, dir, "old.img", 64*mib)
	out, err := exec.Command("losetup", "--direct-io=on", "--sector-size", "512", "--find", "--show", image).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	d := loop.New()
	got, ok, err := d.Find(image)
	if err != nil || !ok || got != dev {
		t.Fatalf("Find = %q, %v, %v; want %s", got, ok, err, dev)
	}
	if err := d.Tune(dev, true); err != nil {
		t.Fatalf("Tune: %v", err)
	}
	writeBlock(t, dev, 'o')
	checkTuned(t, dev, "512", true)
	if got := readImageByte(t, image); got != 'o' {
		t.Errorf("image byte = %q, want 'o'", got)
	}
}

// TestAttachBlockSizeOfFilesystem: an image that already holds a
// filesystem made with blocks or sectors smaller than BlockSize is attached
// with the size it was made for (else it would not mount), with direct I/O;
// every other image with BlockSize.
func TestAttachBlockSizeOfFilesystem(t *testing.T) {
	looptest.RequireRoot(t)
	dir := looptest.DirectIODir(t)
	for _, tc := range []struct {
		name string
		mkfs []string // run on the image file; nil: blank
		want int
	}{
		{name: "blank", want: loop.BlockSize},
		{name: "ext4 1k blocks", mkfs: []string{"mkfs.ext4", "-q", "-F", "-b", "1024"}, want: 1024},
		{name: "ext4 2k blocks", mkfs: []string{"mkfs.ext4", "-q", "-F", "-b", "2048"}, want: 2048},
		{name: "ext4 4k blocks", mkfs: []string{"mkfs.ext4", "-q", "-F", "-b", "4096"}, want: loop.BlockSize},
		{name: "xfs 512 sectors", mkfs: []string{"mkfs.xfs", "-q", "-f", "-s", "size=512"}, want: 512},
		{name: "xfs 4k sectors", mkfs: []string{"mkfs.xfs", "-q", "-f", "-s", "size=4096"}, want: loop.BlockSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			image := newImage(t, dir, strings.ReplaceAll(tc.name, " ", "-")+".img", 320*mib)
			if tc.mkfs != nil {
				if _, err := exec.LookPath(tc.mkfs[0]); err != nil {
					t.Skipf("%s is not installed", tc.mkfs[0])
				}
				if out, err := exec.Command(tc.mkfs[0], append(tc.mkfs[1:], image)...).CombinedOutput(); err != nil {
					t.Fatalf("%v: %v: %s", tc.mkfs, err, out)
				}
			}
			d := loop.New()
			dev, err := d.Attach(context.Background(), image, false)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Detach(dev)
			if got := queueAttr(t, dev, "queue/logical_block_size"); got != strconv.Itoa(tc.want) {
				t.Errorf("logical_block_size = %s, want %d", got, tc.want)
			}
			if got := queueAttr(t, dev, "loop/dio"); got != "1" {
				t.Errorf("dio = %s, want 1", got)
			}
		})
	}
}
