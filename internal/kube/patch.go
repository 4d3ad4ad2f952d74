package kube

import (
	"encoding/json"
	"fmt"
	"slices"
)

// JSONPatchOp is one RFC 6902 operation. Value is raw so that a test for
// null can be written.
type JSONPatchOp struct {
	Op    string          `json:"op"`
	Path  string          `json:"path"`
	Value json.RawMessage `json:"value,omitempty"`
}

// MustJSON marshals v, which must be plain data (strings, numbers, maps,
// slices, structs of them): a failure is a programming error.
func MustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("marshal %T: %v", v, err))
	}
	return b
}

// AddFinalizerPatch adds finalizer to an object whose finalizers are
// current, as a JSON patch that first tests current: when the object
// changed since it was read (a stale cache), the patch fails instead of
// dropping or restoring someone else's finalizer.
func AddFinalizerPatch(current []string, finalizer string) []byte {
	var ops []JSONPatchOp
	if len(current) == 0 {
		ops = []JSONPatchOp{
			{Op: "test", Path: "/metadata/finalizers", Value: json.RawMessage("null")},
			{Op: "add", Path: "/metadata/finalizers", Value: MustJSON([]string{finalizer})},
		}
	} else {
		ops = []JSONPatchOp{
			{Op: "test", Path: "/metadata/finalizers", Value: MustJSON(current)},
			{Op: "add", Path: "/metadata/finalizers/-", Value: MustJSON(finalizer)},
		}
	}
	return MustJSON(ops)
}

// RemoveFinalizerPatch removes finalizer from an object whose finalizers
// are current, by index after a test that the index still holds it. It
// returns nil when finalizer is not in current.
func RemoveFinalizerPatch(current []string, finalizer string) []byte {
	i := slices.Index(current, finalizer)
	if i < 0 {
		return nil
	}
	path := fmt.Sprintf("/metadata/finalizers/%d", i)
	return MustJSON([]JSONPatchOp{
		{Op: "test", Path: path, Value: MustJSON(finalizer)},
		{Op: "remove", Path: path},
	})
}
