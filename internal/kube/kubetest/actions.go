package kubetest

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
)

// Action is one request a controller made to the API server, in a form a
// test writes out in full and compares with cmp: a patch as normalized
// JSON, a created object by name (and in Recorder.Describe's short form).
type Action struct {
	Verb        string
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	PatchType   types.PatchType
	Patch       string
	// Object is a created or updated object as Recorder.Describe writes
	// it; "" without Describe.
	Object string
}

// Recorder turns the requests recorded by a fake clientset into Actions.
// Watches are always left out: informers make them, not the code under
// test.
type Recorder struct {
	// Skip are further verbs to leave out ("list", "get").
	Skip []string
	// MaskResourceVersions writes every metadata.resourceVersion of a
	// merge patch as "RV": for tests whose preconditions carry the
	// versions Serve handed out, which depend on how many writes came
	// before.
	MaskResourceVersions bool
	// Describe, when set, fills Action.Object of creates and updates.
	Describe func(runtime.Object) string
}

// Take returns the requests made to client since the last Take (or
// ClearActions), and forgets them.
func (r Recorder) Take(client *fake.Clientset) []Action {
	var out []Action
	for _, a := range client.Actions() {
		if a.GetVerb() == "watch" || slices.Contains(r.Skip, a.GetVerb()) {
			continue
		}
		act := Action{Verb: a.GetVerb(), Resource: a.GetResource().Resource, Subresource: a.GetSubresource(), Namespace: a.GetNamespace()}
		switch a := a.(type) {
		case k8stesting.PatchAction:
			act.Name, act.PatchType, act.Patch = a.GetName(), a.GetPatchType(), r.Norm(string(a.GetPatch()))
		case k8stesting.GetAction:
			act.Name = a.GetName()
		case k8stesting.DeleteAction:
			act.Name = a.GetName()
		case k8stesting.CreateAction:
			act.Name, act.Object = r.object(a.GetObject())
		case k8stesting.UpdateAction:
			act.Name, act.Object = r.object(a.GetObject())
		}
		out = append(out, act)
	}
	client.ClearActions()
	return out
}

func (r Recorder) object(o runtime.Object) (name, described string) {
	if m, ok := o.(metav1.Object); ok {
		name = m.GetName()
	}
	if r.Describe != nil {
		described = r.Describe(o)
	}
	return name, described
}

// Norm re-encodes a JSON document with sorted keys (and, with
// MaskResourceVersions, a merge patch's metadata.resourceVersion as
// "RV"), so that a test's expected patch and the controller's compare
// equal whatever their key order. What is not JSON comes back marked as
// such.
func (r Recorder) Norm(s string) string {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return "invalid JSON: " + s
	}
	if m, ok := v.(map[string]any); ok && r.MaskResourceVersions {
		if md, ok := m["metadata"].(map[string]any); ok {
			if _, ok := md["resourceVersion"]; ok {
				md["resourceVersion"] = "RV"
			}
		}
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// Events returns the Events rec recorded since the last call, without
// waiting for more.
func Events(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// Diff fails t, naming what, when got differs from want, and shows how.
func Diff[T any](t testing.TB, what string, want, got T) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("%s (-want +got):\n%s", what, d)
	}
}

// Get returns the object the fake API server of client holds under
// resource, namespace and name, as type T; it fails t when there is
// none. It reads the tracker, so it records no action.
func Get[T runtime.Object](t testing.TB, client *fake.Clientset, resource schema.GroupVersionResource, namespace, name string) T {
	t.Helper()
	o, err := client.Tracker().Get(resource, namespace, name)
	if err != nil {
		t.Fatalf("get %s %s/%s: %v", resource.Resource, namespace, name, err)
	}
	out, ok := o.(T)
	if !ok {
		t.Fatalf("get %s %s/%s: a %T", resource.Resource, namespace, name, o)
	}
	return out
}
