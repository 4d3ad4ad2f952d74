package kube

import "testing"

func TestFinalizerPatches(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want string // "" for no patch
	}{
		{
			name: "add to no finalizers: test for null, then add the list",
			got:  AddFinalizerPatch(nil, "f"),
			want: `[{"op":"test","path":"/metadata/finalizers","value":null},{"op":"add","path":"/metadata/finalizers","value":["f"]}]`,
		},
		{
			name: "add to some: test the whole list, then append",
			got:  AddFinalizerPatch([]string{"a", "b"}, "f"),
			want: `[{"op":"test","path":"/metadata/finalizers","value":["a","b"]},{"op":"add","path":"/metadata/finalizers/-","value":"f"}]`,
		},
		{
			name: "remove: test the index, then remove it",
			got:  RemoveFinalizerPatch([]string{"a", "f", "b"}, "f"),
			want: `[{"op":"test","path":"/metadata/finalizers/1","value":"f"},{"op":"remove","path":"/metadata/finalizers/1"}]`,
		},
		{
			name: "remove an absent finalizer → no patch",
			got:  RemoveFinalizerPatch([]string{"a"}, "f"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if string(tc.got) != tc.want {
				t.Errorf("patch = %s\nwant    %s", tc.got, tc.want)
			}
		})
	}
}
