package node

import (
	"fmt"
	"time"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// node is the unlocked implementation of the Node service; Server locks.
type node struct {
	// mounts is the mount table: the kernel's (sysMounts), or a fake's.
	mounts mountTable
	// ext4Size reads a device's ext4 superblock (see growExt4BeforeMount);
	// nil with fake devices, which have nothing to read.
	ext4Size func(dev string) (size, blockSize int64, err error)
	// freezer freezes filesystems (selffence.go): the kernel's, or a
	// fake's.
	freezer fsFreezer
	// sf is the self-fence's state (selffence.go), the one thing the node
	// keeps in memory.
	sf selfFence
	// shut remembers the fenced devices whose filesystem the node shut
	// down (fencedshutdown.go), to log each once.
	shut shutDowns

	Config
	kubeletDir  string // cleaned
	kubeletReal string // with symbolic links resolved
	pools       map[string]*pool.Pool
	// started is this plugin's incarnation, the LastStart of its node
	// records; its staged records carry it (staged.go).
	started time.Time
}

// volume reads the record of a volume, in the pool it lives in (see
// residence). A missing record is NOT_FOUND.
func (n *node) volume(id pool.VolumeID) (*pool.Pool, *pool.Volume, error) {
	return n.pools[id.Pool].Locate(id, n.peer)
}

// residence returns the pool that holds a volume's image and record: the
// pool its ID names, or the one that pool's forwarding record names once
// the controller moved it (pool.Locate: one hop, strictly checked). When it
// cannot tell, it returns the ID's pool, whose reads then say what is wrong.
func (n *node) residence(id pool.VolumeID) *pool.Pool {
	return n.pools[id.Pool].Resident(id, n.peer)
}

func (n *node) peer(name string) *pool.Pool { return n.pools[name] }

// attachedVolume reads the record of a volume and checks that it is attached
// to this node: this is the fence that keeps a single-node volume of a shared
// pool from being used by two nodes at once.
func (n *node) attachedVolume(id pool.VolumeID) (*pool.Pool, *pool.Volume, pool.Attachment, error) {
	p, v, err := n.volume(id)
	if err != nil {
		return nil, nil, pool.Attachment{}, err
	}
	att, ok := v.AttachedTo(n.NodeID)
	if !ok {
		return nil, nil, pool.Attachment{}, volspec.Errorf(errNotAttached, "volume %s is not attached to node %s (ControllerPublishVolume first)", id, n.NodeID)
	}
	return p, v, att, nil
}

// usableVolume is attachedVolume plus checkAccessType: the volume is attached
// here and the request uses it the way it was made.
func (n *node) usableVolume(id pool.VolumeID, c capability) (*pool.Volume, pool.Attachment, error) {
	_, v, att, err := n.attachedVolume(id)
	if err != nil {
		return nil, att, err
	}
	if err := checkAccessType(v, c); err != nil {
		return nil, att, err
	}
	return v, att, nil
}

// checkAccessType checks that a request uses the volume the way it was made.
func checkAccessType(v *pool.Volume, c capability) error {
	if c.block != (v.AccessType == pool.AccessBlock) {
		want := "mount"
		if c.block {
			want = "block"
		}
		return volspec.Errorf(volspec.ErrInvalid, "volume %s has access type %s, the request asks for %s", v.ID, v.AccessType, want)
	}
	if !c.block && c.fsType != "" && v.FsType != "" && c.fsType != v.FsType {
		return volspec.Errorf(volspec.ErrInvalid, "volume %s has filesystem %s, the request asks for %s", v.ID, v.FsType, c.fsType)
	}
	return nil
}

// findDevice returns this node's loop device of a volume's image, if it
// has one: one its plugin attached (or an untagged one an older plugin
// left), never another node's device of the same image (pkg/loop Find).
func (n *node) findDevice(id pool.VolumeID) (string, bool, error) {
	dev, ok, err := n.Loop.Find(n.residence(id).ImagePath(id))
	if err != nil {
		return "", false, fmt.Errorf("find loop device of volume %s: %w", id, err)
	}
	return dev, ok, nil
}
