package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// stats implements NodeGetVolumeStats: bytes and inodes of a mounted
// filesystem, bytes of a raw block device. The path must be a mount of the
// volume's device, else there is no volume there (NOT_FOUND). A damaged
// record does not stop the report; NodeGetVolumeHealth says what is wrong.
func (n *node) stats(_ context.Context, a statsArgs) (*csi.NodeGetVolumeStatsResponse, error) {
	v, err := n.residence(a.id).ReadVolume(a.id)
	if errors.Is(err, pool.ErrNotFound) {
		return nil, err
	}
	r, err := n.resolve(a.volumePath, false)
	if errors.Is(err, errNotOwn) {
		err = volspec.Errorf(errPathMissing, "no volume at %s: %w", a.volumePath, err)
	}
	if err != nil {
		return nil, err
	}
	defer r.close()
	if !r.exists() {
		return nil, volspec.Errorf(errPathMissing, "volume_path %s does not exist", a.volumePath)
	}
	dev, found, err := n.findDevice(a.id)
	if err != nil {
		return nil, err
	}
	mp, mounted, err := n.mountAt(r)
	if err != nil {
		return nil, err
	}
	if !found && mounted && mp.path == r.path {
		// The usage of a fenced device is not the volume's (fenced.go).
		fenced, err := n.fencedDevices(a.id)
		if err != nil {
			return nil, err
		}
		if fdev, ok := n.fencedMount(mp, fenced); ok {
			return nil, errFencedHere(a.id, fdev, a.volumePath)
		}
	}
	if !found {
		return nil, volspec.Errorf(errPathMissing, "volume %s is not staged on node %s", a.id, n.NodeID)
	}
	if !mounted || mp.path != r.path || !n.mountedFrom(mp, dev) {
		return nil, volspec.Errorf(errPathMissing, "volume %s is not mounted at %s", a.id, a.volumePath)
	}

	block := r.mode == unix.S_IFBLK || (v != nil && v.AccessType == pool.AccessBlock)
	if block {
		size, err := n.Loop.Size(dev)
		if err != nil {
			return nil, fmt.Errorf("volume %s: %w", a.id, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(r.fd, &st); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", a.volumePath, err)
	}
	bsize := st.Bsize
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{
			Unit:      csi.VolumeUsage_BYTES,
			Total:     int64(st.Blocks) * bsize,
			Available: int64(st.Bavail) * bsize,
			Used:      int64(st.Blocks-st.Bfree) * bsize,
		},
		{
			Unit:      csi.VolumeUsage_INODES,
			Total:     int64(st.Files),
			Available: int64(st.Ffree),
			Used:      int64(st.Files - st.Ffree),
		},
	}}, nil
}

// Reasons of NodeGetVolumeHealth entries.
const (
	reasonRecordMissing = "RecordMissing"
	reasonRecordCorrupt = "RecordCorrupt"
	reasonImageMissing  = "ImageMissing"
	reasonNotAttached   = "NotAttachedHere"
	reasonNoDevice      = "LoopDeviceMissing"
	reasonNotMounted    = "NotMounted"
	reasonWrongMount    = "MountedFromElsewhere"
	reasonFenced        = "Fenced"
)

// health implements NodeGetVolumeHealth: it reports what is gone or wrong
// with the volume's record, image, loop device and the given paths. A
// volume of which nothing at all is left is NOT_FOUND.
func (n *node) health(_ context.Context, a healthArgs) (*csi.NodeGetVolumeHealthResponse, error) {
	p := n.residence(a.id)
	var entries []*csi.VolumeHealth_VolumeHealthEntry
	add := func(status csi.VolumeHealthErrorType, reason, format string, args ...any) {
		entries = append(entries, &csi.VolumeHealth_VolumeHealthEntry{Status: status, Reason: reason, Message: fmt.Sprintf(format, args...)})
	}

	v, recErr := p.ReadVolume(a.id)
	_, imgErr := os.Stat(p.ImagePath(a.id))
	dev, found, err := n.findDevice(a.id)
	if err != nil {
		return nil, err
	}
	// Without a device of the image, one of a file replaced there: a
	// fence when the controller also broke this node's staged record
	// (fenced.go), else an image replaced by someone else (deepHealth).
	var replaced []string
	fence := false
	if !found {
		if replaced, err = n.fencedDevices(a.id); err != nil {
			return nil, err
		}
		fence = len(replaced) > 0 && n.fencedRecordGone(a.id)
	}
	switch {
	case errors.Is(recErr, pool.ErrNotFound) && errors.Is(imgErr, fs.ErrNotExist) && !found:
		return nil, recErr
	case errors.Is(recErr, pool.ErrNotFound):
		add(csi.VolumeHealthErrorType_INACCESSIBLE, reasonRecordMissing, "the record of volume %s is missing", a.id)
	case errors.Is(recErr, pool.ErrCorrupt):
		add(csi.VolumeHealthErrorType_INACCESSIBLE, reasonRecordCorrupt, "%v", recErr)
	case recErr != nil:
		return nil, recErr
	default:
		if _, ok := v.AttachedTo(n.NodeID); !ok && (found || len(replaced) > 0 || a.staging != "" || a.publish != "") {
			add(csi.VolumeHealthErrorType_INACCESSIBLE, reasonNotAttached, "volume %s is in use on node %s but not attached to it", a.id, n.NodeID)
		}
	}
	imageGone := errors.Is(imgErr, fs.ErrNotExist)
	if found && !imageGone {
		st, err := n.Loop.Status(dev)
		if err != nil && !errors.Is(err, loop.ErrNotAttached) {
			return nil, fmt.Errorf("volume %s: %w", a.id, err)
		}
		imageGone = st.Deleted
	}
	if imageGone {
		add(csi.VolumeHealthErrorType_DATA_LOSS, reasonImageMissing, "the image %s of volume %s is missing", p.ImagePath(a.id), a.id)
	}

	block := v != nil && v.AccessType == pool.AccessBlock
	if v == nil && a.publish != "" {
		if r, err := n.resolve(a.publish, false); err == nil {
			block = r.mode == unix.S_IFBLK
			r.close()
		}
	}
	paths := []string{a.publish}
	if !block {
		paths = append(paths, a.staging) // a staged block volume mounts nothing
	}
	switch {
	case fence:
		add(csi.VolumeHealthErrorType_INACCESSIBLE, reasonFenced,
			"%s (it is lost when the device is detached, and the volume may be in use on another node): stop the volume's Pods here and unstage it; NodeUnstageVolume detaches the fenced device and leaves the image alone",
			fencedMessage(a.id, replaced[0]))
	case (a.staging != "" || a.publish != "") && !found:
		add(csi.VolumeHealthErrorType_INACCESSIBLE, reasonNoDevice, "volume %s has no loop device on node %s", a.id, n.NodeID)
	}
	notMounted, wrong := "", ""
	eio := false
	for _, path := range paths {
		if path == "" {
			continue
		}
		mp, mounted, r, err := n.mountAtPath(path)
		if errors.Is(err, unix.EIO) {
			eio = true // a filesystem that shut down (fshealth.go reports it)
			continue
		}
		if err != nil {
			return nil, err
		}
		r.close()
		switch {
		case !mounted && notMounted == "":
			notMounted = path
			add(csi.VolumeHealthErrorType_INACCESSIBLE, reasonNotMounted, "volume %s is not mounted at %s", a.id, path)
		case mounted && found && !n.mountedFrom(mp, dev) && wrong == "":
			wrong = path
			add(csi.VolumeHealthErrorType_INACCESSIBLE, reasonWrongMount, "%s is mounted from %s, not from the volume's device %s", path, mp.source, dev)
		}
	}
	other := ""
	if !fence && len(replaced) > 0 {
		other = replaced[0]
	}
	n.deepHealth(a, v, dev, found, eio, other, add) // fshealth.go
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: a.id.String(), HealthStatuses: entries}}, nil
}
