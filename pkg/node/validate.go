package node

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/loopvol/loopvol/pkg/pool"
	"github.com/loopvol/loopvol/pkg/volspec"
)

// maxPathLength bounds the paths we accept (PATH_MAX).
const maxPathLength = 4096

// capability is a checked csi.VolumeCapability.
type capability struct {
	block     bool
	fsType    string // mount mode only; "" when the request names none
	mountOpts mountOptions
	mode      csi.VolumeCapability_AccessMode_Mode
}

// readOnly reports whether the access mode allows reading only.
func (c capability) readOnly() bool {
	return volspec.ReadOnlyAccessMode(c.mode)
}

type stageArgs struct {
	id      pool.VolumeID
	staging string
	cap     capability
}

type unstageArgs struct {
	id      pool.VolumeID
	staging string
}

type publishArgs struct {
	id       pool.VolumeID
	staging  string
	target   string
	cap      capability
	readOnly bool
}

type unpublishArgs struct {
	id     pool.VolumeID
	target string
}

type expandArgs struct {
	id         pool.VolumeID
	volumePath string
	staging    string // "" when not given
	required   int64
	limit      int64
	cap        *capability // nil when not given
}

type statsArgs struct {
	id         pool.VolumeID
	volumePath string
}

type healthArgs struct {
	id      pool.VolumeID
	publish string // "" when not given
	staging string // "" when not given
}

// Every *Args method checks a request completely before anything touches the
// disk: missing or malformed fields first (INVALID_ARGUMENT), then the volume
// ID, which is parsed strictly (anything that is not one of our IDs is
// NOT_FOUND: it can never name a path).

func (n *node) stageArgs(req *csi.NodeStageVolumeRequest) (stageArgs, error) {
	var a stageArgs
	var err error
	if err = requireID(req.GetVolumeId()); err != nil {
		return a, err
	}
	if a.staging, err = n.kubeletPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return a, err
	}
	if a.cap, err = checkCapability(req.GetVolumeCapability()); err != nil {
		return a, err
	}
	a.id, err = n.parseID(req.GetVolumeId())
	return a, err
}

func (n *node) unstageArgs(req *csi.NodeUnstageVolumeRequest) (unstageArgs, error) {
	var a unstageArgs
	var err error
	if err = requireID(req.GetVolumeId()); err != nil {
		return a, err
	}
	if a.staging, err = n.lexicalPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return a, err
	}
	a.id, err = n.parseID(req.GetVolumeId())
	return a, err
}

func (n *node) publishArgs(req *csi.NodePublishVolumeRequest) (publishArgs, error) {
	a := publishArgs{readOnly: req.GetReadonly()}
	var err error
	if err = requireID(req.GetVolumeId()); err != nil {
		return a, err
	}
	if a.target, err = n.kubeletPath("target_path", req.GetTargetPath()); err != nil {
		return a, err
	}
	// We offer STAGE_UNSTAGE_VOLUME, so the CO stages first and names the
	// staging path here.
	if a.staging, err = n.kubeletPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
		return a, err
	}
	if a.cap, err = checkCapability(req.GetVolumeCapability()); err != nil {
		return a, err
	}
	if a.target == a.staging {
		return a, volspec.Errorf(volspec.ErrInvalid, "target_path and staging_target_path are both %q", a.target)
	}
	a.id, err = n.parseID(req.GetVolumeId())
	return a, err
}

func (n *node) unpublishArgs(req *csi.NodeUnpublishVolumeRequest) (unpublishArgs, error) {
	var a unpublishArgs
	var err error
	if err = requireID(req.GetVolumeId()); err != nil {
		return a, err
	}
	if a.target, err = n.lexicalPath("target_path", req.GetTargetPath()); err != nil {
		return a, err
	}
	a.id, err = n.parseID(req.GetVolumeId())
	return a, err
}

func (n *node) expandArgs(req *csi.NodeExpandVolumeRequest) (expandArgs, error) {
	var a expandArgs
	var err error
	if err = requireID(req.GetVolumeId()); err != nil {
		return a, err
	}
	if req.GetVolumePath() == "" {
		return a, volspec.Errorf(volspec.ErrInvalid, "volume_path is missing")
	}
	if r := req.GetCapacityRange(); r != nil {
		a.required, a.limit = r.GetRequiredBytes(), r.GetLimitBytes()
		if a.required < 0 || a.limit < 0 || (a.limit > 0 && a.required > a.limit) {
			return a, volspec.Errorf(volspec.ErrInvalid, "capacity_range: required_bytes %d and limit_bytes %d are not a valid range", a.required, a.limit)
		}
	}
	if req.GetVolumeCapability() != nil {
		c, err := checkCapability(req.GetVolumeCapability())
		if err != nil {
			return a, err
		}
		a.cap = &c
	}
	if req.GetStagingTargetPath() != "" {
		if a.staging, err = n.kubeletPath("staging_target_path", req.GetStagingTargetPath()); err != nil {
			return a, err
		}
	}
	if a.id, err = n.parseID(req.GetVolumeId()); err != nil {
		return a, err
	}
	a.volumePath, err = n.volumePath(req.GetVolumePath())
	return a, err
}

func (n *node) statsArgs(req *csi.NodeGetVolumeStatsRequest) (statsArgs, error) {
	var a statsArgs
	var err error
	if err = requireID(req.GetVolumeId()); err != nil {
		return a, err
	}
	if req.GetVolumePath() == "" {
		return a, volspec.Errorf(volspec.ErrInvalid, "volume_path is missing")
	}
	if a.id, err = n.parseID(req.GetVolumeId()); err != nil {
		return a, err
	}
	a.volumePath, err = n.volumePath(req.GetVolumePath())
	return a, err
}

func (n *node) healthArgs(req *csi.NodeGetVolumeHealthRequest) (healthArgs, error) {
	var a healthArgs
	var err error
	if err = requireID(req.GetVolumeId()); err != nil {
		return a, err
	}
	if p := req.GetVolumePublishPath(); p != "" {
		if a.publish, err = n.kubeletPath("volume_publish_path", p); err != nil {
			return a, err
		}
	}
	if p := req.GetStagingTargetPath(); p != "" {
		if a.staging, err = n.kubeletPath("staging_target_path", p); err != nil {
			return a, err
		}
	}
	a.id, err = n.parseID(req.GetVolumeId())
	return a, err
}

func requireID(id string) error {
	if id == "" {
		return volspec.Errorf(volspec.ErrInvalid, "volume_id is missing")
	}
	return nil
}

// parseID parses a volume ID strictly and finds its pool among the pools
// this node serves; either failing is NOT_FOUND.
func (n *node) parseID(s string) (pool.VolumeID, error) {
	id, err := pool.ParseVolumeID(s)
	if err != nil {
		return id, err
	}
	if _, ok := n.pools[id.Pool]; !ok {
		return id, volspec.Errorf(pool.ErrNotFound, "volume %s: pool %q is not served by node %s", id, id.Pool, n.NodeID)
	}
	return id, nil
}

// kubeletPath checks a staging or target path (see underKubeletDir) and
// returns it cleaned. A path that leads through a symbolic link or a
// non-directory is refused here already, before any lock is taken or the
// volume looked up; the RPC resolves the path again when it uses it, and
// relies only on that.
func (n *node) kubeletPath(field, p string) (string, error) {
	clean, err := n.lexicalPath(field, p)
	if err != nil {
		return "", err
	}
	if r, err := n.resolve(clean, false); errors.Is(err, errNotOwn) {
		return "", volspec.Errorf(volspec.ErrInvalid, "%s: %w", field, err)
	} else if err == nil {
		r.close()
	}
	return clean, nil
}

// lexicalPath checks a path as a string only (see underKubeletDir): for
// NodeUnstageVolume and NodeUnpublishVolume, to which a path that leads
// elsewhere holds nothing of the volume, which is not an error.
func (n *node) lexicalPath(field, p string) (string, error) {
	clean, err := n.underKubeletDir(field, p)
	if err != nil {
		return "", volspec.Errorf(volspec.ErrInvalid, "%w", err)
	}
	return clean, nil
}

// volumePath checks the volume_path of NodeGetVolumeStats and
// NodeExpandVolume. The CSI spec wants NOT_FOUND there, not INVALID_ARGUMENT,
// when no volume is at the path, and a path outside the kubelet directory
// holds none of ours.
func (n *node) volumePath(p string) (string, error) {
	clean, err := n.underKubeletDir("volume_path", p)
	if err != nil {
		return "", volspec.Errorf(errPathMissing, "no volume there: %w", err)
	}
	return clean, nil
}

// underKubeletDir checks a path as a string: absolute, no "..", no NUL,
// strictly below the kubelet directory. It returns the cleaned path. What
// the path leads to is not looked at here: resolve does that once, when the
// path is used, and the RPC acts on what it resolved.
func (n *node) underKubeletDir(field, p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("%s is missing", field)
	case len(p) > maxPathLength:
		return "", fmt.Errorf("%s is %d bytes long, more than %d", field, len(p), maxPathLength)
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("%s contains a NUL byte", field)
	case !filepath.IsAbs(p):
		return "", fmt.Errorf("%s %q is not absolute", field, p)
	}
	for _, elem := range strings.Split(p, "/") {
		if elem == ".." {
			return "", fmt.Errorf("%s %q contains \"..\"", field, p)
		}
	}
	clean := filepath.Clean(p)
	if !strings.HasPrefix(clean, n.kubeletDir+"/") {
		return "", fmt.Errorf("%s %q is not under the kubelet directory %s", field, p, n.kubeletDir)
	}
	return clean, nil
}

// canonical is the canonical path of a checked path: the kubelet
// directory's own path (symbolic links resolved) joined with the rest,
// which resolve refuses to find a symbolic link in.
func (n *node) canonical(p string) string {
	return n.kubeletReal + strings.TrimPrefix(p, n.kubeletDir)
}

// checkCapability checks a volume capability: an access mode we know and
// allow, and block or mount with ext4 or xfs.
func checkCapability(vc *csi.VolumeCapability) (capability, error) {
	var c capability
	if vc == nil {
		return c, volspec.Errorf(volspec.ErrInvalid, "volume_capability is missing")
	}
	c.mode = vc.GetAccessMode().GetMode()
	if !volspec.KnownAccessMode(c.mode) {
		return c, volspec.Errorf(volspec.ErrInvalid, "volume_capability.access_mode %d is unknown", c.mode)
	}
	switch {
	case vc.GetBlock() != nil:
		c.block = true
	case vc.GetMount() != nil:
		m := vc.GetMount()
		// "" means the volume's own filesystem, else the default.
		if fs := m.GetFsType(); fs != "" && !volspec.SupportedFsType(fs) {
			return c, volspec.Errorf(volspec.ErrInvalid, "volume_capability.mount.fs_type %q is not supported (%s)", fs, strings.Join(volspec.Filesystems, " or "))
		}
		c.fsType = m.GetFsType()
		opts, err := parseMountFlags(m.GetMountFlags())
		if err != nil {
			return c, err
		}
		if c.readOnly() {
			// Known already: a reader-only mode with rw is refused before
			// the volume is looked up.
			if err := opts.forMount(c.fsType, true); err != nil {
				return c, err
			}
		}
		c.mountOpts = opts
		if volspec.BlockOnlyAccessMode(c.mode) {
			return c, volspec.Errorf(volspec.ErrInvalid, "volume_capability: MULTI_NODE_MULTI_WRITER is supported only for block volumes")
		}
	default:
		return c, volspec.Errorf(volspec.ErrInvalid, "volume_capability has neither block nor mount access type")
	}
	return c, nil
}

// singleMountOption tells whether f is exactly one mount option: not empty,
// no NUL, and no comma outside a double-quoted value. The quotes matter:
// kubelet's SELinux mount option (CSIDriver seLinuxMount) is
// context="system_u:object_r:container_file_t:s0:c1,c2", one option whose
// category list has a comma, which the kernel's option parser keeps
// together because of the quotes.
func singleMountOption(f string) bool {
	if f == "" || strings.ContainsRune(f, 0) {
		return false
	}
	quoted := false
	for _, r := range f {
		switch {
		case r == '"':
			quoted = !quoted
		case r == ',' && !quoted:
			return false
		}
	}
	return !quoted
}
