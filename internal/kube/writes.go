package kube

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// Writes is a controller's memory of its own writes, per object key: the
// resourceVersions the last few writes produced and when the last one was
// made. It is the one own-write tracker of the controllers, and it answers
// what each of them needs to know about a cached object:
//
//   - Stale: the cache has not seen the last write yet. A sync that
//     decided on that copy would act twice (a second driver call, a write
//     that fails its precondition), so it reads the live object instead.
//   - Own: an update event is the controller's own write coming back, not
//     a change by someone else; queuing it would cut the object's backoff
//     short.
//   - Begin, Hold and End: an update event that arrives while the object
//     is being synced may be a write of that sync whose answer has not
//     come yet (the watch can be faster); it is held until the sync ends
//     and then judged.
//
// Nothing in it is needed for correctness after a restart: it saves API
// reads and repeated work. Keys of objects that are gone must be
// forgotten (Forget) by the delete handler.
type Writes[K comparable] struct {
	keep int

	mu      sync.Mutex
	written map[K]*written
	live    map[K]bool     // the next Stale is true: a write conflicted
	held    map[K][]string // keys being synced → versions of events held
}

type written struct {
	versions []string // oldest first, at most keep
	at       time.Time
}

// NewWrites returns an empty tracker that remembers the last keep writes
// of each object (at least one). One sync may write an object more than
// once before the watch delivers the first write; keep bounds how many of
// them Own recognises.
func NewWrites[K comparable](keep int) *Writes[K] {
	return &Writes[K]{keep: max(keep, 1), written: map[K]*written{}, live: map[K]bool{}, held: map[K][]string{}}
}

// Record notes that a write of key, made at at, produced resourceVersion
// rv.
func (w *Writes[K]) Record(key K, rv string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.written[key]
	if r == nil {
		r = &written{}
		w.written[key] = r
	}
	r.versions = append(r.versions, rv)
	if len(r.versions) > w.keep {
		r.versions = slices.Delete(r.versions, 0, len(r.versions)-w.keep)
	}
	r.at = at
}

// Last returns the resourceVersion of the last recorded write of key and
// when it was made ("" and the zero time if none).
func (w *Writes[K]) Last(key K) (string, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.written[key]
	if r == nil {
		return "", time.Time{}
	}
	return r.versions[len(r.versions)-1], r.at
}

// Own reports whether rv is the version one of the recorded writes of key
// produced.
func (w *Writes[K]) Own(key K, rv string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.written[key]
	return r != nil && slices.Contains(r.versions, rv)
}

// Stale reports whether rv, the resourceVersion of a cached copy of key,
// is older than the last recorded write of key, or whether Invalidate
// asked for one read of the live object (that request is used up).
// Versions that do not compare as integers are never older.
func (w *Writes[K]) Stale(key K, rv string) bool {
	w.mu.Lock()
	if w.live[key] {
		delete(w.live, key)
		w.mu.Unlock()
		return true
	}
	r := w.written[key]
	w.mu.Unlock()
	if r == nil {
		return false
	}
	cmp, err := resourceversion.CompareResourceVersion(rv, r.versions[len(r.versions)-1])
	return err == nil && cmp < 0
}

// Invalidate makes the next Stale of key true whatever the version: a
// write failed on a conflict, so the cache may lag behind someone else's
// write that no recorded version reveals.
func (w *Writes[K]) Invalidate(key K) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.live[key] = true
}

// Begin notes that a sync of key starts: update events of key are held
// (Hold) until End.
func (w *Writes[K]) Begin(key K) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held[key] = nil
}

// Hold keeps back an update event of key (its resourceVersion rv) while
// key is being synced, and reports whether it did.
func (w *Writes[K]) Hold(key K, rv string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	events, ok := w.held[key]
	if ok {
		w.held[key] = append(events, rv)
	}
	return ok
}

// End notes that the sync of key is over and reports whether an event
// held meanwhile was not one of the recorded writes: someone else changed
// the object, which must be synced again.
func (w *Writes[K]) End(key K) bool {
	w.mu.Lock()
	events := w.held[key]
	delete(w.held, key)
	w.mu.Unlock()
	for _, rv := range events {
		if !w.Own(key, rv) {
			return true
		}
	}
	return false
}

// Forget drops everything recorded of key: its object is gone.
func (w *Writes[K]) Forget(key K) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.written, key)
	delete(w.live, key)
}

// Len is how many objects have recorded writes.
func (w *Writes[K]) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.written)
}
