package kube

import "strings"

// SanitizeDriverName turns a CSI driver name into a name part Kubernetes
// accepts, the way the upstream sidecars do: every character outside
// [a-zA-Z0-9-] becomes '-', and an 'X' is appended when the result ends in
// '-'. "loopvol.csi.io" becomes "loopvol-csi-io". Finalizers and Lease names
// built from it match upstream's, so a cluster can switch in either
// direction.
func SanitizeDriverName(driver string) string {
	b := []byte(driver)
	for i, ch := range b {
		ok := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '-'
		if !ok {
			b[i] = '-'
		}
	}
	s := string(b)
	if s == "" || strings.HasSuffix(s, "-") {
		s += "X"
	}
	return s
}
