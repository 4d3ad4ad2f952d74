package main

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"k8s.io/component-base/featuregate"
)

// TestModifyGate: external-resizer's VolumeAttributesClass gate is on by
// default and not explicitly set (the modify controller then probes the
// API); set either way, it is explicit.
func TestModifyGate(t *testing.T) {
	for _, tc := range []struct {
		args              []string
		enabled, explicit bool
	}{
		{args: []string{"--controllers=resizer"}, enabled: true, explicit: false},
		{args: []string{"--controllers=resizer", "--feature-gates=VolumeAttributesClass=true"}, enabled: true, explicit: true},
		{args: []string{"--controllers=resizer", "--feature-gates=VolumeAttributesClass=false"}, enabled: false, explicit: true},
	} {
		cfg, err := parseFlags(tc.args, &bytes.Buffer{}, noEnv)
		if err != nil {
			t.Fatalf("parseFlags(%q): %v", tc.args, err)
		}
		fg := cfg.compat.featureGates.fg
		g, ok := fg.(interface {
			ExplicitlySet(featuregate.Feature) bool
		})
		if !ok {
			t.Fatal("the feature gate cannot tell whether a gate was set explicitly")
		}
		if got := fg.Enabled(volumeAttributesClassGate); got != tc.enabled {
			t.Errorf("%q: enabled %v, want %v", tc.args, got, tc.enabled)
		}
		if got := g.ExplicitlySet(volumeAttributesClassGate); got != tc.explicit {
			t.Errorf("%q: explicitly set %v, want %v", tc.args, got, tc.explicit)
		}
	}
}

// TestRunTogether: a run func that returns nil early leaves the other
// running until the context ends; one that fails stops the other.
func TestRunTogether(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	untilDone := func(ctx context.Context) error { <-ctx.Done(); return nil }
	early := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- runTogether(ctx, untilDone, func(context.Context) error { close(early); return nil })
	}()
	<-early
	select {
	case err := <-done:
		t.Fatalf("runTogether returned (%v) when one func ended early", err)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("runTogether after the context ended: %v", err)
	}
	boom := errors.New("boom")
	err := runTogether(context.Background(), untilDone, func(context.Context) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("runTogether with a failing func: %v", err)
	}
}
