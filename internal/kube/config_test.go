package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"
)

func TestValidateController(t *testing.T) {
	client := fake.NewClientset()
	inf := NewInformers(client, 0)
	for _, tc := range []struct {
		name      string
		driver    string
		client    Client
		informers *Informers
		csi       any
		workers   int
		start     time.Duration
		want      string
	}{
		{name: "valid", driver: "d", client: client, informers: inf, csi: "driver", workers: 1, start: time.Second},
		{name: "no driver connection", driver: "d", client: client, informers: inf, workers: 1, start: time.Second, want: "CSI driver"},
		{name: "no driver", client: client, informers: inf, csi: "driver", workers: 1, start: time.Second, want: "driver name"},
		{name: "no client", driver: "d", informers: inf, csi: "driver", workers: 1, start: time.Second, want: "Kubernetes client"},
		{name: "no informers", driver: "d", client: client, csi: "driver", workers: 1, start: time.Second, want: "shared informers"},
		{name: "no workers", driver: "d", client: client, informers: inf, csi: "driver", start: time.Second, want: "workers"},
		{name: "no backoff", driver: "d", client: client, informers: inf, csi: "driver", workers: 1, want: "initial retry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateController(tc.driver, tc.client, tc.informers, tc.csi, tc.workers, tc.start, time.Minute)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("ValidateController = %v, want an error about %q", err, tc.want)
			}
		})
	}
}

// TestEvery: the first call comes after one period, one per period, none
// after the context ended.
func TestEvery(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan struct{}, 10)
	done := make(chan struct{})
	go func() {
		Every(ctx, clk, time.Minute, func() { calls <- struct{}{} })
		close(done)
	}()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	if len(calls) != 0 {
		t.Fatal("called before the first period passed")
	}
	for range 2 {
		clk.Step(time.Minute)
		<-calls
	}
	cancel()
	<-done
}
