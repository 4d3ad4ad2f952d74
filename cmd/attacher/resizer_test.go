package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestResizerFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    resizerConfig
		wantErr string
	}{
		{name: "defaults: in-use errors handled, workers and resync from the common flags", args: []string{"--controllers=resizer"},
			want: resizerConfig{handleVolumeInUseError: true}},
		{name: "external-resizer's names", args: []string{"--controllers=resizer", "--workers=3", "--resync-period=2m", "--handle-volume-inuse-error=false", "--extra-modify-metadata"},
			want: resizerConfig{workers: 3, resyncPeriod: 2 * time.Minute, extraModifyMetadata: true}},
		{name: "negative workers", args: []string{"--controllers=resizer", "--workers=-1"}, wantErr: "--workers must not be negative"},
		{name: "negative resync period", args: []string{"--controllers=resizer", "--resync-period=-1s"}, wantErr: "--resync-period must not be negative"},
		{name: "unchecked when the resizer does not run", args: []string{"--controllers=attach", "--workers=-1"},
			want: resizerConfig{handleVolumeInUseError: true, workers: -1}},
		{name: "with --node-deployment", args: []string{"--controllers=resizer", "--node-deployment", "--node-name=n1"},
			want: resizerConfig{handleVolumeInUseError: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseFlags(tc.args, &bytes.Buffer{}, noEnv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseFlags(%q) = %v, want an error containing %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if cfg.resizer != tc.want {
				t.Errorf("resizer flags %+v, want %+v", cfg.resizer, tc.want)
			}
		})
	}
}

// TestResizerAnnotateFsResize: the upstream gate is on by default and can be
// turned off.
func TestResizerAnnotateFsResize(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{args: []string{"--controllers=resizer"}, want: true},
		{args: []string{"--controllers=resizer", "--feature-gates=AnnotateFsResize=false"}, want: false},
	} {
		cfg, err := parseFlags(tc.args, &bytes.Buffer{}, noEnv)
		if err != nil {
			t.Fatalf("parseFlags(%q): %v", tc.args, err)
		}
		if got := cfg.compat.featureGates.fg.Enabled("AnnotateFsResize"); got != tc.want {
			t.Errorf("%q: AnnotateFsResize %v, want %v", tc.args, got, tc.want)
		}
	}
}
