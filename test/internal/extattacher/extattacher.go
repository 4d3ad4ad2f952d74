// Package extattacher builds the upstream external-attacher
// (github.com/kubernetes-csi/external-attacher/v4, cmd/csi-attacher) from the
// Go module proxy into the user's cache (test/internal/modbuild), so that
// benchmarks can run it side by side with loopvol's attacher against the
// same control plane.
package extattacher

import (
	"context"
	"io"

	"github.com/loopvol/loopvol/test/internal/modbuild"
)

// Module is the upstream module path.
const Module = "github.com/kubernetes-csi/external-attacher/v4"

func command(version string) modbuild.Command {
	return modbuild.Command{Module: Module, Version: version, Dir: "cmd/csi-attacher", CacheName: "external-attacher"}
}

// Path returns where the binary of version lives:
// ${XDG_CACHE_HOME:-~/.cache}/loopvol/bench/external-attacher-<version>/csi-attacher.
func Path(version string) (string, error) { return command(version).Path() }

// Build returns the path of external-attacher's csi-attacher at version
// (e.g. "v4.13.0"), building it first unless the cache has it. The first
// build downloads the module and its dependencies through the module proxy
// (GOPROXY) and takes minutes; progress names what is going on.
func Build(ctx context.Context, version string, progress io.Writer) (string, error) {
	return command(version).Build(ctx, progress)
}
