package kubetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// FirstResourceVersion is the resourceVersion of the first write Serve
// answers; each later write gets the next integer. Tests write their own
// objects with smaller ones, so the fake's versions are always newer.
const FirstResourceVersion = 101

// Options say what Serve adds to a fake clientset besides resourceVersions.
type Options struct {
	// Written, when set, is called with each object a create, update or
	// patch produced, right after the write and before the call returns:
	// a fixture that delivers it to an informer cache there plays a watch
	// that is faster than the answer to the write.
	Written func(runtime.Object)
	// Now is the creationTimestamp of created objects that have none
	// (zero: they get none).
	Now time.Time
}

// Serve makes client act like a real API server where controllers that
// tell their own writes from others' depend on it; the fake clientset
// keeps objects as given:
//   - every create, update and patch gives the object a new
//     resourceVersion (FirstResourceVersion, then counting up);
//   - a merge patch whose metadata.resourceVersion differs from the
//     object's fails with a Conflict, as the precondition it is;
//   - a create names an object by its generateName and gives it a UID
//     ("uid-<name>") when it has none.
//
// JSON patches keep their own semantics: their test operations already
// fail on a stale copy.
func Serve(client *fake.Clientset, opts Options) {
	var mu sync.Mutex
	next := FirstResourceVersion - 1
	react := k8stesting.ObjectReaction(client.Tracker())
	client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		var handled bool
		var out runtime.Object
		var err error
		switch a := a.(type) {
		case k8stesting.CreateActionImpl:
			next++
			o := a.Object.(metav1.Object)
			if o.GetName() == "" && o.GetGenerateName() != "" {
				o.SetName(fmt.Sprintf("%s%d", o.GetGenerateName(), next))
			}
			if o.GetUID() == "" {
				o.SetUID(types.UID("uid-" + o.GetName()))
			}
			if ts := o.GetCreationTimestamp(); ts.IsZero() && !opts.Now.IsZero() {
				o.SetCreationTimestamp(metav1.NewTime(opts.Now))
			}
			o.SetResourceVersion(strconv.Itoa(next))
			handled, out, err = react(a)
		case k8stesting.UpdateActionImpl:
			next++
			a.Object.(metav1.Object).SetResourceVersion(strconv.Itoa(next))
			handled, out, err = react(a)
		case k8stesting.PatchActionImpl:
			next++
			if a.Patch, err = withVersion(client, a, strconv.Itoa(next)); err != nil {
				return true, nil, err
			}
			handled, out, err = react(a)
		default:
			return false, nil, nil
		}
		if err == nil && out != nil && opts.Written != nil {
			opts.Written(out.DeepCopyObject())
		}
		return handled, out, err
	})
}

// withVersion returns the patch of a that also sets the resourceVersion
// rv, after checking the precondition a merge patch carries.
func withVersion(client *fake.Clientset, a k8stesting.PatchActionImpl, rv string) ([]byte, error) {
	switch a.PatchType {
	case types.MergePatchType:
		var p map[string]any
		if err := json.Unmarshal(a.Patch, &p); err != nil {
			return nil, err
		}
		md, _ := p["metadata"].(map[string]any)
		if md == nil {
			md = map[string]any{}
			p["metadata"] = md
		}
		if want, ok := md["resourceVersion"].(string); ok {
			cur, err := client.Tracker().Get(a.Resource, a.Namespace, a.Name)
			if err != nil {
				return nil, err
			}
			if cur.(metav1.Object).GetResourceVersion() != want {
				return nil, apierrors.NewConflict(a.Resource.GroupResource(), a.Name, errors.New("the object has been modified"))
			}
		}
		md["resourceVersion"] = rv
		return json.Marshal(p)
	case types.JSONPatchType:
		var ops []map[string]any
		if err := json.Unmarshal(a.Patch, &ops); err != nil {
			return nil, err
		}
		ops = append(ops, map[string]any{"op": "add", "path": "/metadata/resourceVersion", "value": rv})
		return json.Marshal(ops)
	}
	return a.Patch, nil
}
