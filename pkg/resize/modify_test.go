package resize

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
		claim("a", "1Gi", "1Gi", append([]func(*corev1.PersistentVolumeClaim){wantsClass(want), hasClass(thin)}, opts...)...),
		volume("a", "1Gi", volumeClass(thin)),
		class(thin, thinParams),
		class(thick, thickParams),
	}
}

// modifyingCondition is the ModifyingVolume condition as a JSON patch
// element with the test's clock.
func modifyingCondition(msg string) string {
	return fmt.Sprintf(`{"type":"ModifyingVolume","status":"True","lastProbeTime":%q,"lastTransitionTime":%q,"message":%q}`, timeJSON, timeJSON, msg)
}

func modifyErrorCondition(reason, msg string) string {
	return fmt.Sprintf(`{"type":"ModifyVolumeError","status":"True","lastProbeTime":%q,"lastTransitionTime":%q,"reason":%q,"message":%q}`, timeJSON, timeJSON, reason, msg)
}

// TestModify: a claim whose class changed is modified, and the outcome
// recorded on the claim and its volume, with upstream's names, in the
// order upstream writes them.
func TestModify(t *testing.T) {
	f := newModFixture(t, boundThin(thick))
	f.queueAll()
	f.drain()

	diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.takeCalls())
	diff(t, "API actions", []apiAction{
		claimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":{"targetVolumeAttributesClassName":"thick","status":"InProgress"},`+
			`"conditions":[`+modifyingCondition(`Modifying volume to "thick" is in progress.`)+`]}}`),
		volumePatchAction("pv-a", `{"spec":{"volumeAttributesClassName":"thick"}}`),
		claimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":null,"currentVolumeAttributesClassName":"thick","conditions":null}}`),
	}, f.actions())
	diff(t, "events", []string{
		"Normal VolumeModify external resizer is modifying volume a with vac thick",
		"Normal VolumeModifySuccessful external resizer modified volume a with vac thick successfully",
	}, f.events())
	diff(t, "claim", "current=thick", modifyStatusOf(f.pvc("a")))
	diff(t, "volume's class", thick, *f.pv("pv-a").Spec.VolumeAttributesClassName)
	diff(t, "sync errors", []error{nil}, f.errs)
	if got := testutil.ToFloat64(f.c.metrics.Done); got != 1 {
		t.Errorf("loopvol_resizer_modifies_total = %v, want 1", got)
	}

	// Its own writes came back as events and queued nothing; a resync
	// finds nothing to do.
	f.resync()
	diff(t, "driver calls after a resync", []modifyCall(nil), f.csi.takeCalls())
	diff(t, "API actions after a resync", []apiAction(nil), f.actions())
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
		{name: "asks for no class, never had one", objs: []runtime.Object{claim("a", "1Gi", "1Gi"), volume("a", "1Gi")}},
		{name: "not bound", objs: []runtime.Object{claim("a", "1Gi", "1Gi", wantsClass(thick), pending), volume("a", "1Gi"), class(thick, thickParams)}},
		{name: "another driver's volume", objs: []runtime.Object{claim("a", "1Gi", "1Gi", wantsClass(thick)), volume("a", "1Gi", ofDriver("other.csi.io")), class(thick, thickParams)}},
		{name: "volume gone", objs: []runtime.Object{claim("a", "1Gi", "1Gi", wantsClass(thick)), class(thick, thickParams)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newModFixture(t, tc.objs)
			f.queueAll()
			f.drain()
			diff(t, "driver calls", []modifyCall(nil), f.csi.takeCalls())
			var writes []apiAction
			for _, a := range f.actions() {
				if a.Verb != "get" {
					writes = append(writes, a)
				}
			}
			diff(t, "API writes", []apiAction(nil), writes)
			diff(t, "events", []string(nil), f.events())
		})
	}
}

// TestModifyPending: a class that does not exist → Pending and a
// VolumeModifyFailed Event, no driver call; its creation queues the claim
// and the modification goes ahead.
func TestModifyPending(t *testing.T) {
	objs := []runtime.Object{claim("a", "1Gi", "1Gi", wantsClass("fast"), hasClass(thin)), volume("a", "1Gi", volumeClass(thin))}
	f := newModFixture(t, objs)
	f.queueAll()
	f.drain()
	diff(t, "driver calls", []modifyCall(nil), f.csi.takeCalls())
	diff(t, "API actions", []apiAction{
		claimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":{"targetVolumeAttributesClassName":"fast","status":"Pending"}}}`),
	}, f.actions())
	diff(t, "events", []string{`Warning VolumeModifyFailed VAC "fast" does not exist.`}, f.events())

	// The class appears: the claim is queued by its creation, not by a
	// resync.
	if err := f.client.Tracker().Add(class("fast", map[string]string{"preallocate": "true"})); err != nil {
		t.Fatal(err)
	}
	f.observe()
	f.drain()
	diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.takeCalls())
	diff(t, "claim", "current=fast", modifyStatusOf(f.pvc("a")))
}

// TestModifyInfeasible: INVALID_ARGUMENT → Infeasible with the driver's
// code and message; the same class is not tried again before
// --retry-interval-max; a new class is tried at once and recovers.
func TestModifyInfeasible(t *testing.T) {
	objs := append(boundThin("bad"), class("bad", map[string]string{"pool": "elsewhere"}))
	f := newModFixture(t, objs)
	driverMsg := `mutable parameter "pool": no pool "elsewhere" (pools: p1)`
	f.csi.answer(status.Error(codes.InvalidArgument, driverMsg))
	f.queueAll()
	f.drain()

	diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: map[string]string{"pool": "elsewhere"}}}, f.csi.takeCalls())
	acts := f.actions()
	diff(t, "API actions", []apiAction{
		claimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":{"targetVolumeAttributesClassName":"bad","status":"InProgress"},`+
			`"conditions":[`+modifyingCondition(`Modifying volume to "bad" is in progress.`)+`]}}`),
		claimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":{"targetVolumeAttributesClassName":"bad","status":"Infeasible"},`+
			`"conditions":[`+modifyingCondition(`Modifying volume to "bad" failed. Waiting for retry.`)+`,`+modifyErrorCondition("InvalidArgument", driverMsg)+`]}}`),
	}, acts)
	ev := f.events()
	if len(ev) != 2 || !strings.HasPrefix(ev[1], "Warning VolumeModifyFailed ") || !strings.Contains(ev[1], "code = InvalidArgument desc = "+driverMsg) {
		t.Errorf("events %q, want VolumeModify and VolumeModifyFailed with the driver's message", ev)
	}
	if len(f.errs) != 1 || !kube.IsFinal(f.errs[0]) {
		t.Errorf("sync errors %v, want one final error (retried slowly)", f.errs)
	}
	if got := testutil.ToFloat64(f.c.metrics.Errors.WithLabelValues("InvalidArgument")); got != 1 {
		t.Errorf("loopvol_resizer_modify_errors_total{InvalidArgument} = %v, want 1", got)
	}
	if q := f.c.queue.Q.Len(); q != 0 {
		t.Errorf("the claim's own status writes queued it again (queue length %d)", q)
	}

	// Within --retry-interval-max the driver is not asked again.
	f.resync()
	diff(t, "driver calls within the slow retry window", []modifyCall(nil), f.csi.takeCalls())
	diff(t, "API actions within the slow retry window", []apiAction(nil), f.actions())
	// After it, once.
	f.clock.SetTime(testNow.Add(6 * time.Minute))
	f.csi.answer(status.Error(codes.InvalidArgument, driverMsg))
	f.resync()
	diff(t, "driver calls after the slow retry window", 1, len(f.csi.takeCalls()))
	f.events()

	// The user picks a class the driver accepts: tried at once, recovered.
	f.setClaim("a", wantsClass(thick))
	f.drain()
	diff(t, "driver calls for the new class", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.takeCalls())
	diff(t, "claim", "current=thick", modifyStatusOf(f.pvc("a")))
	diff(t, "volume's class", thick, *f.pv("pv-a").Spec.VolumeAttributesClassName)
}

// TestModifyFinalNotInfeasible: a final error other than INVALID_ARGUMENT
// (FAILED_PRECONDITION: loopvol thins only detached volumes) stays
// InProgress with ModifyVolumeError and is retried; the retry succeeds.
func TestModifyFinalNotInfeasible(t *testing.T) {
	objs := []runtime.Object{
		claim("a", "1Gi", "1Gi", wantsClass(thin), hasClass(thick)), volume("a", "1Gi", volumeClass(thick)),
		class(thin, thinParams), class(thick, thickParams),
	}
	f := newModFixture(t, objs)
	f.csi.answer(status.Error(codes.FailedPrecondition, "volume is attached"))
	f.queueAll()
	f.drain()
	diff(t, "claim after FAILED_PRECONDITION",
		`current=thick target=thin status=InProgress ModifyingVolume:Modifying volume to "thin" failed. Waiting for retry. ModifyVolumeError(FailedPrecondition):volume is attached`,
		modifyStatusOf(f.pvc("a")))
	if len(f.errs) != 1 || f.errs[0] == nil {
		t.Fatalf("sync errors %v, want one", f.errs)
	}
	f.actions()
	f.events()

	// The retry (the backoff's; run here by a resync) succeeds.
	f.resync()
	diff(t, "driver calls", 2, len(f.csi.takeCalls()))
	diff(t, "claim after the retry", "current=thin", modifyStatusOf(f.pvc("a")))
	diff(t, "API actions of the retry", []apiAction{
		claimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"conditions":[`+modifyingCondition(`Modifying volume to "thin" is in progress.`)+`,`+
			modifyErrorCondition("FailedPrecondition", "volume is attached")+`]}}`),
		volumePatchAction("pv-a", `{"spec":{"volumeAttributesClassName":"thin"}}`),
		claimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"modifyVolumeStatus":null,"currentVolumeAttributesClassName":"thin","conditions":null}}`),
	}, f.actions())
}

// TestModifyUncertain: after an error whose outcome is uncertain the
// target is kept, even when the claim asks for another class meanwhile;
// the newer class comes after.
func TestModifyUncertain(t *testing.T) {
	objs := append(boundThin(thick), class("other", map[string]string{"pool": "p1"}))
	f := newModFixture(t, objs)
	f.csi.answer(status.Error(codes.DeadlineExceeded, "timed out"))
	f.queueAll()
	f.drain()
	if ev := f.events(); len(ev) != 2 || !strings.HasSuffix(ev[1], ". Still modifying to VAC thick") {
		t.Errorf("events %q, want the failure still modifying to thick", ev)
	}
	if kube.IsFinal(f.errs[0]) {
		t.Errorf("an uncertain error is final: %v", f.errs[0])
	}
	f.setClaim("a", wantsClass("other"))
	f.drain()
	f.resync()
	diff(t, "driver calls: the uncertain target first, then the newer class", []modifyCall{
		{VolumeID: "vol-a", Parameters: thickParams},
		{VolumeID: "vol-a", Parameters: thickParams},
		{VolumeID: "vol-a", Parameters: map[string]string{"pool": "p1"}},
	}, f.csi.takeCalls())
	diff(t, "claim", "current=other", modifyStatusOf(f.pvc("a")))
}

// TestModifyRestartInProgress: a claim a previous run left InProgress is
// uncertain: its target is applied first, not the newer class.
func TestModifyRestartInProgress(t *testing.T) {
	objs := append(boundThin("other", modifying(thick, corev1.PersistentVolumeClaimModifyVolumeInProgress)), class("other", map[string]string{"pool": "p1"}))
	f := newModFixture(t, objs)
	f.c.initUncertain(klog.FromContext(f.ctx))
	f.queueAll()
	f.drain()
	f.resync()
	diff(t, "driver calls: the target in progress first, then the newer class", []modifyCall{
		{VolumeID: "vol-a", Parameters: thickParams},
		{VolumeID: "vol-a", Parameters: map[string]string{"pool": "p1"}},
	}, f.csi.takeCalls())
	diff(t, "claim", "current=other", modifyStatusOf(f.pvc("a")))
}

// TestModifyClassOfAnotherDriver: a class of another driver is Infeasible
// without a driver call.
func TestModifyClassOfAnotherDriver(t *testing.T) {
	other := class("other", map[string]string{"iops": "100"})
	other.DriverName = "ebs.csi.aws.com"
	f := newModFixture(t, append(boundThin("other"), other))
	f.queueAll()
	f.drain()
	diff(t, "driver calls", []modifyCall(nil), f.csi.takeCalls())
	diff(t, "claim",
		`current=thin target=other status=Infeasible ModifyingVolume:Modifying volume to "other" failed. Waiting for retry. ModifyVolumeError(InvalidArgument):VolumeAttributesClass other is of driver ebs.csi.aws.com, not loopvol.csi.io`,
		modifyStatusOf(f.pvc("a")))
	if ev := f.events(); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning VolumeModifyFailed ") {
		t.Errorf("events %q, want only VolumeModifyFailed (never marked as being modified)", ev)
	}
	if acts := f.actions(); len(acts) != 1 {
		t.Errorf("API actions %+v, want the one Infeasible status patch", acts)
	}
}

// TestModifyRolledBack: a class taken back before it was applied ends the
// modification: ModifyingVolume goes, VolumeModifyCanceled.
func TestModifyRolledBack(t *testing.T) {
	pvc := claim("a", "1Gi", "1Gi", modifying("bad", corev1.PersistentVolumeClaimModifyVolumeInfeasible), condition(corev1.PersistentVolumeClaimVolumeModifyingVolume, "failed"))
	f := newModFixture(t, []runtime.Object{pvc, volume("a", "1Gi")})
	f.queueAll()
	f.drain()
	diff(t, "driver calls", []modifyCall(nil), f.csi.takeCalls())
	diff(t, "API actions", []apiAction{
		claimStatusPatch("a", `{"metadata":{"resourceVersion":"RV"},"status":{"conditions":null}}`),
	}, f.actions())
	diff(t, "events", []string{"Normal VolumeModifyCanceled Cancelled modify."}, f.events())
	diff(t, "claim: the last outcome stays", "current=<nil> target=bad status=Infeasible", modifyStatusOf(f.pvc("a")))
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
			expandSecret("kube-system", "expand"),
			func(pv *corev1.PersistentVolume) {
				pv.Annotations = map[string]string{ModifySecretNameAnnotation: "modify", ModifySecretNamespaceAnnotation: "kube-system"}
			},
		}},
		{name: "controllerExpandSecretRef without annotations", want: "expand", pvOpts: []func(*corev1.PersistentVolume){expandSecret("kube-system", "expand")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{
				claim("a", "1Gi", "1Gi", wantsClass(thick), hasClass(thin)),
				volume("a", "1Gi", append(tc.pvOpts, volumeClass(thin))...),
				class(thick, thickParams),
				secret("kube-system", "modify", "annotated"), secret("kube-system", "expand", "expand"),
			}
			f := newModFixture(t, objs, func(c *ModifyConfig) { c.ExtraModifyMetadata = true })
			f.queueAll()
			f.drain()
			diff(t, "driver calls", []modifyCall{{
				VolumeID: "vol-a",
				Parameters: map[string]string{"preallocate": "true",
					"csi.storage.k8s.io/pvc/name": "a", "csi.storage.k8s.io/pvc/namespace": ns, "csi.storage.k8s.io/pv/name": "pv-a"},
				Secrets: map[string]string{"key": tc.want},
			}}, f.csi.takeCalls())
		})
	}
}

// TestModifyNotOffered: a driver without MODIFY_VOLUME is not called and
// nothing is written; the claim is retried slowly.
func TestModifyNotOffered(t *testing.T) {
	f := newModFixture(t, boundThin(thick))
	f.csi.caps.ModifyVolume = false
	f.queueAll()
	f.drain()
	diff(t, "driver calls", []modifyCall(nil), f.csi.takeCalls())
	diff(t, "API actions", []apiAction(nil), f.actions())
	if len(f.errs) != 1 || !kube.IsFinal(f.errs[0]) {
		t.Errorf("sync errors %v, want one final error", f.errs)
	}
}

// TestModifyEagerWatch: every step also holds when the watch delivers each
// write before the patch call returns.
func TestModifyEagerWatch(t *testing.T) {
	f := newModFixture(t, boundThin(thick))
	f.eager = true
	f.queueAll()
	f.drain()
	diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.takeCalls())
	diff(t, "claim", "current=thick", modifyStatusOf(f.pvc("a")))
	if q := f.c.queue.Q.Len(); q != 0 {
		t.Errorf("own writes delivered early queued the claim (length %d)", q)
	}
}

// TestModifyConflict: a status write that conflicts (someone changed the
// claim) is not forced: the next sync reads the live claim.
func TestModifyConflict(t *testing.T) {
	f := newModFixture(t, boundThin(thick))
	// The cache is one version behind the API server.
	f.setClaim("a", func(p *corev1.PersistentVolumeClaim) { p.Labels = map[string]string{"x": "y"} })
	stale := claim("a", "1Gi", "1Gi", wantsClass(thick), hasClass(thin))
	_ = f.c.pvcInformer.GetIndexer().Update(stale)
	f.c.claimAdded(stale)
	key, _ := f.c.queue.Q.Get()
	err := f.c.syncOne(f.ctx, key)
	f.c.queue.Q.Done(key)
	if err == nil || kube.IsFinal(err) {
		t.Fatalf("sync of a stale claim = %v, want a conflict retried with backoff", err)
	}
	diff(t, "driver calls after a conflict", []modifyCall(nil), f.csi.takeCalls())
	// The retry reads the claim from the API server.
	f.c.queue.Q.Add(key)
	f.drain()
	diff(t, "driver calls", []modifyCall{{VolumeID: "vol-a", Parameters: thickParams}}, f.csi.takeCalls())
	diff(t, "claim", "current=thick", modifyStatusOf(f.pvc("a")))
}

// TestModifyShouldEnqueue: which claim updates queue a modify sync.
func TestModifyShouldEnqueue(t *testing.T) {
	base := claim("a", "1Gi", "1Gi", wantsClass(thin), hasClass(thin))
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
		{name: "a resize write (allocatedResources) → not queued", change: allocated("2Gi", corev1.PersistentVolumeClaimControllerResizeInProgress), want: false},
		{name: "labels → not queued", change: func(p *corev1.PersistentVolumeClaim) { p.Labels = map[string]string{"a": "b"} }, want: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newModFixture(t, nil)
			old, pvc := base.DeepCopy(), base.DeepCopy()
			tc.change(pvc)
			if tc.name != "resync (same version) → queued" {
				pvc.ResourceVersion = "2"
			}
			if tc.own {
				f.c.state.recordWrite(claimKey(pvc), "2")
			}
			if got := f.c.shouldEnqueue(old, pvc); got != tc.want {
				t.Errorf("shouldEnqueue = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestModifyProbeAPI: with ProbeAPI, an API server that does not serve
// VolumeAttributesClasses leaves the controller idle: Run returns at once.
func TestModifyProbeAPI(t *testing.T) {
	f := newModFixture(t, nil, func(c *ModifyConfig) { c.ProbeAPI = true })
	f.client.PrependReactor("list", "volumeattributesclasses", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(storagev1.Resource("volumeattributesclasses"), "")
	})
	ctx, cancel := context.WithCancel(f.ctx)
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
