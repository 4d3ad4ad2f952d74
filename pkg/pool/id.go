package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
)

// hashLen is the number of hex digits of a volume ID's hash part.
const hashLen = 32

// MaxNameLength bounds CSI volume names and node IDs we accept; far above what
// Kubernetes generates ("pvc-" + UUID) but small enough to keep logs and files sane.
const MaxNameLength = 128

var (
	// Pool names are DNS labels so they can appear in IDs and labels.
	poolNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	hashRE     = regexp.MustCompile(`^[0-9a-f]{32}$`)
	// Node IDs become file names under PATH/nodes: allow what host names and
	// Kubernetes node names use, nothing that could name another directory.
	nodeIDRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$`)
)

// VolumeID names a volume: the pool it lives in and a hash derived from its CSI
// name. Its string form is "<pool>.<32 hex>".
type VolumeID struct {
	Pool string
	Hash string
}

// String returns the CSI volume ID.
func (id VolumeID) String() string { return id.Pool + "." + id.Hash }

// DeriveVolumeID returns the ID that the volume called name gets in pool. The
// same name always gives the same ID, so a CreateVolume retried after a crash
// finds the volume it half made.
func DeriveVolumeID(poolName, name string) VolumeID {
	sum := sha256.Sum256([]byte(name))
	return VolumeID{Pool: poolName, Hash: hex.EncodeToString(sum[:])[:hashLen]}
}

// ParseVolumeID parses s strictly. Anything but "<pool name>.<32 lowercase
// hex>" is rejected with an error wrapping ErrInvalidID, so an ID can never
// become a path outside its pool.
func ParseVolumeID(s string) (VolumeID, error) {
	if len(s) > 63+1+hashLen {
		return VolumeID{}, fmt.Errorf("volume ID of %d bytes is too long: %w", len(s), ErrInvalidID)
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '.' {
			id := VolumeID{Pool: s[:i], Hash: s[i+1:]}
			if !poolNameRE.MatchString(id.Pool) || !hashRE.MatchString(id.Hash) {
				break
			}
			return id, nil
		}
	}
	return VolumeID{}, fmt.Errorf("volume ID %q is not of the form <pool>.<32 hex digits>: %w", s, ErrInvalidID)
}

// ValidatePoolName checks that name is a DNS label.
func ValidatePoolName(name string) error {
	if !poolNameRE.MatchString(name) {
		return fmt.Errorf("pool name %q is not a DNS label (lowercase letters, digits and '-', at most 63): %w", name, ErrInvalidID)
	}
	return nil
}

// ValidateNodeID checks that a node ID is safe to use as a file name.
func ValidateNodeID(id string) error {
	if !nodeIDRE.MatchString(id) {
		return fmt.Errorf("node ID %q must be 1-128 letters, digits, '.', '_' or '-', starting and ending with a letter or digit: %w", id, ErrInvalidID)
	}
	return nil
}
