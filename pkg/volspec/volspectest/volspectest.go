// Package volspectest builds the CSI volume capabilities that the tests of
// both CSI services send, so that each states a request in one line.
package volspectest

import "github.com/container-storage-interface/spec/lib/go/csi"

// Mount is a mount capability: filesystem fsType ("" for none named),
// access mode mode and mount flags flags.
func Mount(fsType string, mode csi.VolumeCapability_AccessMode_Mode, flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// Block is a raw block capability with access mode mode.
func Block(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}
