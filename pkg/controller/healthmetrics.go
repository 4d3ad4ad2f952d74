package controller

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/pkg/pool"
)

// abnormalVolumes is what ControllerGetVolume and ListVolumes would say of
// every volume (health), counted at each sweep, so that an alert sees a
// volume whose record or image went wrong without anyone asking for it.
var abnormalVolumes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "loopvol_volumes_abnormal",
	Help: "Volumes whose record or image is abnormal (the condition ControllerGetVolume reports), by home pool and reason, as the controller's last sweep found them.",
}, []string{"pool", "reason"})

// healthReasons are the reasons health reports, each given a series (0
// when no volume has it) so that a pool's gauge exists before anything
// goes wrong.
var healthReasons = []string{
	reasonRecordCorrupt, reasonRecordUnreadable, reasonImageMissing, reasonImageUntrusted,
	reasonImageUnreadable, reasonImageTruncated, reasonModifyPending,
}

// countAbnormal checks every volume of every pool as health does and sets
// abnormalVolumes. A pool whose volumes cannot be listed keeps its last
// figures (logged: the next sweep tries again).
func (s *Server) countAbnormal(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, name := range s.poolNames {
		p := s.pools[name]
		ids, err := p.ListVolumeIDs()
		if err != nil {
			logger.Error(err, "Could not list a pool's volumes to check their health; its abnormal-volume figures stay as they were", "pool", p.Name)
			continue
		}
		counts := map[string]int{}
		for _, id := range ids {
			h, err := s.health(p, id)
			if errors.Is(err, pool.ErrNotFound) || errors.Is(err, pool.ErrGuest) || h == nil {
				continue // deleted since the listing, or not this pool's
			}
			for _, st := range h.HealthStatuses {
				counts[st.Reason]++
			}
		}
		for _, r := range healthReasons {
			abnormalVolumes.WithLabelValues(p.Name, r).Set(float64(counts[r]))
		}
	}
}
