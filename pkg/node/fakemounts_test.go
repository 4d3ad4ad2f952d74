package node

import (
	"fmt"
	"strings"

	mount "k8s.io/mount-utils"
)

// fakeMounts puts mount-utils' FakeMounter behind the node's mount table:
// mounts are recorded by canonical path, with the option strings the node
// was asked for. The paths are still resolved for real (the kubelet
// directory of the tests is a real directory), so everything but the
// mount system calls runs as in production.
type fakeMounts struct{ m *mount.FakeMounter }

var _ mountTable = fakeMounts{}

func (f fakeMounts) list() ([]mountEntry, error) {
	mps, err := f.m.List()
	if err != nil {
		return nil, err
	}
	out := make([]mountEntry, 0, len(mps))
	for _, mp := range mps {
		out = append(out, mountEntry{path: mp.Path, source: mp.Device, fsType: mp.Type, opts: mp.Opts})
	}
	return out, nil
}

func (f fakeMounts) at(r *resolved) (mountEntry, bool, error) {
	es, err := f.list()
	if err != nil {
		return mountEntry{}, false, err
	}
	var top mountEntry
	found := false
	for _, e := range es {
		if e.path == r.path {
			top, found = e, true // later entries are mounted over earlier ones
		}
	}
	return top, found, nil
}

func (f fakeMounts) mountFS(dev string, r *resolved, fsType string, o mountOptions, readOnly bool) error {
	return f.m.Mount(dev, r.path, fsType, withRO(o.strings(), readOnly))
}

func (f fakeMounts) bind(source bindSource, r *resolved, o mountOptions, readOnly bool) error {
	src := source.dev
	if source.staging != nil {
		src = source.staging.path
	}
	var perMountOpts []string
	for _, opt := range o {
		if opt.spec.kind == perMount {
			perMountOpts = append(perMountOpts, opt.raw)
		}
	}
	return f.m.Mount(src, r.path, "", append([]string{"bind"}, withRO(perMountOpts, readOnly)...))
}

func (f fakeMounts) unmount(r *resolved) error {
	if !strings.HasPrefix(r.path, "/") {
		return fmt.Errorf("unmount of a relative path %q", r.path)
	}
	return f.m.Unmount(r.path)
}

func withRO(opts []string, readOnly bool) []string {
	if readOnly {
		return append(opts, "ro")
	}
	return opts
}
