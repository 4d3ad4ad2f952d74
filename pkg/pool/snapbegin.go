package pool

import (
	"errors"
	"fmt"
	"time"
)

// BeginSnapshot writes the record of the snapshot called name of volume src
// saying not ready, if it has none yet, before anything else of the snapshot
// happens; CreateSnapshot then finds it and makes the snapshot. The caller
// holds the locks CreateSnapshot needs. It is what a caller that freezes the
// source first needs: a controller killed while the source is frozen finds
// the record that says not ready at its restart, and thaws the source (no
// record, no thaw: the freeze would outlive it). A snapshot of that name of
// another volume wraps ErrExists; one that exists already is left alone.
func (p *Pool) BeginSnapshot(name string, src *Volume) error {
	id := DeriveSnapshotID(p.Name, name)
	srcID, err := ParseVolumeID(src.ID)
	if err != nil {
		return err
	}
	if err := p.own(srcID); err != nil {
		return err
	}
	old, err := p.ReadSnapshot(id)
	switch {
	case err == nil && old.SourceVolumeID != src.ID:
		return fmt.Errorf("snapshot %q exists of volume %s: %w", name, old.SourceVolumeID, ErrExists)
	case err == nil:
		return nil
	case !errors.Is(err, ErrNotFound):
		return err
	}
	return p.writeSnapshot(&Snapshot{ID: id.String(), Name: name, SourceVolumeID: src.ID, SizeBytes: src.SizeBytes,
		AccessType: src.AccessType, FsType: src.FsType, Created: time.Now().UTC().Truncate(time.Second)})
}
