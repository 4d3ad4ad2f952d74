package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Quantities are parsed only within these bounds. resource.ParseQuantity
// takes time exponential in the digits of a decimal exponent: 1e-30000000
// costs seconds of CPU (it rounds through 10^30000000), and a 300-byte
// review may carry it. No size of a volume needs more: with at most 64
// characters the mantissa is below 1e64, so an exponent under -73 is less
// than the nanobyte the API server rounds up to, and one over 19 is more
// than 8Ei, which no volume can be (maxSize).
const (
	maxQuantityLength   = 64
	maxQuantityExponent = 100
)

// parseQuantity is resource.ParseQuantity; a test counts its calls.
var parseQuantity = resource.ParseQuantity

// claimJSON is the part of a PersistentVolumeClaim the webhook reads.
// Decoding into corev1.PersistentVolumeClaim would parse every quantity
// of the object (limits, status.capacity, status.allocatedResources, any
// other request) with no bound; here encoding/json skips what the webhook
// does not read in linear time, and the one quantity it reads goes
// through boundedQuantity.
type claimJSON struct {
	Metadata struct {
		Name         string `json:"name"`
		GenerateName string `json:"generateName"`
		Namespace    string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		VolumeName       string  `json:"volumeName"`
		StorageClassName *string `json:"storageClassName"`
		Resources        struct {
			Requests map[corev1.ResourceName]json.RawMessage `json:"requests"`
		} `json:"resources"`
	} `json:"spec"`
}

// decodeClaim parses the fields of an embedded claim the webhook judges.
func decodeClaim(raw []byte) (*corev1.PersistentVolumeClaim, error) {
	var c claimJSON
	if err := decode(raw, &c); err != nil {
		return nil, err
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.Metadata.Name, GenerateName: c.Metadata.GenerateName, Namespace: c.Metadata.Namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			VolumeName:       c.Spec.VolumeName,
			StorageClassName: c.Spec.StorageClassName,
		},
	}
	if v, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
		q, err := boundedQuantity(v)
		if err != nil {
			return nil, fmt.Errorf("spec.resources.requests.storage: %w", err)
		}
		if q != nil {
			pvc.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: *q}
		}
	}
	return pvc, nil
}

// boundedQuantity parses a JSON quantity as Quantity.UnmarshalJSON does
// (a string or a bare number, null for none), after refusing one longer
// than maxQuantityLength or with a decimal exponent beyond
// ±maxQuantityExponent, without parsing it.
func boundedQuantity(v json.RawMessage) (*resource.Quantity, error) {
	v = bytes.TrimSpace(v)
	if string(v) == "null" {
		return nil, nil
	}
	if l := len(v); l >= 2 && v[0] == '"' && v[l-1] == '"' {
		v = v[1 : l-1]
	}
	text := strings.TrimSpace(string(v))
	if len(text) > maxQuantityLength {
		return nil, fmt.Errorf("the quantity %q... is %d characters long, refused unparsed: a size takes at most %d",
			text[:16], len(text), maxQuantityLength)
	}
	if exp, ok := decimalExponent(text); ok && (exp == "" || !within(exp, maxQuantityExponent)) {
		return nil, fmt.Errorf("the quantity %q is refused unparsed: its exponent is beyond ±%d, and no size of a volume is "+
			"(one is less than 8Ei, and the API server rounds anything below a nanobyte up to one)", text, maxQuantityExponent)
	}
	q, err := parseQuantity(text)
	if err != nil {
		return nil, fmt.Errorf("the quantity %q: %w", text, err)
	}
	return &q, nil
}

// decimalExponent returns the digits (and sign) after the e or E of a
// quantity's decimal exponent, and whether it has one; "" when they do not
// fit an int64. A trailing E is the exa suffix, not an exponent.
func decimalExponent(text string) (string, bool) {
	i := strings.LastIndexAny(text, "eE")
	if i <= 0 || i == len(text)-1 {
		return "", false
	}
	exp := text[i+1:]
	digits := strings.TrimLeft(exp, "+-")
	if len(exp)-len(digits) > 1 || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return "", false // not an exponent: the parser refuses it
	}
	if _, err := strconv.ParseInt(exp, 10, 64); err != nil {
		return "", true
	}
	return exp, true
}

// within tells whether the integer exp lies in [-limit, limit].
func within(exp string, limit int64) bool {
	n, err := strconv.ParseInt(exp, 10, 64)
	return err == nil && -limit <= n && n <= limit
}
