package kube_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/claimtest"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

// queueFixture is a ClaimQueue whose controller sync is sync (nil: none)
// and whose update filter says wants.
func queueFixture(t *testing.T, objs []runtime.Object, wants bool, sync func(context.Context, string) error) (*claimtest.Fixture, *kube.ClaimQueue, *[]string) {
	f, q, forgotten, _ := queueWithInformers(t, objs, wants, sync)
	return f, q, forgotten
}

func queueWithInformers(t *testing.T, objs []runtime.Object, wants bool, sync func(context.Context, string) error) (*claimtest.Fixture, *kube.ClaimQueue, *[]string, *kube.Informers) {
	f := claimtest.New(t, objs)
	var forgotten []string
	inf := kube.NewInformers(f.Client, 0)
	q, err := kube.NewClaimQueue(kube.ClaimQueueConfig{
		ClaimConfig: kube.ClaimConfig{DriverName: claimtest.Driver, Client: f.Client, Informers: inf, Recorder: f.Recorder,
			RetryIntervalStart: time.Second, RetryIntervalMax: time.Minute},
		Controller: "test", Name: "test-pvc",
		Metrics: kube.ClaimMetricNames{Done: "done_total", Errors: "errors_total"},
		Ready:   func(ctx context.Context) error { return ctx.Err() },
		Sync: func(ctx context.Context, key string) error {
			if sync == nil {
				return nil
			}
			return sync(ctx, key)
		},
		Wants:  func(old, pvc *corev1.PersistentVolumeClaim) bool { return wants },
		Forget: func(key string, _ *corev1.PersistentVolumeClaim) { forgotten = append(forgotten, key) },
	})
	if err != nil {
		t.Fatal(err)
	}
	f.Use(q)
	return f, q, &forgotten, inf
}

// TestClaimQueueUpdates: which claim updates queue the claim: a resync
// always, the controller's own write never, others as the controller's
// filter says; an update during a sync waits for its end.
func TestClaimQueueUpdates(t *testing.T) {
	base := claimtest.Claim("a", "1Gi", "1Gi")
	newer := func(rv string) *corev1.PersistentVolumeClaim {
		p := base.DeepCopy()
		p.ResourceVersion = rv
		return p
	}
	for _, tc := range []struct {
		name  string
		pvc   *corev1.PersistentVolumeClaim
		own   bool
		wants bool
		want  bool
	}{
		{name: "resync, filter says no → queued", pvc: newer("1"), want: true},
		{name: "someone's update, filter says yes → queued", pvc: newer("2"), wants: true, want: true},
		{name: "someone's update, filter says no → not queued", pvc: newer("2")},
		{name: "own write, filter says yes → not queued", pvc: newer("2"), own: true, wants: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, q, _ := queueFixture(t, nil, tc.wants, nil)
			if tc.own {
				q.Writes.Record(kube.ClaimKey(tc.pvc), tc.pvc.ResourceVersion, claimtest.Now)
			}
			q.ClaimUpdated(base, tc.pvc)
			if got := q.Queue.Q.Len() == 1; got != tc.want {
				t.Errorf("queued = %v, want %v", got, tc.want)
			}
		})
	}

	t.Run("updates during a sync", func(t *testing.T) {
		var during func()
		f, q, _ := queueFixture(t, []runtime.Object{base}, true, func(context.Context, string) error {
			during()
			return nil
		})
		key := kube.ClaimKey(base)
		// The sync's own write arrives before its answer: held, then
		// dropped as the sync's own.
		during = func() {
			q.ClaimUpdated(base, newer("5"))
			q.Writes.Record(key, "5", claimtest.Now)
			if n := q.Queue.Q.Len(); n != 0 {
				t.Errorf("an update during the sync was not held (queue length %d)", n)
			}
		}
		q.Queue.Q.Add(key)
		f.Next()
		kubetest.Diff(t, "queue length after the sync's own write", 0, q.Queue.Q.Len())
		// Someone else's update during the sync: the claim is synced again.
		during = func() { q.ClaimUpdated(base, newer("6")) }
		q.Queue.Q.Add(key)
		f.Next()
		kubetest.Diff(t, "queue length after someone's write", 1, q.Queue.Q.Len())
	})
}

// TestClaimQueueDeleteAndVolumes: a deleted claim is forgotten and queued,
// a deleted volume forgotten; a new volume of the driver queues its claim, another driver's does not.
func TestClaimQueueDeleteAndVolumes(t *testing.T) {
	pvc := claimtest.Claim("a", "1Gi", "1Gi")
	f, q, forgotten, inf := queueWithInformers(t, nil, true, nil)
	q.Writes.Record("apps/a", "5", claimtest.Now)
	q.ClaimDeleted(cache.DeletedFinalStateUnknown{Key: "apps/a", Obj: pvc})
	kubetest.Diff(t, "forgotten", []string{"apps/a"}, *forgotten)
	kubetest.Diff(t, "own writes after the delete", 0, q.Writes.Len())
	kubetest.Diff(t, "queued", 1, q.Queue.Q.Len())
	f.Drain()
	q.Writes.Record(kube.VolumeKey("pv-a"), "6", claimtest.Now)
	q.VolumeDeleted(cache.DeletedFinalStateUnknown{Key: "pv-a", Obj: claimtest.Volume("a", "1Gi")})
	kubetest.Diff(t, "own writes after the volume's delete", 0, q.Writes.Len())

	// Run's handlers see the volumes in the informers' first list.
	for _, pv := range []*corev1.PersistentVolume{claimtest.Volume("a", "1Gi"), claimtest.Volume("b", "1Gi", claimtest.OfDriver("other.csi.io"))} {
		if err := f.Client.Tracker().Add(pv); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(f.Ctx)
	defer cancel()
	synced, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- q.Run(ctx, func(*kube.Handlers) error { inf.Start(ctx); return nil }, func(klog.Logger) { close(synced) })
	}()
	select {
	case <-synced:
	case <-time.After(time.Minute):
		t.Fatal("the caches never synced")
	}
	kubetest.Diff(t, "claims queued by new volumes", 1, q.Queue.Q.Len())
	if key, _ := q.Queue.Q.Get(); key != "apps/a" {
		t.Errorf("queued %q, want the claim of the driver's volume", key)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestClaimRead: a sync reads the claim from the cache, or live when the
// cache has not seen the controller's last write; a gone or unbound claim
// is nil; a bad key is permanent.
func TestClaimRead(t *testing.T) {
	bound, unbound := claimtest.Claim("a", "1Gi", "1Gi"), claimtest.Claim("b", "1Gi", "1Gi")
	unbound.Spec.VolumeName = ""
	f, q, _ := queueFixture(t, []runtime.Object{bound, unbound}, true, nil)
	ctx := f.Ctx

	if got, err := q.Claim(ctx, "apps/a"); err != nil || got == nil {
		t.Fatalf("Claim from the cache = %v, %v", got, err)
	}
	kubetest.Diff(t, "requests of a cached read", []kubetest.Action(nil), f.Actions())
	if got, err := q.Claim(ctx, "apps/b"); err != nil || got != nil {
		t.Errorf("Claim of an unbound claim = %v, %v; want nil", got, err)
	}
	if got, err := q.Claim(ctx, "apps/gone"); err != nil || got != nil {
		t.Errorf("Claim of a gone claim = %v, %v; want nil", got, err)
	}
	if _, err := q.Claim(ctx, "a/b/c"); !kube.IsFinal(err) {
		t.Errorf("Claim of a bad key = %v, want a permanent error", err)
	}
	q.Writes.Record("apps/a", "7", claimtest.Now)
	if _, err := q.Claim(ctx, "apps/a"); err != nil {
		t.Fatal(err)
	}
	kubetest.Diff(t, "requests of a stale read", []kubetest.Action{claimtest.Get("persistentvolumeclaims", claimtest.Namespace, "a")}, f.Actions())
}

// TestClaimAndVolume: the claim and its volume of the driver; nothing for
// a claim the controller does not want (its volume unread), for a missing
// volume and for another driver's.
func TestClaimAndVolume(t *testing.T) {
	objs := []runtime.Object{
		claimtest.Claim("a", "1Gi", "1Gi"), claimtest.Volume("a", "1Gi"),
		claimtest.Claim("b", "1Gi", "1Gi"), claimtest.Volume("b", "1Gi", claimtest.OfDriver("other.csi.io")),
		claimtest.Claim("c", "1Gi", "1Gi"),
	}
	f, q, _ := queueFixture(t, objs, true, nil)
	if pvc, pv, err := q.ClaimAndVolume(f.Ctx, "apps/a", nil); err != nil || pvc == nil || pv == nil || pv.Name != "pv-a" {
		t.Errorf("ClaimAndVolume(a) = %v, %v, %v", pvc, pv, err)
	}
	for _, tc := range []struct {
		key  string
		want func(*corev1.PersistentVolumeClaim) bool
		acts []kubetest.Action
	}{
		{key: "apps/a", want: func(*corev1.PersistentVolumeClaim) bool { return false }},
		{key: "apps/b"},
		{key: "apps/c", acts: []kubetest.Action{claimtest.Get("persistentvolumes", "", "pv-c")}},
	} {
		if pvc, pv, err := q.ClaimAndVolume(f.Ctx, tc.key, tc.want); err != nil || pvc != nil || pv != nil {
			t.Errorf("ClaimAndVolume(%s) = %v, %v, %v; want nothing", tc.key, pvc, pv, err)
		}
		kubetest.Diff(t, "requests for "+tc.key, tc.acts, f.Actions())
	}
}

// TestPatchClaimStatus: nothing to write → no request; a write is recorded
// as the controller's own; a conflict is retried on the live claim only
// for an outcome (onLive), and otherwise makes the next read live.
func TestPatchClaimStatus(t *testing.T) {
	setPhase := func(p *corev1.PersistentVolumeClaim) { p.Status.Phase = corev1.ClaimLost }
	phasePatch := func(old, new *corev1.PersistentVolumeClaim) []byte {
		if old.Status.Phase == new.Status.Phase {
			return nil
		}
		return kube.MustJSON(map[string]any{"metadata": map[string]any{"resourceVersion": old.ResourceVersion}, "status": map[string]any{"phase": new.Status.Phase}})
	}
	statusPatch := claimtest.ClaimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"phase":"Lost"}}`)
	live := claimtest.Get("persistentvolumeclaims", claimtest.Namespace, "a")
	for _, tc := range []struct {
		name      string
		someone   bool // someone else wrote the claim: the cached copy is stale
		onLive    bool
		wantErr   bool
		wantActs  []kubetest.Action
		wantStale bool
	}{
		{name: "current copy → written", wantActs: []kubetest.Action{statusPatch}},
		{name: "stale copy, an outcome → written on the live claim", someone: true, onLive: true, wantActs: []kubetest.Action{statusPatch, live, statusPatch}},
		{name: "stale copy, a decision → conflict, next read live", someone: true, wantErr: true, wantActs: []kubetest.Action{statusPatch}, wantStale: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pvc := claimtest.Claim("a", "1Gi", "1Gi")
			f, q, _ := queueFixture(t, []runtime.Object{pvc}, true, nil)
			if tc.someone {
				f.SetClaim("a", func(p *corev1.PersistentVolumeClaim) { p.Labels = map[string]string{"x": "y"} })
				f.Actions()
			}
			out, err := q.PatchClaimStatus(f.Ctx, pvc, tc.onLive, setPhase, phasePatch)
			if (err != nil) != tc.wantErr || (err != nil && !apierrors.IsConflict(err)) {
				t.Fatalf("PatchClaimStatus: %v, want error %v (a conflict)", err, tc.wantErr)
			}
			kubetest.Diff(t, "requests", tc.wantActs, f.Actions())
			if err == nil && !q.Writes.Own("apps/a", out.ResourceVersion) {
				t.Errorf("the write %s is not recorded as the controller's own", out.ResourceVersion)
			}
			if got := q.Writes.Stale("apps/a", f.PVC("a").ResourceVersion); got != tc.wantStale {
				t.Errorf("next read live = %v, want %v", got, tc.wantStale)
			}
			if tc.wantErr {
				return
			}
			if out, err := q.PatchClaimStatus(f.Ctx, out, false, setPhase, phasePatch); err != nil || out.Status.Phase != corev1.ClaimLost {
				t.Errorf("a patch with nothing to change: %v", err)
			}
			kubetest.Diff(t, "requests of a patch with nothing to change", []kubetest.Action(nil), f.Actions())
		})
	}
}
