package kube

import (
	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/accessmodes"
	corev1 "k8s.io/api/core/v1"
)

// VolumeCapability is the CSI volume capability of a PersistentVolume
// spec with a CSI source, as the upstream sidecars derive it: block, or
// mount with the source's fsType (defaultFSType when it names none) and
// the spec's mount options; and the access mode mapped by csi-lib-utils
// (singleNodeMultiWriter: the driver has SINGLE_NODE_MULTI_WRITER). It is
// the one derivation of the attach, resize and modify controllers: the
// driver must see the same capability whatever the call.
func VolumeCapability(spec *corev1.PersistentVolumeSpec, singleNodeMultiWriter bool, defaultFSType string) (*csi.VolumeCapability, error) {
	mode, err := accessmodes.ToCSIAccessMode(spec.AccessModes, singleNodeMultiWriter)
	if err != nil {
		return nil, err
	}
	vc := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
	if spec.VolumeMode != nil && *spec.VolumeMode == corev1.PersistentVolumeBlock {
		vc.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
		return vc, nil
	}
	fsType := spec.CSI.FSType
	if fsType == "" {
		fsType = defaultFSType
	}
	vc.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
		FsType:     fsType,
		MountFlags: spec.MountOptions,
	}}
	return vc, nil
}
