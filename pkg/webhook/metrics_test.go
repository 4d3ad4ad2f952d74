package webhook

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
)

// TestReviewLatencyIsRecorded: every answer, allowed, denied or malformed,
// is one observation of loopvol_webhook_review_duration_seconds with its
// labels.
func TestReviewLatencyIsRecorded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg, func() float64 { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	w := &Webhook{d: world(t, &fakeCSI{}), metrics: m}
	for _, body := range [][]byte{
		reviewBody(t, pvcRequest(t, admissionv1.Create, claim("lv", gi, ""), nil)),
		reviewBody(t, pvcRequest(t, admissionv1.Create, claim("lv", 100*gi, ""), nil)),
		[]byte("{"),
	} {
		w.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
	}
	if got := testutil.CollectAndCount(m.reviews); got != 3 {
		t.Fatalf("%d series, want 3", got)
	}
	for _, tc := range []struct {
		labels []string
		want   int
	}{
		{[]string{"PersistentVolumeClaim", "CREATE", "true"}, 1},
		{[]string{"PersistentVolumeClaim", "CREATE", "false"}, 1},
		{[]string{"", "", "false"}, 1},
	} {
		if n := histogramCount(t, reg, tc.labels); n != tc.want {
			t.Errorf("%v: %d observations, want %d", tc.labels, n, tc.want)
		}
	}
}

func histogramCount(t *testing.T, reg *prometheus.Registry, labels []string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range mt.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if got["kind"] == labels[0] && got["operation"] == labels[1] && got["allowed"] == labels[2] {
				return int(mt.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
