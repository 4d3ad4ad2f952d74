package leasewatch

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
)

func testConfig(client *fake.Clientset, id string) Config {
	return Config{
		Leases:        client.CoordinationV1(),
		Namespace:     "kube-system",
		Name:          "external-attacher-leader-loopvol-csi-io",
		Identity:      id,
		LeaseDuration: 3 * time.Second,
		RenewDeadline: 2 * time.Second,
		RetryPeriod:   100 * time.Millisecond,
	}
}

func TestRunThenReleasesTheLease(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	started := make(chan struct{})
	var controllersStopped time.Time
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, testConfig(client, "me"), func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			controllersStopped = time.Now()
			return nil
		})
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the controllers never started")
	}
	lease, err := client.CoordinationV1().Leases("kube-system").Get(ctx, "external-attacher-leader-loopvol-csi-io", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity != "me" {
		t.Fatalf("Lease = %+v, %v; want it held by me", lease, err)
	}

	stop() // SIGTERM
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil after a signal", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the signal")
	}
	if controllersStopped.IsZero() {
		t.Error("returned before the controllers stopped")
	}
	lease, err = client.CoordinationV1().Leases("kube-system").Get(context.Background(), "external-attacher-leader-loopvol-csi-io", metav1.GetOptions{})
	if err != nil || (lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity != "") {
		t.Errorf("Lease after stop = %+v, %v; want it released so another replica takes over at once", lease.Spec, err)
	}
}

func TestRunLostLeaseIsAnError(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	var partitioned atomic.Bool
	client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if partitioned.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, testConfig(client, "me"), func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return nil
		})
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the controllers never started")
	}
	// The API server stops taking renewals (a network partition): after the
	// renew deadline the Lease is lost.
	partitioned.Store(true)
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "lost the leader-election Lease kube-system/external-attacher-leader-loopvol-csi-io") {
			t.Errorf("Run = %v, want the lost Lease", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not notice the lost Lease")
	}
}

// TestHealthWhileLeading: the watchdog of a Lease being renewed passes, and
// so does a Health that watches no Lease.
func TestHealthWhileLeading(t *testing.T) {
	var none Health
	if err := none.Check(); err != nil {
		t.Errorf("Health of no Lease: %v", err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, stop := context.WithCancel(ctx)
	var h Health
	cfg := testConfig(fake.NewClientset(), "me")
	cfg.Health = h.Add()
	checked := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, cfg, func(ctx context.Context) error {
			checked <- h.Check()
			<-ctx.Done()
			return nil
		})
	}()
	select {
	case err := <-checked:
		if err != nil {
			t.Errorf("Health while leading: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the controllers never started")
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run = %v after the signal", err)
	}
}
