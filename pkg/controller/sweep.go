package controller

import (
	"context"
	"time"

	"github.com/loopvol/loopvol/pkg/pool"
	"k8s.io/klog/v2"
)

// Start thaws what a killed process left frozen (freeze.go) and sweeps
// every pool once, before the caller serves (what a killed process left is
// gone before the first request), then again every sweep interval until
// ctx ends, in the background.
func (s *Server) Start(ctx context.Context) {
	s.thawAbandoned(ctx) // before the sweep removes the records that tell
	s.Sweep(ctx)
	go func() {
		t := time.NewTicker(s.sweepInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				s.Sweep(ctx)
			}
		}
	}()
}

// Sweep removes the leftovers of killed processes from every pool
// (temporary records, lock files of deleted volumes, orphan images past
// their grace that hold no data) and logs what it found: orphans it keeps
// are reported every time, those with data loudly, since they are volumes
// whose record was lost. Until reclaimed, an orphan's space is used, and
// GetCapacity does not offer it. Then it counts the volumes whose health is
// abnormal (loopvol_volumes_abnormal).
func (s *Server) Sweep(ctx context.Context) {
	logger := klog.FromContext(ctx)
	// Moves that a killed process left and nobody retried first: finished
	// if the copy was durable, else rolled back (pool.SweepMoves). Before
	// the pools' own sweep, which would otherwise report the copy in the
	// target as an orphan image.
	for _, name := range s.poolNames {
		p := s.pools[name]
		m := p.SweepMoves(time.Now(), s.orphanGrace, s.peer)
		for _, err := range m.Errors {
			logger.Error(err, "Settling an interrupted move failed", "pool", p.Name)
		}
		for _, id := range m.Finished {
			logger.Info("Settled a move of a volume that a killed process left half-done", "volumeID", id.String())
		}
	}
	for _, name := range s.poolNames {
		p := s.pools[name]
		r, err := p.Sweep(time.Now(), s.orphanGrace)
		if err != nil {
			logger.Error(err, "Sweeping the pool failed", "pool", p.Name)
			continue
		}
		for _, err := range r.Errors {
			logger.Error(err, "Sweeping a pool entry failed", "pool", p.Name)
		}
		if len(r.Temporaries)+len(r.LockFiles) > 0 {
			logger.Info("Removed files that killed processes left", "pool", p.Name, "temporaries", r.Temporaries, "lockFiles", r.LockFiles)
		}
		for _, o := range r.Reclaimed {
			logger.Info("Reclaimed an orphan image", "pool", p.Name, "volumeID", o.ID.String(), "sizeBytes", o.SizeBytes, "age", o.Age.Round(time.Second).String())
		}
		for _, o := range r.Orphans {
			logOrphan(logger, p, o, s.orphanGrace)
		}
		for _, id := range r.UnfinishedSnapshots {
			logger.Info("Removed a snapshot whose CreateSnapshot died before it was whole and was not retried", "pool", p.Name, "snapshotID", id.String())
		}
		for _, id := range r.UnfinishedGroups {
			logger.Info("Removed a group snapshot whose CreateVolumeGroupSnapshot died before it was whole and was not retried", "pool", p.Name, "groupSnapshotID", id.String())
		}
	}
	s.countAbnormal(ctx)
}

func logOrphan(logger klog.Logger, p *pool.Pool, o pool.Orphan, grace time.Duration) {
	kv := []any{"pool", p.Name, "volumeID", o.ID.String(), "image", p.ImagePath(o.ID), "sizeBytes", o.SizeBytes, "age", o.Age.Round(time.Second).String()}
	if o.HasData {
		logger.Info("Kept an orphan image that holds data: its record is missing; restore the record, or remove the image by hand if its data is not wanted", kv...)
		return
	}
	logger.V(2).Info("Kept an orphan image younger than its grace", append(kv, "grace", grace.String())...)
}
