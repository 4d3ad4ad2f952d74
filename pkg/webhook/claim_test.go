package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// countParses counts the calls of parseQuantity until the test ends.
func countParses(t *testing.T) *int {
	t.Helper()
	n := new(int)
	t.Cleanup(func() { parseQuantity = resource.ParseQuantity })
	parseQuantity = func(s string) (resource.Quantity, error) {
		*n++
		return resource.ParseQuantity(s)
	}
	return n
}

// rawClaimReview is the review of a claim of class "lv" whose
// requests.storage is the JSON value storage, with extra fields in spec
// and a status: about 430 bytes, as the API server or anyone else who can
// reach the port may send.
func rawClaimReview(storage, spec, status string) []byte {
	return []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1",` +
		`"kind":{"group":"","version":"v1","kind":"PersistentVolumeClaim"},"operation":"CREATE","namespace":"app","name":"data",` +
		`"object":{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"data","namespace":"app"},` +
		`"spec":{"storageClassName":"lv","accessModes":["ReadWriteOnce"],"resources":{"requests":{"storage":` + storage + `}` + spec + `}},` +
		`"status":{` + status + `}}}}`)
}

// TestReviewRefusesUnboundedQuantity: a quantity whose parse would cost
// seconds of CPU (a decimal exponent of millions of digits' worth, or a
// mantissa of thousands of digits) is denied with a 400 that says why,
// without resource.ParseQuantity ever seeing it; quantities of fields the
// webhook does not read are not parsed at all; ordinary and extreme but
// cheap ones still are. Each decode's time is logged, not asserted.
func TestReviewRefusesUnboundedQuantity(t *testing.T) {
	w := &Webhook{d: world(t, &fakeCSI{})}
	long := `"0.` + strings.Repeat("0", 4000) + `1"`
	for _, tc := range []struct {
		name         string
		storage      string // the JSON value of requests.storage
		spec, status string // more fields of the claim
		wantParses   int
		allowed      bool
		code         int32 // of the denial
		want         string
	}{
		{name: "tiny exponent", storage: `"1e-30000000"`, code: 400,
			want: `spec.resources.requests.storage: the quantity "1e-30000000" is refused unparsed: its exponent is beyond ±100`},
		{name: "huge exponent", storage: `"1e30000000"`, code: 400, want: `the quantity "1e30000000" is refused unparsed`},
		{name: "huge exponent, canonical as the API server writes it", storage: `"10e29999999"`, code: 400, want: `"10e29999999" is refused unparsed`},
		{name: "exponent past int64", storage: `"1E-99999999999999999999"`, code: 400, want: "refused unparsed: its exponent is beyond ±100"},
		{name: "bare number", storage: `1e-30000000`, code: 400, want: `"1e-30000000" is refused unparsed`},
		{name: "just past the bound", storage: `"1e-101"`, code: 400, want: "refused unparsed"},
		{name: "long mantissa", storage: long, code: 400, want: "is 4003 characters long, refused unparsed: a size takes at most 64"},
		{name: "unread fields are not parsed", storage: `"1Gi"`, spec: `,"limits":{"storage":"1e-30000000"}`,
			status: `"capacity":{"storage":"1e30000000"},"allocatedResources":{"storage":"1e-30000000"}`, wantParses: 1, allowed: true},
		{name: "other requests are not parsed", storage: `"1Gi"`, spec: `,"x":1`, wantParses: 1, allowed: true},
		{name: "a nanobyte", storage: `"1e-9"`, wantParses: 1, allowed: true},
		{name: "at the bound", storage: `"1e-100"`, wantParses: 1, allowed: true},
		{name: "exa suffix is no exponent", storage: `"10E"`, wantParses: 1, code: 403, want: "more than any volume can be"},
		{name: "not a quantity", storage: `"1e5x"`, wantParses: 1, code: 400, want: `the quantity "1e5x": quantities must match`},
		{name: "null", storage: `null`, allowed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parses := countParses(t)
			body := rawClaimReview(tc.storage, tc.spec, tc.status)
			rec := httptest.NewRecorder()
			start := time.Now()
			w.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
			t.Logf("%d-byte review with storage %.40s answered in %s", len(body), tc.storage, time.Since(start))
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			rsp := out.Response
			if rsp.Allowed != tc.allowed {
				t.Fatalf("allowed %v, want %v: %s", rsp.Allowed, tc.allowed, rec.Body)
			}
			if !tc.allowed && (rsp.Result == nil || rsp.Result.Code != tc.code || !strings.Contains(rsp.Result.Message, tc.want)) {
				t.Fatalf("result %+v, want code %d with %q", rsp.Result, tc.code, tc.want)
			}
			if *parses != tc.wantParses {
				t.Fatalf("resource.ParseQuantity called %d times, want %d", *parses, tc.wantParses)
			}
		})
	}
}

// TestDecodeClaim: the fields the decider reads come through, and nothing
// else is kept.
func TestDecodeClaim(t *testing.T) {
	raw, err := json.Marshal(claim("lv", 3*gi, "pv-a"))
	if err != nil {
		t.Fatal(err)
	}
	pvc, err := decodeClaim(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := claim("lv", 3*gi, "pv-a")
	if got, w := fmt.Sprintf("%s/%s %s %s", pvc.Namespace, pvc.Name, *pvc.Spec.StorageClassName, pvc.Spec.VolumeName),
		fmt.Sprintf("%s/%s %s %s", want.Namespace, want.Name, *want.Spec.StorageClassName, want.Spec.VolumeName); got != w {
		t.Errorf("decoded %s, want %s", got, w)
	}
	q := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if q.Value() != 3*gi {
		t.Errorf("request %s, want 3Gi", q.String())
	}
}
