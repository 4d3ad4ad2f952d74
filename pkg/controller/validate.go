package controller

import (
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
	// DefaultVolumeSize is used when a request gives no capacity range.
	DefaultVolumeSize = gib
	// maxVolumeSize bounds sizes far beyond any pool, so arithmetic on them
	// cannot overflow.
	maxVolumeSize = int64(1) << 50
)

// minSize is the smallest volume of an access type and filesystem: mkfs.xfs
// refuses filesystems under 300 MiB, ext4 needs room for its journal.
func minSize(accessType, fsType string) int64 {
	switch {
	case accessType == pool.AccessBlock:
		return mib
	case fsType == volspec.FsXFS:
		return 300 * mib
	default:
		return 16 * mib
	}
}

// validateName checks a CSI volume name: it only ever becomes a hash, but a
// 10,000-byte name or one with control bytes is a caller bug worth reporting.
func validateName(name string) error {
	if name == "" {
		return invalid("name is required")
	}
	if len(name) > pool.MaxNameLength {
		return invalid("name is %d bytes long; at most %d are allowed", len(name), pool.MaxNameLength)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return invalid("name %q contains a non-printable character", name)
		}
	}
	return nil
}

// volumeShape is what a list of capabilities asks of a volume.
type volumeShape struct {
	accessType string
	fsType     string
	modes      []string
}

// validateCapabilities checks capabilities and returns the shape they ask
// for. All must agree on block or mount and on the filesystem.
func validateCapabilities(caps []*csi.VolumeCapability, defaultFs string) (volumeShape, error) {
	var shape volumeShape
	if len(caps) == 0 {
		return shape, invalid("volume_capabilities are required")
	}
	for i, c := range caps {
		accessType, fsType, mode, err := validateCapability(c, defaultFs)
		if err != nil {
			return shape, invalid("volume_capabilities[%d]: %v", i, err)
		}
		if shape.accessType != "" && (shape.accessType != accessType || shape.fsType != fsType) {
			return shape, invalid("volume_capabilities ask for both %s and %s; a volume is one or the other", describe(shape.accessType, shape.fsType), describe(accessType, fsType))
		}
		shape.accessType, shape.fsType = accessType, fsType
		if !slices.Contains(shape.modes, mode) {
			shape.modes = append(shape.modes, mode)
		}
	}
	slices.Sort(shape.modes)
	return shape, nil
}

func describe(accessType, fsType string) string {
	if accessType == pool.AccessBlock {
		return "raw block"
	}
	return fsType + " filesystem"
}

// validateCapability checks one capability.
func validateCapability(c *csi.VolumeCapability, defaultFs string) (accessType, fsType, mode string, err error) {
	if c == nil {
		return "", "", "", fmt.Errorf("capability is empty")
	}
	m := c.GetAccessMode().GetMode()
	if !volspec.KnownAccessMode(m) {
		return "", "", "", fmt.Errorf("access mode %d is not supported", m)
	}
	mode = m.String()
	switch {
	case c.GetBlock() != nil:
		accessType = pool.AccessBlock
	case c.GetMount() != nil:
		accessType = pool.AccessMount
		fsType = c.GetMount().GetFsType()
		if fsType == "" {
			fsType = defaultFs
		}
		if !volspec.SupportedFsType(fsType) {
			return "", "", "", fmt.Errorf("filesystem %q is not supported (%s)", fsType, strings.Join(volspec.Filesystems, " or "))
		}
		if volspec.BlockOnlyAccessMode(m) {
			return "", "", "", fmt.Errorf("MULTI_NODE_MULTI_WRITER is only offered for raw block volumes: ext4 and xfs are not cluster filesystems")
		}
	default:
		return "", "", "", fmt.Errorf("access type (block or mount) is required")
	}
	return accessType, fsType, mode, nil
}

// requestedSize picks the size to create from a capacity range: the required
// bytes (or the default) rounded up to a MiB and to the minimum for the shape,
// within the limit.
func requestedSize(r *csi.CapacityRange, accessType, fsType string) (int64, error) {
	required, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	if required < 0 || limit < 0 {
		return 0, invalid("capacity_range must not be negative (required %d, limit %d)", required, limit)
	}
	if limit > 0 && required > limit {
		return 0, invalid("capacity_range required_bytes %d is larger than limit_bytes %d", required, limit)
	}
	if required > maxVolumeSize {
		return 0, outOfRange("required_bytes %d is larger than the largest volume loopvol makes (%d)", required, maxVolumeSize)
	}
	size := required
	if size == 0 {
		size = DefaultVolumeSize
		if limit > 0 && limit < size {
			size = limit
		}
	}
	size = max(roundUp(size, mib), minSize(accessType, fsType))
	if limit > 0 && size > limit {
		// Rounding up overshot the limit: take the largest MiB multiple
		// within it, if that is still big enough.
		size = limit / mib * mib
		if size < max(required, minSize(accessType, fsType)) {
			return 0, outOfRange("no size within [%d, %d] fits: volumes are whole MiB and at least %d bytes for %s", required, limit, minSize(accessType, fsType), describe(accessType, fsType))
		}
	}
	return size, nil
}

func roundUp(n, unit int64) int64 { return (n + unit - 1) / unit * unit }

// Bounds of CreateVolume (and GetCapacity, ValidateVolumeCapabilities)
// parameters. They are Kubernetes' own bounds for StorageClass parameters
// (and VolumeAttributesClass ones): at most 512 entries, keys not empty, keys
// and values together at most 256 KiB. Any StorageClass the API server
// accepts passes; a caller that is not Kubernetes cannot send more. A key is
// also bounded by the longest Kubernetes qualified name (a 253-byte DNS
// prefix, '/', a 63-byte name): every key loopvol knows ("pool",
// "csi.storage.k8s.io/...") is one, so a longer key is never a known one.
// Mutable parameters (modify.go) are a closed set of short keys checked
// one by one.
const (
	maxParameters       = 512
	maxParametersBytes  = 256 << 10
	maxParameterKeyLen  = 253 + 1 + 63
	kubernetesPrefix    = "csi.storage.k8s.io/"
	maxObjectNameLength = 253
)

// recordedParameters are the parameters a volume record keeps: the one that
// shapes the volume ("pool", which CreateVolume compares on a retry) and the
// PVC/PV names external-provisioner adds with --extra-create-metadata (for an
// operator reading the pool). Nothing else is stored, so a record stays
// small whatever a StorageClass carries.
var recordedParameters = map[string]bool{
	ParameterPool:                      true,
	kubernetesPrefix + "pvc/name":      true,
	kubernetesPrefix + "pvc/namespace": true,
	kubernetesPrefix + "pv/name":       true,
}

// validateParameters checks StorageClass parameters: their number and size
// (Kubernetes' bounds), "pool" and the csi.storage.k8s.io/ keys Kubernetes
// adds. Anything else is a typo that would otherwise be silently ignored.
func validateParameters(params map[string]string) error {
	if len(params) > maxParameters {
		return invalid("%d parameters; at most %d are allowed (the Kubernetes StorageClass limit)", len(params), maxParameters)
	}
	total := 0
	for k, v := range params {
		total += len(k) + len(v)
	}
	if total > maxParametersBytes {
		return invalid("parameters take %d bytes; keys and values together may take at most %d (the Kubernetes StorageClass limit)", total, maxParametersBytes)
	}
	for k, v := range params {
		switch {
		case k == "":
			return invalid("a parameter key is empty")
		case len(k) > maxParameterKeyLen:
			return invalid("parameter key %q... is %d bytes; at most %d are allowed", k[:32], len(k), maxParameterKeyLen)
		case k == ParameterPool:
			if err := pool.ValidatePoolName(v); err != nil {
				return invalid("parameter %q: %v", k, err)
			}
		case recordedParameters[k] && len(v) > maxObjectNameLength:
			return invalid("parameter %q is %d bytes; a Kubernetes object name has at most %d", k, len(v), maxObjectNameLength)
		case strings.HasPrefix(k, kubernetesPrefix):
		default:
			return invalid("parameter %q is not known; loopvol takes %q", k, ParameterPool)
		}
	}
	return nil
}

// storedParameters returns the validated parameters a volume record keeps.
func storedParameters(params map[string]string) map[string]string {
	var kept map[string]string
	for k, v := range params {
		if recordedParameters[k] {
			if kept == nil {
				kept = map[string]string{}
			}
			kept[k] = v
		}
	}
	return kept
}
