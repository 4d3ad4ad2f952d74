package modify

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/loopvol/loopvol/internal/kube"
)

// modifyState is what the modify controller remembers between syncs, per
// claim key, besides its own writes (kube.ClaimQueue.Writes). Lost on a restart, as
// upstream's: every claim found InProgress is then uncertain, and an
// infeasible class is tried once more.
type modifyState struct {
	mu sync.Mutex
	// uncertainKeys: the last driver call of the claim ended without a
	// certain outcome (a timeout, ABORTED, ...), or a previous run left it
	// InProgress. Its target is kept until the driver answers for certain.
	uncertainKeys map[string]bool
	// infeasibleAt: when the claim's modification was last found
	// Infeasible (upstream's slow set): the driver is asked again with the
	// same class only RetryIntervalMax later.
	infeasibleAt map[string]time.Time
}

func newModifyState() *modifyState {
	return &modifyState{uncertainKeys: map[string]bool{}, infeasibleAt: map[string]time.Time{}}
}

func (s *modifyState) setUncertain(key string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on {
		s.uncertainKeys[key] = true
	} else {
		delete(s.uncertainKeys, key)
	}
}

func (s *modifyState) uncertain(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.uncertainKeys[key]
}

func (s *modifyState) setInfeasible(key string, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.infeasibleAt[key] = now
}

func (s *modifyState) clearInfeasible(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.infeasibleAt, key)
}

// recentlyInfeasible tells whether the claim's Infeasible modification is
// for the class it still asks for and was found so less than window ago;
// then it returns how long is left. A claim found Infeasible that this
// process has not seen fail (a restart) gets one try now. A claim that asks
// for another class is forgotten: the new class may work.
func (s *modifyState) recentlyInfeasible(key string, pvc *corev1.PersistentVolumeClaim, now time.Time, window time.Duration) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := pvc.Status.ModifyVolumeStatus
	if st == nil || pvc.Spec.VolumeAttributesClassName == nil || st.TargetVolumeAttributesClassName != *pvc.Spec.VolumeAttributesClassName {
		delete(s.infeasibleAt, key)
		return 0, false
	}
	if st.Status != corev1.PersistentVolumeClaimModifyVolumeInfeasible {
		return 0, false
	}
	at, ok := s.infeasibleAt[key]
	if ok && now.Sub(at) < window {
		return window - now.Sub(at), true
	}
	s.infeasibleAt[key] = now
	return 0, false
}

// drop forgets a deleted claim.
func (s *modifyState) drop(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.uncertainKeys, key)
	delete(s.infeasibleAt, key)
}

// metricNames are the modify controller's own metrics (kube.ClaimMetrics:
// modifications applied, failed ControllerModifyVolume attempts by gRPC
// code), next to the workqueue metrics of the queue named by QueueName.
var metricNames = kube.ClaimMetricNames{
	Done: "loopvol_resizer_modifies_total", Errors: "loopvol_resizer_modify_errors_total", Attempts: "Failed ControllerModifyVolume attempts",
	DoneHelp: "VolumeAttributesClass modifications applied: the driver accepted the class and the claim and its volume name it.",
}
