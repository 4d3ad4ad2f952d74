// Package extprovisioner builds the upstream external-provisioner
// (github.com/kubernetes-csi/external-provisioner/v6, cmd/csi-provisioner)
// from the Go module proxy into the user's cache (test/internal/modbuild),
// so that the capacity benchmark can run its capacity controller
// (--enable-capacity) side by side with loopvol's.
package extprovisioner

import (
	"context"
	"io"

	"github.com/loopvol/loopvol/test/internal/modbuild"
)

// Module is the upstream module path.
const Module = "github.com/kubernetes-csi/external-provisioner/v6"

func command(version string) modbuild.Command {
	return modbuild.Command{Module: Module, Version: version, Dir: "cmd/csi-provisioner", CacheName: "external-provisioner"}
}

// Path returns where the binary of version lives:
// ${XDG_CACHE_HOME:-~/.cache}/loopvol/bench/external-provisioner-<version>/csi-provisioner.
func Path(version string) (string, error) { return command(version).Path() }

// Build returns the path of external-provisioner's csi-provisioner at
// version (e.g. "v6.4.0"), building it first unless the cache has it.
func Build(ctx context.Context, version string, progress io.Writer) (string, error) {
	return command(version).Build(ctx, progress)
}
