package kube

import "testing"

func TestSanitizeDriverName(t *testing.T) {
	tests := []struct {
		driver, want string
	}{
		{driver: "loopvol.csi.io", want: "loopvol-csi-io"},
		{driver: "hostpath.csi.k8s.io", want: "hostpath-csi-k8s-io"},
		{driver: "ends.with.dot.", want: "ends-with-dot-X"},
		{driver: "UPPER_case-9", want: "UPPER-case-9"},
		{driver: "", want: "X"},
	}
	for _, tc := range tests {
		if got := SanitizeDriverName(tc.driver); got != tc.want {
			t.Errorf("SanitizeDriverName(%q) = %q, want %q", tc.driver, got, tc.want)
		}
	}
}
