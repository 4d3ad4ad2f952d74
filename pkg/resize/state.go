package resize

import (
	"sync"

	"github.com/loopvol/loopvol/internal/kube"
)

// claimState is what the controller remembers between syncs, per claim key
// (namespace/name) unless said otherwise. Nothing here is needed for
// correctness after a restart: it only saves API reads and driver calls.
type claimState struct {
	// writes are the controller's own writes of claims (by claim key) and
	// volumes (by kube.VolumeKey), the one tracker of kube.Writes, shared
	// with the claim queue (kube.ClaimQueueConfig.Writes): a cached copy
	// older than the last has not seen that write yet, and an update event
	// that brings one of them is the controller's own write coming back.
	// One sync writes a claim up to twice before the watch delivers the
	// first, so more than the last one is kept (keptWrites). An update
	// event of a claim being synced is held until the sync ends (the
	// watch may deliver a write before the patch call returns its
	// resourceVersion), and a claim whose write conflicted is read live
	// at its next sync.
	writes *kube.Writes[string]

	mu sync.Mutex
	// finalError holds the claims whose last driver call ended in a final
	// error: the driver is certainly not working on it any more, so the
	// claim's (possibly lowered) request may be tried instead.
	finalError map[string]bool
	// inUse holds the claims (by UID) whose last driver call failed with
	// FAILED_PRECONDITION: a driver that expands only unpublished volumes
	// refused it because it was in use.
	inUse map[string]bool
}

func newClaimState() *claimState {
	return &claimState{writes: kube.NewWrites[string](keptWrites), finalError: map[string]bool{}, inUse: map[string]bool{}}
}

// keptWrites bounds how many of its own writes of one object the
// controller recognises.
const keptWrites = 4

func (s *claimState) setFinalError(key string, final bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if final {
		s.finalError[key] = true
	} else {
		delete(s.finalError, key)
	}
}

func (s *claimState) hasFinalError(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finalError[key]
}

func (s *claimState) setInUse(uid string, inUse bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if inUse {
		s.inUse[uid] = true
	} else {
		delete(s.inUse, uid)
	}
}

func (s *claimState) hadInUseError(uid string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inUse[uid]
}

// drop forgets a deleted claim; the claim queue forgets its writes.
func (s *claimState) drop(key, uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.finalError, key)
	delete(s.inUse, uid)
}
