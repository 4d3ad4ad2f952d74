package controller

import (
	"github.com/loopvol/loopvol/pkg/pool"
)

// checkUnstaged refuses, before anything changes, a ControllerModifyVolume
// that would change the image under a node that may still write it: a move
// (to is set) or a thinning (thin asks for a sparse image the volume does not
// have settled yet), while any node has the volume staged. Being detached is
// not enough: a ControllerUnpublishVolume forced by the CO (or, later,
// fencing) leaves the node with the volume staged and written, and the copy
// or the hole punching would lose its writes. The records are the node
// plugins' own (pool/staged.go), in the volume's home pool; the answer is
// FAILED_PRECONDITION naming the nodes, which external-resizer retries. The
// caller holds the volume's lock. pool.MoveVolume checks the same, under the
// same lock; this answers before a change of layout is applied.
func checkUnstaged(home *pool.Pool, id pool.VolumeID, v *pool.Volume, thin *bool, to *pool.Pool) error {
	if to != nil {
		return home.CheckUnstaged(id, "it moves to pool "+to.Name)
	}
	if thin != nil && *thin && (!v.Thin || v.Modifying != nil) {
		return home.CheckUnstaged(id, "it is made thin (its unwritten blocks freed)")
	}
	return nil
}
