package loop

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The queue settings Tune gives a loop device, each kept because
// test/bench BenchmarkFio showed it helps (docs/benchmarks.md, "fio: the
// loop layer against the bare filesystem"; 2-core VM, pool on ext4 on a
// virtio disk, kernel 6.18). Settings measured and not kept, because the
// kernel's defaults for a loop device were as good or better:
//   - read_ahead_kb: the kernel gives a loop device 2560; 8192 (what the
//     pool's disk has) read a 1 GiB file in an ext4 volume at 1395 MiB/s
//     against 1626 with 2560 (buffered, 5 passes, spread ±40 %): no gain.
//   - rotational=0, nomerges=2, iostats=0: 4 KiB random at queue depth 32
//     within the noise of the default (58.6k against 57.1k IOPS in ext4).
//   - max_sectors_kb and nr_requests: already at the device's limits
//     (max_hw_sectors_kb 1280, the tag set's depth of 128); they cannot go
//     higher, and lower only queues more requests in the volume.
//   - the logical block size is not a queue setting: Attach sets it once
//     (BlockSize), and it cannot change under a filesystem.
//
// Queue attributes belong to the device number, not to the image: they
// stay after Detach. The scheduler and writeback settings are harmless to
// a later user of the device; the discard limit is not (see discardOff),
// so Detach removes a device that has it.
const (
	// schedNone: a loop device's requests go to the image file, whose own
	// disk has a scheduler; a second one only adds CPU. "none" is the
	// kernel's default for loop devices, set explicitly against udev rules
	// that pick a scheduler by device type: mq-deadline on the volume
	// took 4 KiB random reads at queue depth 32 in ext4 from 39.1k to
	// 17.7k IOPS (5 passes, system CPU per I/O 26.6 → 39.2 µs).
	schedNone = "none"
	// wbtOff turns off writeback throttling on the loop device. The kernel
	// enables it on the first write (a 2 ms latency target) and then
	// throttles the volume's own writeback, while the direct I/O the device
	// does on the image is never throttled below:
	// a 2 GiB buffered write into an ext4 volume went from 760 to
	// 1358 MiB/s (5 passes; the same write on the pool: 948 MiB/s).
	wbtOff = "0"
	// discardOff (discard_max_bytes) makes a thick volume's device refuse
	// discards: the loop device turns each into a hole punch in the
	// image, which would hand blocks the pool promised the volume back to
	// the pool (fstrim in the volume, BLKDISCARD from a raw block pod) and
	// let a later write fail with ENOSPC. A thin volume's device passes
	// them: that is how a thin volume gives space back. What it costs:
	// fstrim and BLKDISCARD on a thick volume fail with EOPNOTSUPP, and
	// the limit outlives the image on the device's number (the kernel
	// drops the discard granularity to 0, after which sysfs refuses every
	// other value), so Detach removes the device (LOOP_CTL_REMOVE) and the
	// next attach makes a new one: a thick volume's detach took 40 ms
	// instead of 0.2, its next attach 36 instead of 28 (test/bench
	// BenchmarkLoopDiscardLimit).
	discardOff = "0"
)

// Tune implements Interface.
func (d Devices) Tune(devPath string, discard bool) error {
	// The settings are written to sysfs while the device is held open, so
	// that they reach the device that was checked to be the owner's.
	name, dev, _, err := d.hold(devPath)
	if err != nil {
		return err
	}
	defer dev.Close()
	q := filepath.Join(sysBlock, name, "queue")
	if err := setScheduler(q, schedNone); err != nil {
		return fmt.Errorf("tune %s: %w", devPath, err)
	}
	// Written even when it reads 0: before the first write the throttle
	// is not set up yet and reads 0, and the kernel would then enable it
	// with its default; a value set by hand stays. A kernel without
	// writeback throttling has no such file.
	if err := writeAttr(q, "wbt_lat_usec", wbtOff); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("tune %s: %w", devPath, err)
	}
	// A thin volume on a device whose discards an earlier user limited
	// gets none: nothing in sysfs can lift it. Detach removes such devices;
	// one is left only by a crash between a thick volume's unstage and its
	// Detach, or by an attach that took the number in the instant between
	// the detach and the removal.
	if !discard {
		if err := refuseDiscards(q); err != nil {
			return fmt.Errorf("tune %s: %w", devPath, err)
		}
	}
	return nil
}

// refuseDiscards sets the queue's discard limit to 0 unless it is 0 already.
func refuseDiscards(q string) error {
	cur, err := readAttr(q, "discard_max_bytes")
	if errors.Is(err, fs.ErrNotExist) {
		return nil // a kernel without discard on loop devices
	}
	if err != nil || cur == discardOff {
		return err
	}
	return writeAttr(q, "discard_max_bytes", discardOff)
}

// discardsLimited tells whether the device refuses discards because a
// limit was set (by Tune) although its image's filesystem takes them:
// discard_max_bytes 0 under a discard_max_hw_bytes that is not. The
// kernel keeps both after the detach.
func discardsLimited(name string) bool {
	q := filepath.Join(sysBlock, name, "queue")
	limit, err := readAttr(q, "discard_max_bytes")
	if err != nil || limit != "0" {
		return false
	}
	hw, err := readAttr(q, "discard_max_hw_bytes")
	return err == nil && hw != "0"
}

// setScheduler selects the I/O scheduler unless it is selected already
// (a switch freezes the queue).
func setScheduler(q, sched string) error {
	cur, err := readAttr(q, "scheduler") // "[none] mq-deadline kyber bfq"
	if err != nil {
		return err
	}
	if strings.Contains(cur, "["+sched+"]") || cur == sched {
		return nil
	}
	return writeAttr(q, "scheduler", sched)
}

func readAttr(q, attr string) (string, error) {
	data, err := os.ReadFile(filepath.Join(q, attr))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", attr, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// writeAttr writes an existing sysfs attribute (never creates one: a
// missing attribute is fs.ErrNotExist).
func writeAttr(q, attr, value string) error {
	f, err := os.OpenFile(filepath.Join(q, attr), os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("set %s: %w", attr, err)
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("set %s to %s: %w", attr, value, err)
	}
	return nil
}
