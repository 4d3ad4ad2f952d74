package kubetest

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
)

// TestServe: writes get new resourceVersions, a merge patch's
// resourceVersion is a precondition, a create is named and given a UID
// and creation time, and Written sees every write.
func TestServe(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	client := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm", ResourceVersion: "1"}})
	var written []string
	Serve(client, Options{Now: now, Written: func(o runtime.Object) {
		written = append(written, o.(metav1.Object).GetResourceVersion())
	}})
	cms := client.CoreV1().ConfigMaps("ns")

	if _, err := cms.Patch(ctx, "cm", types.MergePatchType, []byte(`{"metadata":{"resourceVersion":"0"},"data":{"a":"b"}}`), metav1.PatchOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("patch with a stale resourceVersion = %v, want a conflict", err)
	}
	out, err := cms.Patch(ctx, "cm", types.MergePatchType, []byte(`{"metadata":{"resourceVersion":"1"},"data":{"a":"b"}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	Diff(t, "resourceVersion after a patch", "102", out.ResourceVersion)
	out, err = cms.Patch(ctx, "cm", types.JSONPatchType, []byte(`[{"op":"add","path":"/data/c","value":"d"}]`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	Diff(t, "resourceVersion after a JSON patch", "103", out.ResourceVersion)
	created, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "gen-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	Diff(t, "created", []string{"gen-104", "uid-gen-104", "104", now.String()},
		[]string{created.Name, string(created.UID), created.ResourceVersion, created.CreationTimestamp.UTC().String()})
	Diff(t, "written", []string{"102", "103", "104"}, written)
	Diff(t, "the tracker's copy", "104", Get[*corev1.ConfigMap](t, client, corev1.SchemeGroupVersion.WithResource("configmaps"), "ns", "gen-104").ResourceVersion)
}

func TestRecorder(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}})
	cms := client.CoreV1().ConfigMaps("ns")
	_, _ = cms.Get(ctx, "cm", metav1.GetOptions{})
	_, _ = cms.List(ctx, metav1.ListOptions{})
	_, _ = cms.Patch(ctx, "cm", types.MergePatchType, []byte(`{"metadata":{"resourceVersion":"7"},"data":{"b":"1","a":"2"}}`), metav1.PatchOptions{})
	_, _ = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{})
	_ = cms.Delete(ctx, "new", metav1.DeleteOptions{})
	r := Recorder{Skip: []string{"list"}, MaskResourceVersions: true, Describe: func(o runtime.Object) string {
		return "configmap " + o.(*corev1.ConfigMap).Name
	}}
	Diff(t, "actions", []Action{
		{Verb: "get", Resource: "configmaps", Namespace: "ns", Name: "cm"},
		{Verb: "patch", Resource: "configmaps", Namespace: "ns", Name: "cm", PatchType: types.MergePatchType,
			Patch: `{"data":{"a":"2","b":"1"},"metadata":{"resourceVersion":"RV"}}`},
		{Verb: "create", Resource: "configmaps", Namespace: "ns", Name: "new", Object: "configmap new"},
		{Verb: "delete", Resource: "configmaps", Namespace: "ns", Name: "new"},
	}, r.Take(client))
	Diff(t, "actions after Take", []Action(nil), r.Take(client))
	Diff(t, "not JSON", "invalid JSON: {", r.Norm("{"))

	rec := record.NewFakeRecorder(3)
	rec.Event(&corev1.ConfigMap{}, corev1.EventTypeNormal, "Done", "all of it")
	Diff(t, "events", []string{"Normal Done all of it"}, Events(rec))
	Diff(t, "events after Events", []string(nil), Events(rec))
}

func TestEnvAndCalls(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	env := NewEnv(t, now, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}})
	if !env.Clock.Now().Equal(now) || env.Ctx == nil || env.Registry == nil || env.Recorder == nil {
		t.Fatalf("env: %+v", env)
	}
	Get[*corev1.ConfigMap](t, env.Client, corev1.SchemeGroupVersion.WithResource("configmaps"), "ns", "cm")

	d := &FakeDriver[string]{}
	d.Calls = append(d.Calls, "a", "b")
	if err := d.WaitReady(env.Ctx); err != nil || d.Capabilities().PublishUnpublish {
		t.Errorf("WaitReady = %v, capabilities %+v; want ready, none", err, d.Capabilities())
	}
	Diff(t, "take", []string{"a", "b"}, d.TakeCalls())
	Diff(t, "take again", []string(nil), d.TakeCalls())
}
