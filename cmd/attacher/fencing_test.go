package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestFencingFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--controllers=fencing"}, &bytes.Buffer{}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.fencing; got.period != 20*time.Second || got.taintOutOfService || !got.fenceByCopy {
		t.Errorf("fencing defaults = %+v, want a 20s period, no taint, copies allowed", got)
	}
	cfg, err = parseFlags([]string{"--controllers=fencing", "--fencing-period=45s", "--fencing-taint-out-of-service", "--fence-by-copy=false"}, &bytes.Buffer{}, noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.fencing; got.period != 45*time.Second || !got.taintOutOfService || got.fenceByCopy {
		t.Errorf("fencing flags = %+v", got)
	}
	for _, args := range [][]string{
		{"--controllers=fencing", "--fencing-period=1s"},
		{"--controllers=fencing", "--fencing-period=-3s"},
	} {
		if _, err := parseFlags(args, &bytes.Buffer{}, noEnv); err == nil || !strings.Contains(err.Error(), "--fencing-period") {
			t.Errorf("parseFlags(%v) = %v, want an error naming --fencing-period", args, err)
		}
	}
}
