package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/loopvol/loopvol/internal/harness/testcert"
	"github.com/loopvol/loopvol/internal/kube"
)

func reviewBody(t *testing.T, req *admissionv1.AdmissionRequest) []byte {
	t.Helper()
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func raw(t *testing.T, obj any) runtime.RawExtension {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return runtime.RawExtension{Raw: b}
}

func pvcRequest(t *testing.T, op admissionv1.Operation, obj, old any) *admissionv1.AdmissionRequest {
	r := &admissionv1.AdmissionRequest{
		UID: "u-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "PersistentVolumeClaim"},
		Operation: op, Namespace: "app", Name: "data", Object: raw(t, obj),
	}
	if old != nil {
		r.OldObject = raw(t, old)
	}
	return r
}

func TestServeHTTP(t *testing.T) {
	w := &Webhook{d: world(t, &fakeCSI{})}
	for _, tc := range []struct {
		name       string
		method     string
		body       []byte
		code       int
		wantText   string // in the plain-text body (errors)
		allowed    bool
		wantReason string
	}{
		{name: "valid claim", body: reviewBody(t, pvcRequest(t, admissionv1.Create, claim("lv", gi, ""), nil)), code: 200, allowed: true},
		{name: "claim too large", body: reviewBody(t, pvcRequest(t, admissionv1.Create, claim("lv", 7*gi, ""), nil)), code: 200,
			wantReason: "largest pool can hold 6Gi"},
		{name: "expansion too large", body: reviewBody(t, pvcRequest(t, admissionv1.Update, claim("lv", 11*gi, "pv-a"), claim("lv", 2*gi, "pv-a"))), code: 200,
			wantReason: "no pool of the volume's zone can hold the expansion"},
		{name: "other kinds allowed", body: reviewBody(t, &admissionv1.AdmissionRequest{UID: "u-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Operation: admissionv1.Create, Object: raw(t, map[string]any{})}),
			code: 200, allowed: true},
		{name: "not JSON", body: []byte("{"), code: 400, wantText: "malformed AdmissionReview: not JSON"},
		{name: "empty body", body: nil, code: 400, wantText: "malformed AdmissionReview"},
		{name: "v1beta1", body: []byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`), code: 400, wantText: `apiVersion "admission.k8s.io/v1beta1"`},
		{name: "no request", body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`), code: 400, wantText: "no request"},
		{name: "no uid", body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}`), code: 400, wantText: "no uid"},
		{name: "GET", method: http.MethodGet, code: 405, wantText: "POSTed"},
		{name: "object not JSON", code: 200, wantReason: "PersistentVolumeClaim of the review: the object is not valid JSON",
			body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"PersistentVolumeClaim"},"operation":"CREATE","object":"nope"}}`)},
		{name: "object missing", code: 200, wantReason: "the object is missing",
			body: []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","kind":{"group":"","version":"v1","kind":"PersistentVolumeClaim"},"operation":"CREATE"}}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			rec := httptest.NewRecorder()
			w.ServeHTTP(rec, httptest.NewRequest(method, Path, bytes.NewReader(tc.body)))
			if rec.Code != tc.code {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.code, rec.Body)
			}
			if tc.code != 200 {
				if !strings.Contains(rec.Body.String(), tc.wantText) {
					t.Fatalf("body %q lacks %q", rec.Body, tc.wantText)
				}
				return
			}
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || out.Response == nil || out.Response.UID != "u-1" {
				t.Fatalf("response %s", rec.Body)
			}
			if out.Response.Allowed != tc.allowed {
				t.Fatalf("allowed %v, want %v: %s", out.Response.Allowed, tc.allowed, rec.Body)
			}
			if tc.wantReason != "" && (out.Response.Result == nil || !strings.Contains(out.Response.Result.Message, tc.wantReason)) {
				t.Fatalf("result %+v lacks %q", out.Response.Result, tc.wantReason)
			}
		})
	}
}

func freeAddress(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRunRotatesCertificate serves over TLS, rotates the certificate files
// to a new CA and checks that new connections get the new certificate
// without a restart and that the configuration's caBundle follows, with
// exactly one get and one patch of that one object per change.
func TestRunRotatesCertificate(t *testing.T) {
	dir := t.TempDir()
	ca1 := testcert.Loopback(t).Write(t, dir)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "loopvol-webhook"},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "pvc.loopvol.csi.io"}, {Name: "storageclass.loopvol.csi.io"}},
	}
	other := &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "other"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "x.example.com"}}}
	client := fake.NewClientset(vwc, other)
	addr := freeAddress(t)
	ctx, clk, _, _ := start(t, Config{
		DriverName: testDriver, Informers: kube.NewInformers(client, 0), Namespace: "loopvol", CSI: &fakeCSI{},
		Address: addr, CertDir: dir, ConfigName: "loopvol-webhook",
		Configs: client.AdmissionregistrationV1().ValidatingWebhookConfigurations(),
	})

	post := func(ca []byte) error {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}, Timeout: 5 * time.Second}
		rsp, err := c.Post("https://"+addr+Path, "application/json", bytes.NewReader(reviewBody(t, pvcRequest(t, admissionv1.Create, claim("lv", gi, ""), nil))))
		if err != nil {
			return err
		}
		defer rsp.Body.Close()
		body, _ := io.ReadAll(rsp.Body)
		if rsp.StatusCode != 200 || !strings.Contains(string(body), `"allowed":true`) {
			t.Fatalf("status %d: %s", rsp.StatusCode, body)
		}
		return nil
	}
	waitCA := func(ca []byte) {
		t.Helper()
		err := stepUntil(ctx, clk, func(ctx context.Context) (bool, error) {
			got, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "loopvol-webhook", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, wh := range got.Webhooks {
				if !bytes.Equal(wh.ClientConfig.CABundle, ca) {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("caBundle never became the CA: %v", err)
		}
	}
	if err := stepUntil(ctx, clk, func(context.Context) (bool, error) {
		return post(ca1) == nil, nil
	}); err != nil {
		t.Fatalf("never served with the first CA: %v", err)
	}
	waitCA(ca1)

	ca2 := testcert.Loopback(t).Write(t, dir)
	if err := stepUntil(ctx, clk, func(context.Context) (bool, error) {
		return post(ca2) == nil, nil
	}); err != nil {
		t.Fatalf("never served the rotated certificate: %v", err)
	}
	if err := post(ca1); err == nil {
		t.Fatal("the old CA still verifies the served certificate after the rotation")
	}
	waitCA(ca2)

	var patches int
	for _, a := range client.Actions() {
		if a.GetResource().Resource != "validatingwebhookconfigurations" {
			continue
		}
		switch a.GetVerb() {
		case "get":
		case "patch":
			patches++
		default:
			t.Errorf("unexpected %s of validatingwebhookconfigurations", a.GetVerb())
		}
		if n := a.(interface{ GetName() string }).GetName(); n != "loopvol-webhook" {
			t.Errorf("%s of configuration %q: only loopvol-webhook may be touched", a.GetVerb(), n)
		}
	}
	if patches != 2 {
		t.Errorf("%d patches of the configuration, want 2 (one per CA)", patches)
	}
	if got, _ := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "other", metav1.GetOptions{}); len(got.Webhooks[0].ClientConfig.CABundle) != 0 {
		t.Error("another configuration's caBundle was changed")
	}
}

func TestReloadKeepsOldPairOnBrokenFiles(t *testing.T) {
	dir := t.TempDir()
	testcert.Loopback(t).Write(t, dir)
	w := &Webhook{cfg: Config{CertDir: dir}}
	if changed, err := w.reload(); err != nil || !changed {
		t.Fatalf("first load: changed %v, %v", changed, err)
	}
	first := w.cert.Load()
	if err := os.WriteFile(filepath.Join(dir, KeyFile), []byte("half-written"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := w.reload(); err == nil || !strings.Contains(err.Error(), "tls.crt, tls.key") {
		t.Fatalf("broken key: %v", err)
	}
	if w.cert.Load() != first {
		t.Fatal("a broken pair replaced the serving one")
	}
	if changed, err := w.reload(); err == nil || changed {
		t.Fatalf("still broken: changed %v, %v", changed, err)
	}
}

// BenchmarkServeHTTP is one review's cost in the handler: decoding,
// deciding from the caches, encoding.
func BenchmarkServeHTTP(b *testing.B) {
	t := &testing.T{}
	w := &Webhook{d: world(t, &fakeCSI{})}
	body := reviewBody(t, pvcRequest(t, admissionv1.Create, claim("lv", 7*gi, ""), nil))
	for b.Loop() {
		rec := httptest.NewRecorder()
		w.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, bytes.NewReader(body)))
		if rec.Code != 200 {
			b.Fatal(rec.Code)
		}
	}
}

// TestRunWaitsForTheCertificate: started before its Secret is mounted, the
// webhook neither exits nor serves; Ready says what it waits for; once the
// files appear it serves with them.
func TestRunWaitsForTheCertificate(t *testing.T) {
	dir := t.TempDir()
	client := fake.NewClientset()
	addr := freeAddress(t)
	ctx, clk, w, done := start(t, Config{
		DriverName: testDriver, Informers: kube.NewInformers(client, 0), Namespace: "loopvol", CSI: &fakeCSI{},
		Address: addr, CertDir: dir,
	})
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		err := w.Ready()
		return err != nil && strings.Contains(err.Error(), "waiting for the serving certificate") && strings.Contains(err.Error(), CertFile), nil
	}); err != nil {
		t.Fatalf("Ready never said it waits for %s: %v", CertFile, w.Ready())
	}
	// Two more minutes of checks, each of them failing again (each
	// records why anew), end neither the wait nor Run.
	for range 2 * int(certificateLog/DefaultCertCheckInterval) {
		before := w.waiting.Load()
		clk.Step(DefaultCertCheckInterval)
		eventually(t, "another check of the certificate files", func() bool { return w.waiting.Load() != before })
	}
	select {
	case err := <-done:
		t.Fatalf("Run ended without a certificate: %v", err)
	default:
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("listening without a certificate")
	}

	ca := testcert.Loopback(t).Write(t, dir)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	if err := stepUntil(ctx, clk, func(context.Context) (bool, error) {
		rsp, err := c.Post("https://"+addr+Path, "application/json", bytes.NewReader(reviewBody(t, pvcRequest(t, admissionv1.Create, claim("lv", gi, ""), nil))))
		if err != nil {
			return false, nil
		}
		rsp.Body.Close()
		return rsp.StatusCode == http.StatusOK, nil
	}); err != nil {
		t.Fatalf("never served once the certificate came: %v", err)
	}
	if err := w.Ready(); err != nil {
		t.Fatalf("serving, but Ready: %v", err)
	}
}

// stepUntil polls cond every 10 ms, for 30 s at most, and steps clk by the
// certificate check interval before each poll: the webhook checks its
// files when the clock says so, not when real time has passed.
func stepUntil(ctx context.Context, clk *testingclock.FakeClock, cond func(context.Context) (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		clk.Step(DefaultCertCheckInterval)
		return cond(ctx)
	})
}

// eventually waits until cond holds, polling every millisecond, and fails
// t after 30 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 30*time.Second, true,
		func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%s: not reached after 30s", what)
	}
}

// start builds the webhook of cfg on a fake clock and runs it, and its
// informers, until the test ends; Run must then have returned nil. It
// returns the test's context, the clock, the webhook and what Run
// returned (once it has).
func start(t *testing.T, cfg Config) (context.Context, *testingclock.FakeClock, *Webhook, <-chan error) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	cfg.Clock = clk
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Informers.Start(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return ctx, clk, w, done
}
