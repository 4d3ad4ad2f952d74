package attach

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

// TestRun runs the whole controller (informers, queues, workers) against a
// fake API server: a VolumeAttachment created after the start is attached
// once, deleting it detaches it, and Run returns nil when its context ends.
func TestRun(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(pvObj("pv1", "pool.vol1"), csiNodeObj(testNode, testNodeID))
	kubetest.Serve(client, kubetest.Options{})
	drv := &fakeCSI{FakeDriver: kubetest.FakeDriver[csiCall]{Caps: allCaps}}
	informers := kube.NewInformers(client, 0)
	c, err := New(Config{
		DriverName: driver, Client: client, Informers: informers, CSI: drv, Workers: 4,
		RetryIntervalStart: 10 * time.Millisecond, RetryIntervalMax: time.Second,
		ReconcileSync: time.Hour, Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	informers.Start(runCtx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()

	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	w, err := client.StorageV1().VolumeAttachments().Watch(wctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitFor := func(what string, cond func(*storagev1.VolumeAttachment) bool) {
		t.Helper()
		for {
			select {
			case ev := <-w.ResultChan():
				if va, ok := ev.Object.(*storagev1.VolumeAttachment); ok && cond(va) {
					return
				}
			case <-wctx.Done():
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}

	if _, err := client.StorageV1().VolumeAttachments().Create(ctx, vaObj("va1", "pv1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("va1 is attached", func(va *storagev1.VolumeAttachment) bool { return va.Status.Attached })

	va, err := client.StorageV1().VolumeAttachments().Get(ctx, "va1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deleting(va) // what the API server does on delete while a finalizer holds it
	if _, err := client.StorageV1().VolumeAttachments().Update(ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("va1 has no finalizer", func(va *storagev1.VolumeAttachment) bool {
		return va.DeletionTimestamp != nil && len(va.Finalizers) == 0
	})

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil after the context ended", err)
		}
	case <-wctx.Done():
		t.Fatal("Run did not return after its context ended")
	}
	kubetest.Diff(t, "CSI calls", map[string]int{"ControllerPublishVolume": 1, "ControllerUnpublishVolume": 1}, countCalls(drv.TakeCalls()))
}

func TestConfigValidate(t *testing.T) {
	valid := Config{
		DriverName: driver, Client: fake.NewClientset(), Informers: kube.NewInformers(fake.NewClientset(), 0), CSI: &fakeCSI{}, Workers: 1,
		RetryIntervalStart: time.Second, RetryIntervalMax: time.Minute,
	}
	tests := []struct {
		name   string
		modify func(*Config)
		want   string
	}{
		{name: "valid", modify: func(*Config) {}},
		{name: "no driver", modify: func(c *Config) { c.DriverName = "" }, want: "driver name"},
		{name: "no client", modify: func(c *Config) { c.Client = nil }, want: "Kubernetes client"},
		{name: "no CSI", modify: func(c *Config) { c.CSI = nil }, want: "CSI driver"},
		{name: "no workers", modify: func(c *Config) { c.Workers = 0 }, want: "workers"},
		{name: "no informers", modify: func(c *Config) { c.Informers = nil }, want: "shared informers"},
		{name: "no retry interval", modify: func(c *Config) { c.RetryIntervalStart = 0 }, want: "initial retry"},
		{name: "max below start", modify: func(c *Config) { c.RetryIntervalMax = time.Millisecond }, want: "maximum retry"},
		{name: "negative reconcile", modify: func(c *Config) { c.ReconcileSync = -time.Second }, want: "reconcile"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid
			tc.modify(&cfg)
			_, err := New(cfg)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("New: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("New = %v, want an error about %q", err, tc.want)
			}
		})
	}
}

// TestDriverBackRetriesAtOnce: an attach that failed while the driver was
// restarting (UNAVAILABLE) waits out an hour of backoff here; when the
// driver is ready again it is retried at once.
func TestDriverBackRetriesAtOnce(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(pvObj("pv1", "pool.vol1"), csiNodeObj(testNode, testNodeID))
	kubetest.Serve(client, kubetest.Options{})
	drv := &fakeCSI{FakeDriver: kubetest.FakeDriver[csiCall]{Caps: allCaps}, publishErr: status.Error(codes.Unavailable, "driver restarting")}
	informers := kube.NewInformers(client, 0)
	c, err := New(Config{
		DriverName: driver, Client: client, Informers: informers, CSI: drv, Workers: 1,
		RetryIntervalStart: time.Hour, RetryIntervalMax: time.Hour,
		ReconcileSync: time.Hour, Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	informers.Start(runCtx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() { stop(); <-done }()

	if _, err := client.StorageV1().VolumeAttachments().Create(ctx, vaObj("va1", "pv1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	publishes := func() int {
		drv.Lock()
		defer drv.Unlock()
		n := 0
		for _, c := range drv.Calls {
			if c.Method == "ControllerPublishVolume" {
				n++
			}
		}
		return n
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		if err := waitPoll(ctx, 30*time.Second, cond); err != nil {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
	wait("the first publish failed", func() bool { return publishes() == 1 && c.attachQ.Failing() == 1 })
	drv.Lock()
	drv.publishErr = nil
	drv.Unlock()
	drv.reconnect()
	wait("va1 is attached after the driver came back", func() bool {
		va, err := client.StorageV1().VolumeAttachments().Get(ctx, "va1", metav1.GetOptions{})
		return err == nil && va.Status.Attached
	})
	if n := publishes(); n != 2 {
		t.Errorf("%d ControllerPublishVolume calls, want 2 (the failed one and the retry)", n)
	}
}

// waitPoll polls cond every 10 ms until it holds or timeout passes.
func waitPoll(ctx context.Context, timeout time.Duration, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}
