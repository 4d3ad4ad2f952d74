package attach

import (
	"testing"

	storagev1 "k8s.io/api/storage/v1"
)

func TestPatchBuilders(t *testing.T) {
	tests := []struct {
		name string
		got  []byte
		want string // "" for no patch
	}{
		{
			name: "VA metadata: finalizer and annotation with the resourceVersion precondition",
			got:  vaMetadataPatch(vaObj("va", "pv", withRV("42"), withFinalizers("other")), "f", "id"),
			want: `{"metadata":{"resourceVersion":"42","finalizers":["other","f"],"annotations":{"` + nodeIDAnn + `":"id"}}}`,
		},
		{
			name: "VA metadata already there → no patch",
			got:  vaMetadataPatch(vaObj("va", "pv", withFinalizers("f"), withNodeIDAnnotation("id")), "f", "id"),
		},
		{
			name: "attached: metadata replaced key by key, removed keys nulled",
			got: attachedPatch(vaObj("va", "pv", attached(map[string]string{"old": "1", "keep": "1"})),
				map[string]string{"keep": "2", "new": "3"}),
			want: `{"status":{"attached":true,"attachError":null,"attachmentMetadata":{"keep":"2","new":"3","old":null}}}`,
		},
		{
			name: "attached with no metadata where there was some → metadata nulled",
			got:  attachedPatch(vaObj("va", "pv", attached(map[string]string{"old": "1"})), nil),
			want: `{"status":{"attached":true,"attachError":null,"attachmentMetadata":null}}`,
		},
		{
			name: "already attached with the same metadata → no patch",
			got:  attachedPatch(vaObj("va", "pv", attached(map[string]string{"a": "b"})), map[string]string{"a": "b"}),
		},
		{
			name: "detached clears metadata and detachError",
			got: detachedPatch(vaObj("va", "pv", attached(map[string]string{"a": "b"}), func(va *storagev1.VolumeAttachment) {
				va.Status.DetachError = &storagev1.VolumeError{Message: "x"}
			})),
			want: `{"status":{"attached":false,"attachmentMetadata":null,"detachError":null}}`,
		},
		{
			name: "already detached → no patch",
			got:  detachedPatch(vaObj("va", "pv")),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == "" {
				if tc.got != nil {
					t.Errorf("patch = %s, want none", tc.got)
				}
				return
			}
			if got := recorder.Norm(string(tc.got)); got != recorder.Norm(tc.want) {
				t.Errorf("patch = %s\nwant    %s", got, recorder.Norm(tc.want))
			}
		})
	}
}
