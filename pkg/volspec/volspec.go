package volspec

import (
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// TopologyKey is loopvol's accessible-topology key: a pool belongs to one
// zone and serves the nodes of that zone, and a node reports the zone of
// its pools under this key in NodeGetInfo.
const TopologyKey = "topology.loopvol.csi.io/zone"

// The filesystems a mount volume may have.
const (
	FsExt4 = "ext4"
	FsXFS  = "xfs"
)

// DefaultFsType is the filesystem of a mount volume whose request names
// none, unless the driver is told another.
const DefaultFsType = FsExt4

// Filesystems lists the filesystems a mount volume may have, in the order
// messages name them.
var Filesystems = []string{FsExt4, FsXFS}

// SupportedFsType reports whether a mount volume may have the filesystem
// fsType (one of Filesystems; "" is not one).
func SupportedFsType(fsType string) bool { return slices.Contains(Filesystems, fsType) }

// KnownAccessMode reports whether m is an access mode of the CSI spec other
// than UNKNOWN: every such mode is offered, with the limits below.
func KnownAccessMode(m csi.VolumeCapability_AccessMode_Mode) bool {
	_, known := csi.VolumeCapability_AccessMode_Mode_name[int32(m)]
	return known && m != csi.VolumeCapability_AccessMode_UNKNOWN
}

// ReadOnlyAccessMode reports whether m lets a volume be read only.
func ReadOnlyAccessMode(m csi.VolumeCapability_AccessMode_Mode) bool {
	return m == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY ||
		m == csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// SingleNodeAccessMode reports whether m lets a volume be attached to one
// node at a time.
func SingleNodeAccessMode(m csi.VolumeCapability_AccessMode_Mode) bool {
	switch m {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		return true
	}
	return false
}

// BlockOnlyAccessMode reports whether only a raw block volume may have m:
// several writers on several nodes. ext4 and xfs are not cluster
// filesystems, and one written from two nodes at once is corrupted.
func BlockOnlyAccessMode(m csi.VolumeCapability_AccessMode_Mode) bool {
	return m == csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
}
