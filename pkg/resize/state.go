package resize

import (
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// claimState is what the controller remembers between syncs, per claim key
// (namespace/name) unless said otherwise. Nothing here is needed for
// correctness after a restart: it only saves API reads and driver calls.
type claimState struct {
	mu sync.Mutex
	// written holds the resourceVersions of the controller's last writes
	// of a claim or (keyed "pv/<name>") a volume, oldest first: a cached
	// copy older than the last has not seen that write yet, and an update
	// event that brings one of them is the controller's own write coming
	// back. One sync writes a claim up to twice before the watch delivers
	// the first, so more than the last one is kept.
	written map[string][]string
	// finalError holds the claims whose last driver call ended in a final
	// error: the driver is certainly not working on it any more, so the
	// claim's (possibly lowered) request may be tried instead.
	finalError map[string]bool
	// inUse holds the claims (by UID) whose last driver call failed with
	// FAILED_PRECONDITION: a driver that expands only unpublished volumes
	// refused it because it was in use.
	inUse map[string]bool
	// live holds the claims whose next sync must read them from the API
	// server: a write of the controller's failed on a conflict, so the
	// cache may be behind someone else's write.
	live map[string]bool
	// inFlight holds the claims being synced, each with the
	// resourceVersions of the update events that arrived meanwhile and
	// would queue it unless they are the sync's own writes: the watch may
	// deliver a write before the patch call returns its resourceVersion.
	inFlight map[string][]string
}

func newClaimState() *claimState {
	return &claimState{written: map[string][]string{}, finalError: map[string]bool{}, inUse: map[string]bool{}, live: map[string]bool{}, inFlight: map[string][]string{}}
}

func pvKey(name string) string { return "pv/" + name }

// keptWrites bounds how many of its own writes of one object the
// controller recognises.
const keptWrites = 4

func (s *claimState) recordWrite(key, rv string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := append(s.written[key], rv)
	if len(w) > keptWrites {
		w = w[len(w)-keptWrites:]
	}
	s.written[key] = w
}

// ownWrite tells whether rv is a version one of the controller's recent
// writes of key produced.
func (s *claimState) ownWrite(key, rv string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.written[key], rv)
}

// begin records that a sync of key starts.
func (s *claimState) begin(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inFlight[key] = nil
}

// deferEvent holds back an update event (its resourceVersion rv) of a claim
// being synced, and tells whether it did.
func (s *claimState) deferEvent(key, rv string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	events, ok := s.inFlight[key]
	if ok {
		s.inFlight[key] = append(events, rv)
	}
	return ok
}

// end records that the sync of key is over, and tells whether an event
// held back meanwhile was someone else's write (the claim must be synced
// again).
func (s *claimState) end(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	events := s.inFlight[key]
	delete(s.inFlight, key)
	for _, rv := range events {
		if !slices.Contains(s.written[key], rv) {
			return true
		}
	}
	return false
}

// readLive records that the next sync of key must read it from the API
// server.
func (s *claimState) readLive(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live[key] = true
}

// stale tells whether rv, a cached resourceVersion of key, is older than
// the controller's last write of key, or key was marked with readLive
// (once). Versions that do not compare are never stale.
func (s *claimState) stale(key, rv string) bool {
	s.mu.Lock()
	w := s.written[key]
	if s.live[key] {
		delete(s.live, key)
		s.mu.Unlock()
		return true
	}
	s.mu.Unlock()
	if len(w) == 0 {
		return false
	}
	cmp, err := resourceversion.CompareResourceVersion(rv, w[len(w)-1])
	return err == nil && cmp < 0
}

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

// drop forgets a deleted claim.
func (s *claimState) drop(key, uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.written, key)
	delete(s.finalError, key)
	delete(s.inUse, uid)
	delete(s.live, key)
}

// dropVolume forgets a deleted volume.
func (s *claimState) dropVolume(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.written, pvKey(name))
}
