package kube

import (
	"testing"
	"time"
)

func TestWrites(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	w := NewWrites[string](2)
	if w.Stale("a", "5") || w.Own("a", "5") {
		t.Fatal("an unknown key is stale or owned")
	}
	w.Record("a", "6", at)
	w.Record("a", "7", at.Add(time.Second))
	w.Record("a", "8", at.Add(2*time.Second))
	if rv, when := w.Last("a"); rv != "8" || !when.Equal(at.Add(2*time.Second)) {
		t.Errorf("Last = %s at %s, want 8 at the third write", rv, when)
	}
	for rv, want := range map[string]bool{"6": false, "7": true, "8": true, "9": false} {
		if got := w.Own("a", rv); got != want {
			t.Errorf("Own(%s) = %v, want %v (the last two writes)", rv, got, want)
		}
	}
	for rv, want := range map[string]bool{"7": true, "8": false, "9": false, "x": false} {
		if got := w.Stale("a", rv); got != want {
			t.Errorf("Stale(%s) = %v, want %v (older than the last write)", rv, got, want)
		}
	}
	w.Invalidate("a")
	if !w.Stale("a", "9") || w.Stale("a", "9") {
		t.Error("Invalidate did not make exactly the next Stale true")
	}

	w.Begin("a")
	if !w.Hold("a", "8") || w.Hold("b", "1") {
		t.Error("Hold holds events of keys being synced only")
	}
	if w.End("a") {
		t.Error("End: an own write held counts as someone else's")
	}
	w.Begin("a")
	w.Hold("a", "10")
	if !w.End("a") || w.Hold("a", "11") {
		t.Error("End: someone else's write held is not reported, or events are still held")
	}

	w.Forget("a")
	if w.Len() != 0 || w.Own("a", "8") {
		t.Error("Forget left the key's writes")
	}
}
