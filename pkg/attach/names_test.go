package attach

import "testing"

func TestNames(t *testing.T) {
	tests := []struct {
		driver, sanitized string
	}{
		{driver: "loopvol.csi.io", sanitized: "loopvol-csi-io"},
		{driver: "hostpath.csi.k8s.io", sanitized: "hostpath-csi-k8s-io"},
		{driver: "ends.with.dot.", sanitized: "ends-with-dot-X"},
	}
	for _, tc := range tests {
		t.Run(tc.driver, func(t *testing.T) {
			if got, want := FinalizerName(tc.driver), "external-attacher/"+tc.sanitized; got != want {
				t.Errorf("FinalizerName = %q, want %q", got, want)
			}
			if got, want := LeaseName(tc.driver), "external-attacher-leader-"+tc.sanitized; got != want {
				t.Errorf("LeaseName = %q, want %q", got, want)
			}
		})
	}
	// The literal names other tools and clusters already use.
	if FinalizerName(driver) != finalizer || NodeIDAnnotation != nodeIDAnn {
		t.Errorf("finalizer %q / annotation %q differ from the upstream names", FinalizerName(driver), NodeIDAnnotation)
	}
}
