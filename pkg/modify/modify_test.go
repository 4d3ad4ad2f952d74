package modify

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	"github.com/loopvol/loopvol/internal/kube"
	"github.com/loopvol/loopvol/internal/kube/claimtest"
	"github.com/loopvol/loopvol/internal/kube/kubetest"
)

// The names are written out as Kubernetes and the upstream external-resizer
// spell them.
const (
	thick = "thick"
	thin  = "thin"
)

var (
	thickParams = map[string]string{"preallocate": "true"}
	thinParams  = map[string]string{"preallocate": "false"}
)

// boundThin is claim a, which has class thin and asks for want, and its
// volume, also thin.
func boundThin(want string, opts ...func(*corev1.PersistentVolumeClaim)) []runtime.Object {
	return []runtime.Object{
		claimtest.Claim("a", "1Gi", "1Gi", append([]func(*corev1.PersistentVolumeClaim){wantsClass(want), hasClass(thin)}, opts...)...),
		claimtest.Volume("a", "1Gi", volumeClass(thin)),
		class(thin, thinParams),
		class(thick, thickParams),
	}
}

// modifyingCondition is the ModifyingVolume condition as a JSON patch
// element with the test's clock.
func modifyingCondition(msg string) string {
	return fmt.Sprintf(`{"type":"ModifyingVolume","status":"True","lastProbeTime":%q,"lastTransitionTime":%q,"message":%q}`, claimtest.TimeJSON, claimtest.TimeJSON, msg)
}

func modifyErrorCondition(reason, msg string) string {
	return fmt.Sprintf(`{"type":"ModifyVolumeError","status":"True","lastProbeTime":%q,"lastTransitionTime":%q,"reason":%q,"message":%q}`, claimtest.TimeJSON, claimtest.TimeJSON, reason, msg)
}

// TestModify: a claim whose class changed is modified, and the outcome
// recorded on the claim and its volume, with upstream's names, in the
// order upstream writes them.
func TestModify(t *testing.T) {
	f := newFixture(t, boundThin(thick))
	f.QueueAll()
	f.Drain()

	kubetest.Diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.TakeCalls())
	kubetest.Diff(t, "API actions", []kubetest.Action{
		claimtest.ClaimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":{"targetVolumeAttributesClassName":"thick","status":"InProgress"},`+
			`"conditions":[`+modifyingCondition(`Modifying volume to "thick" is in progress.`)+`]}}`),
		claimtest.VolumePatch("pv-a", `{"spec":{"volumeAttributesClassName":"thick"}}`),
		claimtest.ClaimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":null,"currentVolumeAttributesClassName":"thick","conditions":null}}`),
	}, f.Actions())
	kubetest.Diff(t, "events", []string{
		"Normal VolumeModify external resizer is modifying volume a with vac thick",
		"Normal VolumeModifySuccessful external resizer modified volume a with vac thick successfully",
	}, f.Events())
	kubetest.Diff(t, "claim", "current=thick", modifyStatusOf(f.PVC("a")))
	kubetest.Diff(t, "volume's class", thick, *f.PV("pv-a").Spec.VolumeAttributesClassName)
	kubetest.Diff(t, "sync errors", []error{nil}, f.Errs)
	if got := testutil.ToFloat64(f.c.claims.Metrics.Done); got != 1 {
		t.Errorf("loopvol_resizer_modifies_total = %v, want 1", got)
	}

	// Its own writes came back as events and queued nothing; a resync
	// finds nothing to do.
	f.Resync()
	kubetest.Diff(t, "driver calls after a resync", []modifyCall(nil), f.csi.TakeCalls())
	kubetest.Diff(t, "API actions after a resync", []kubetest.Action(nil), f.Actions())
}

// TestModifyNothingToDo: claims that need nothing are not written and the
// driver is not called.
func TestModifyNothingToDo(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs []runtime.Object
		caps bool
	}{
		{name: "has its class", objs: boundThin(thin)},
		{name: "asks for no class, never had one", objs: []runtime.Object{claimtest.Claim("a", "1Gi", "1Gi"), claimtest.Volume("a", "1Gi")}},
		{name: "not bound", objs: []runtime.Object{claimtest.Claim("a", "1Gi", "1Gi", wantsClass(thick), claimtest.Pending), claimtest.Volume("a", "1Gi"), class(thick, thickParams)}},
		{name: "another driver's volume", objs: []runtime.Object{claimtest.Claim("a", "1Gi", "1Gi", wantsClass(thick)), claimtest.Volume("a", "1Gi", claimtest.OfDriver("other.csi.io")), class(thick, thickParams)}},
		{name: "volume gone", objs: []runtime.Object{claimtest.Claim("a", "1Gi", "1Gi", wantsClass(thick)), class(thick, thickParams)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objs)
			f.QueueAll()
			f.Drain()
			kubetest.Diff(t, "driver calls", []modifyCall(nil), f.csi.TakeCalls())
			var writes []kubetest.Action
			for _, a := range f.Actions() {
				if a.Verb != "get" {
					writes = append(writes, a)
				}
			}
			kubetest.Diff(t, "API writes", []kubetest.Action(nil), writes)
			kubetest.Diff(t, "events", []string(nil), f.Events())
		})
	}
}

// TestModifyPending: a class that does not exist → Pending and a
// VolumeModifyFailed Event, no driver call; its creation queues the claim
// and the modification goes ahead.
func TestModifyPending(t *testing.T) {
	objs := []runtime.Object{claimtest.Claim("a", "1Gi", "1Gi", wantsClass("fast"), hasClass(thin)), claimtest.Volume("a", "1Gi", volumeClass(thin))}
	f := newFixture(t, objs)
	f.QueueAll()
	f.Drain()
	kubetest.Diff(t, "driver calls", []modifyCall(nil), f.csi.TakeCalls())
	kubetest.Diff(t, "API actions", []kubetest.Action{
		claimtest.ClaimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":{"targetVolumeAttributesClassName":"fast","status":"Pending"}}}`),
	}, f.Actions())
	kubetest.Diff(t, "events", []string{`Warning VolumeModifyFailed VAC "fast" does not exist.`}, f.Events())

	// The class appears: the claim is queued by its creation, not by a
	// resync.
	if err := f.Client.Tracker().Add(class("fast", map[string]string{"preallocate": "true"})); err != nil {
		t.Fatal(err)
	}
	f.Observe()
	f.Drain()
	kubetest.Diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.TakeCalls())
	kubetest.Diff(t, "claim", "current=fast", modifyStatusOf(f.PVC("a")))
}

// TestModifyInfeasible: INVALID_ARGUMENT → Infeasible with the driver's
// code and message; the same class is not tried again before
// --retry-interval-max; a new class is tried at once and recovers.
func TestModifyInfeasible(t *testing.T) {
	objs := append(boundThin("bad"), class("bad", map[string]string{"pool": "elsewhere"}))
	f := newFixture(t, objs)
	driverMsg := `mutable parameter "pool": no pool "elsewhere" (pools: p1)`
	f.csi.answer(status.Error(codes.InvalidArgument, driverMsg))
	f.QueueAll()
	f.Drain()

	kubetest.Diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: map[string]string{"pool": "elsewhere"}}}, f.csi.TakeCalls())
	acts := f.Actions()
	kubetest.Diff(t, "API actions", []kubetest.Action{
		claimtest.ClaimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":{"targetVolumeAttributesClassName":"bad","status":"InProgress"},`+
			`"conditions":[`+modifyingCondition(`Modifying volume to "bad" is in progress.`)+`]}}`),
		claimtest.ClaimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":{"targetVolumeAttributesClassName":"bad","status":"Infeasible"},`+
			`"conditions":[`+modifyingCondition(`Modifying volume to "bad" failed. Waiting for retry.`)+`,`+modifyErrorCondition("InvalidArgument", driverMsg)+`]}}`),
	}, acts)
	ev := f.Events()
	if len(ev) != 2 || !strings.HasPrefix(ev[1], "Warning VolumeModifyFailed ") || !strings.Contains(ev[1], "code = InvalidArgument desc = "+driverMsg) {
		t.Errorf("events %q, want VolumeModify and VolumeModifyFailed with the driver's message", ev)
	}
	if len(f.Errs) != 1 || !kube.IsFinal(f.Errs[0]) {
		t.Errorf("sync errors %v, want one final error (retried slowly)", f.Errs)
	}
	if got := testutil.ToFloat64(f.c.claims.Metrics.Errors.WithLabelValues("InvalidArgument")); got != 1 {
		t.Errorf("loopvol_resizer_modify_errors_total{InvalidArgument} = %v, want 1", got)
	}
	if q := f.c.claims.Queue.Q.Len(); q != 0 {
		t.Errorf("the claim's own status writes queued it again (queue length %d)", q)
	}

	// Within --retry-interval-max the driver is not asked again.
	f.Resync()
	kubetest.Diff(t, "driver calls within the slow retry window", []modifyCall(nil), f.csi.TakeCalls())
	kubetest.Diff(t, "API actions within the slow retry window", []kubetest.Action(nil), f.Actions())
	// After it, once.
	f.Clock.SetTime(claimtest.Now.Add(6 * time.Minute))
	f.csi.answer(status.Error(codes.InvalidArgument, driverMsg))
	f.Resync()
	kubetest.Diff(t, "driver calls after the slow retry window", 1, len(f.csi.TakeCalls()))
	f.Events()

	// The user picks a class the driver accepts: tried at once, recovered.
	f.SetClaim("a", wantsClass(thick))
	f.Drain()
	kubetest.Diff(t, "driver calls for the new class", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.TakeCalls())
	kubetest.Diff(t, "claim", "current=thick", modifyStatusOf(f.PVC("a")))
	kubetest.Diff(t, "volume's class", thick, *f.PV("pv-a").Spec.VolumeAttributesClassName)
}

// TestModifyFinalNotInfeasible: a final error other than INVALID_ARGUMENT
// (FAILED_PRECONDITION: loopvol thins only detached volumes) stays
// InProgress with ModifyVolumeError and is retried; the retry succeeds.
func TestModifyFinalNotInfeasible(t *testing.T) {
	objs := []runtime.Object{
		claimtest.Claim("a", "1Gi", "1Gi", wantsClass(thin), hasClass(thick)), claimtest.Volume("a", "1Gi", volumeClass(thick)),
		class(thin, thinParams), class(thick, thickParams),
	}
	f := newFixture(t, objs)
	f.csi.answer(status.Error(codes.FailedPrecondition, "volume is attached"))
	f.QueueAll()
	f.Drain()
	kubetest.Diff(t, "claim after FAILED_PRECONDITION",
		`current=thick target=thin status=InProgress ModifyingVolume:Modifying volume to "thin" failed. Waiting for retry. ModifyVolumeError(FailedPrecondition):volume is attached`,
		modifyStatusOf(f.PVC("a")))
	if len(f.Errs) != 1 || f.Errs[0] == nil {
		t.Fatalf("sync errors %v, want one", f.Errs)
	}
	f.Actions()
	f.Events()

	// The retry (the backoff's; run here by a resync) succeeds.
	f.Resync()
	kubetest.Diff(t, "driver calls", 2, len(f.csi.TakeCalls()))
	kubetest.Diff(t, "claim after the retry", "current=thin", modifyStatusOf(f.PVC("a")))
	kubetest.Diff(t, "API actions of the retry", []kubetest.Action{
		claimtest.ClaimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"conditions":[`+modifyingCondition(`Modifying volume to "thin" is in progress.`)+`,`+
			modifyErrorCondition("FailedPrecondition", "volume is attached")+`]}}`),
		claimtest.VolumePatch("pv-a", `{"spec":{"volumeAttributesClassName":"thin"}}`),
		claimtest.ClaimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":null,"currentVolumeAttributesClassName":"thin","conditions":null}}`),
	}, f.Actions())
}

// TestModifyUncertain: after an error whose outcome is uncertain the
// target is kept, even when the claim asks for another class meanwhile;
// the newer class comes after.
func TestModifyUncertain(t *testing.T) {
	objs := append(boundThin(thick), class("other", map[string]string{"pool": "p1"}))
	f := newFixture(t, objs)
	f.csi.answer(status.Error(codes.DeadlineExceeded, "timed out"))
	f.QueueAll()
	f.Drain()
	if ev := f.Events(); len(ev) != 2 || !strings.HasSuffix(ev[1], ". Still modifying to VAC thick") {
		t.Errorf("events %q, want the failure still modifying to thick", ev)
	}
	if kube.IsFinal(f.Errs[0]) {
		t.Errorf("an uncertain error is final: %v", f.Errs[0])
	}
	f.SetClaim("a", wantsClass("other"))
	f.Drain()
	f.Resync()
	kubetest.Diff(t, "driver calls: the uncertain target first, then the newer class", []modifyCall{
		{VolumeID: "vol-a", Parameters: thickParams},
		{VolumeID: "vol-a", Parameters: thickParams},
		{VolumeID: "vol-a", Parameters: map[string]string{"pool": "p1"}},
	}, f.csi.TakeCalls())
	kubetest.Diff(t, "claim", "current=other", modifyStatusOf(f.PVC("a")))
}

// TestModifyRestartInProgress: a claim a previous run left InProgress is
// uncertain: its target is applied first, not the newer class.
func TestModifyRestartInProgress(t *testing.T) {
	objs := append(boundThin("other", modifying(thick, corev1.PersistentVolumeClaimModifyVolumeInProgress)), class("other", map[string]string{"pool": "p1"}))
	f := newFixture(t, objs)
	f.c.initUncertain(klog.FromContext(f.Ctx))
	f.QueueAll()
	f.Drain()
	f.Resync()
	kubetest.Diff(t, "driver calls: the target in progress first, then the newer class", []modifyCall{
		{VolumeID: "vol-a", Parameters: thickParams},
		{VolumeID: "vol-a", Parameters: map[string]string{"pool": "p1"}},
	}, f.csi.TakeCalls())
	kubetest.Diff(t, "claim", "current=other", modifyStatusOf(f.PVC("a")))
}

// TestModifyClassOfAnotherDriver: a class of another driver is Infeasible
// without a driver call.
func TestModifyClassOfAnotherDriver(t *testing.T) {
	other := class("other", map[string]string{"iops": "100"})
	other.DriverName = "ebs.csi.aws.com"
	f := newFixture(t, append(boundThin("other"), other))
	f.QueueAll()
	f.Drain()
	kubetest.Diff(t, "driver calls", []modifyCall(nil), f.csi.TakeCalls())
	kubetest.Diff(t, "claim",
		`current=thin target=other status=Infeasible ModifyingVolume:Modifying volume to "other" failed. Waiting for retry. ModifyVolumeError(InvalidArgument):VolumeAttributesClass other is of driver ebs.csi.aws.com, not loopvol.csi.io`,
		modifyStatusOf(f.PVC("a")))
	if ev := f.Events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning VolumeModifyFailed ") {
		t.Errorf("events %q, want only VolumeModifyFailed (never marked as being modified)", ev)
	}
	if acts := f.Actions(); len(acts) != 1 {
		t.Errorf("API actions %+v, want the one Infeasible status patch", acts)
	}
}

// TestModifyRolledBack: a class taken back before it was applied ends the
// modification: ModifyingVolume goes, VolumeModifyCanceled.
func TestModifyRolledBack(t *testing.T) {
	pvc := claimtest.Claim("a", "1Gi", "1Gi", modifying("bad", corev1.PersistentVolumeClaimModifyVolumeInfeasible), claimtest.Condition(corev1.PersistentVolumeClaimVolumeModifyingVolume, "failed"))
	f := newFixture(t, []runtime.Object{pvc, claimtest.Volume("a", "1Gi")})
	f.QueueAll()
	f.Drain()
	kubetest.Diff(t, "driver calls", []modifyCall(nil), f.csi.TakeCalls())
	kubetest.Diff(t, "API actions", []kubetest.Action{
		claimtest.ClaimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"conditions":null}}`),
	}, f.Actions())
	kubetest.Diff(t, "events", []string{"Normal VolumeModifyCanceled Cancelled modify."}, f.Events())
	kubetest.Diff(t, "claim: the last outcome stays", "current=<nil> target=bad status=Infeasible", modifyStatusOf(f.PVC("a")))
}

// TestModifySecretsAndMetadata: the modify-secret annotations name the
// Secret (else controllerExpandSecretRef); --extra-modify-metadata adds the
// claim's and volume's names.
func TestModifySecretsAndMetadata(t *testing.T) {
	secret := func(ns, name, v string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{"key": []byte(v)}}
	}
	for _, tc := range []struct {
		name   string
		pvOpts []func(*corev1.PersistentVolume)
		want   string
	}{
		{name: "modify-secret annotations", want: "annotated", pvOpts: []func(*corev1.PersistentVolume){
			claimtest.ExpandSecret("kube-system", "expand"),
			func(pv *corev1.PersistentVolume) {
				pv.Annotations = map[string]string{SecretNameAnnotation: "modify", SecretNamespaceAnnotation: "kube-system"}
			},
		}},
		{name: "controllerExpandSecretRef without annotations", want: "expand", pvOpts: []func(*corev1.PersistentVolume){claimtest.ExpandSecret("kube-system", "expand")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{
				claimtest.Claim("a", "1Gi", "1Gi", wantsClass(thick), hasClass(thin)),
				claimtest.Volume("a", "1Gi", append(tc.pvOpts, volumeClass(thin))...),
				class(thick, thickParams),
				secret("kube-system", "modify", "annotated"), secret("kube-system", "expand", "expand"),
			}
			f := newFixture(t, objs, func(c *Config) { c.ExtraModifyMetadata = true })
			f.QueueAll()
			f.Drain()
			kubetest.Diff(t, "driver calls", []modifyCall{{
				VolumeID: "vol-a",
				Parameters: map[string]string{"preallocate": "true",
					"csi.storage.k8s.io/pvc/name": "a", "csi.storage.k8s.io/pvc/namespace": claimtest.Namespace, "csi.storage.k8s.io/pv/name": "pv-a"},
				Secrets: map[string]string{"key": tc.want},
			}}, f.csi.TakeCalls())
		})
	}
}

// TestModifyNotOffered: a driver without MODIFY_VOLUME is not called and
// nothing is written; the claim is retried slowly.
func TestModifyNotOffered(t *testing.T) {
	f := newFixture(t, boundThin(thick))
	f.csi.Caps.ModifyVolume = false
	f.QueueAll()
	f.Drain()
	kubetest.Diff(t, "driver calls", []modifyCall(nil), f.csi.TakeCalls())
	kubetest.Diff(t, "API actions", []kubetest.Action(nil), f.Actions())
	if len(f.Errs) != 1 || !kube.IsFinal(f.Errs[0]) {
		t.Errorf("sync errors %v, want one final error", f.Errs)
	}
}

// TestModifyEagerWatch: every step also holds when the watch delivers each
// write before the patch call returns.
func TestModifyEagerWatch(t *testing.T) {
	f := newFixture(t, boundThin(thick))
	f.Eager = true
	f.QueueAll()
	f.Drain()
	kubetest.Diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.TakeCalls())
	kubetest.Diff(t, "claim", "current=thick", modifyStatusOf(f.PVC("a")))
	if q := f.c.claims.Queue.Q.Len(); q != 0 {
		t.Errorf("own writes delivered early queued the claim (length %d)", q)
	}
}

// TestModifyConflict: a status write that conflicts (someone changed the
// claim) is not forced: the next sync reads the live claim.
func TestModifyConflict(t *testing.T) {
	f := newFixture(t, boundThin(thick))
	// The cache is one version behind the API server.
	f.SetClaim("a", func(p *corev1.PersistentVolumeClaim) { p.Labels = map[string]string{"x": "y"} })
	stale := claimtest.Claim("a", "1Gi", "1Gi", wantsClass(thick), hasClass(thin))
	_ = f.c.claims.PVCInformer.GetIndexer().Update(stale)
	f.c.claims.ClaimAdded(stale)
	err := f.Next()
	if err == nil || kube.IsFinal(err) {
		t.Fatalf("sync of a stale claim = %v, want a conflict retried with backoff", err)
	}
	kubetest.Diff(t, "driver calls after a conflict", []modifyCall(nil), f.csi.TakeCalls())
	// The retry reads the claim from the API server.
	f.c.claims.Queue.Q.Add(kube.ClaimKey(stale))
	f.Drain()
	kubetest.Diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.TakeCalls())
	kubetest.Diff(t, "claim", "current=thick", modifyStatusOf(f.PVC("a")))
}

// TestModifyShouldEnqueue: which claim updates queue a modify sync (the
// claim handler with the controller's shouldEnqueue).
func TestModifyShouldEnqueue(t *testing.T) {
	base := claimtest.Claim("a", "1Gi", "1Gi", wantsClass(thin), hasClass(thin))
	for _, tc := range []struct {
		name   string
		change func(*corev1.PersistentVolumeClaim)
		own    bool
		want   bool
	}{
		{name: "resync (same version) → queued", change: func(*corev1.PersistentVolumeClaim) {}, want: true},
		{name: "class changed → queued", change: wantsClass(thick), want: true},
		{name: "current class changed by someone → queued", change: hasClass(thick), want: true},
		{name: "modification status changed by someone → queued", change: modifying(thick, corev1.PersistentVolumeClaimModifyVolumeInProgress), want: true},
		{name: "rebound → queued", change: func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeName = "pv-b" }, want: true},
		{name: "the controller's own write → not queued", change: modifying(thick, corev1.PersistentVolumeClaimModifyVolumeInProgress), own: true, want: false},
		{name: "a resize write (allocatedResources) → not queued", change: claimtest.Allocated("2Gi", corev1.PersistentVolumeClaimControllerResizeInProgress), want: false},
		{name: "labels → not queued", change: func(p *corev1.PersistentVolumeClaim) { p.Labels = map[string]string{"a": "b"} }, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil)
			old, pvc := base.DeepCopy(), base.DeepCopy()
			tc.change(pvc)
			if tc.name != "resync (same version) → queued" {
				pvc.ResourceVersion = "2"
			}
			if tc.own {
				f.c.claims.Writes.Record(kube.ClaimKey(pvc), "2", claimtest.Now)
			}
			f.c.claims.ClaimUpdated(old, pvc)
			if got := f.c.claims.Queue.Q.Len() == 1; got != tc.want {
				t.Errorf("queued = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestModifyProbeAPI: with ProbeAPI, an API server that does not serve
// VolumeAttributesClasses leaves the controller idle: Run returns at once.
func TestModifyProbeAPI(t *testing.T) {
	f := newFixture(t, nil, func(c *Config) { c.ProbeAPI = true })
	f.Client.PrependReactor("list", "volumeattributesclasses", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(storagev1.Resource("volumeattributesclasses"), "")
	})
	ctx, cancel := context.WithCancel(f.Ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.c.Run(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run without the API: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return without the VolumeAttributesClass API")
	}
}
