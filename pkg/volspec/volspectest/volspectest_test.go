package volspectest

import (
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

func TestCapabilities(t *testing.T) {
	m := Mount("xfs", csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY, "noatime")
	if m.GetMount().GetFsType() != "xfs" || !slices.Equal(m.GetMount().GetMountFlags(), []string{"noatime"}) ||
		m.GetAccessMode().GetMode() != csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY || m.GetBlock() != nil {
		t.Errorf("Mount = %v", m)
	}
	b := Block(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	if b.GetBlock() == nil || b.GetMount() != nil || b.GetAccessMode().GetMode() != csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER {
		t.Errorf("Block = %v", b)
	}
}
