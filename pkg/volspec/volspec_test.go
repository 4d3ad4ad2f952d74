package volspec

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

func TestSupportedFsType(t *testing.T) {
	for fs, want := range map[string]bool{"ext4": true, "xfs": true, "": false, "btrfs": false, "EXT4": false} {
		if got := SupportedFsType(fs); got != want {
			t.Errorf("SupportedFsType(%q) = %t, want %t", fs, got, want)
		}
	}
	if !SupportedFsType(DefaultFsType) {
		t.Errorf("the default filesystem %q is not supported", DefaultFsType)
	}
}

// TestAccessModes: the rules for every mode of the spec and for a number
// the spec does not define.
func TestAccessModes(t *testing.T) {
	type rules struct{ known, readOnly, singleNode, blockOnly bool }
	for m, want := range map[csi.VolumeCapability_AccessMode_Mode]rules{
		csi.VolumeCapability_AccessMode_UNKNOWN:                   {},
		csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:        {known: true, singleNode: true},
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:   {known: true, readOnly: true, singleNode: true},
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:    {known: true, readOnly: true},
		csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER:  {known: true},
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:   {known: true, blockOnly: true},
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER: {known: true, singleNode: true},
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:  {known: true, singleNode: true},
		99: {},
	} {
		got := rules{known: KnownAccessMode(m), readOnly: ReadOnlyAccessMode(m), singleNode: SingleNodeAccessMode(m), blockOnly: BlockOnlyAccessMode(m)}
		if got != want {
			t.Errorf("mode %v: %+v, want %+v", m, got, want)
		}
	}
	if n := len(csi.VolumeCapability_AccessMode_Mode_name); n != 8 {
		t.Errorf("the CSI spec has %d access modes; this test knows 8: give the new ones their rules", n)
	}
}
