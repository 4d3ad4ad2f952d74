package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/loopvol/loopvol/internal/harness/testcert"
	"github.com/loopvol/loopvol/test/internal/attacherproc"
)

// The webhook's names, as deploy/kubernetes/base/admission/webhook.yaml
// and the sidecar's defaults spell them.
const (
	whConfig   = "loopvol-webhook"
	whFailOpen = "failed-open.validating.webhook.admission.k8s.io/"
)

// whRig is TestWebhook's world: a capRig (two tmpfs pools in zones of
// their own, published by the capacity controller), the shipped webhook
// configuration pointed at a sidecar with --controllers=webhook on
// loopback, and a client that collects the API server's warnings.
type whRig struct {
	*capRig
	addr    string // the webhook's host:port
	certDir string
	ca      []byte // the CA the certificate in certDir is signed with
	class   string // WaitForFirstConsumer, pool cap-a, expandable
	webhook *attacher
	warned  *warnings
	user    kubernetes.Interface // the administrator, warnings collected
	whKube  string               // kubeconfig with exactly rbac-webhook.yaml
}

// TestWebhook runs the validating webhook against the real kube-apiserver,
// which calls it over TLS at a URL on loopback: each denial with its
// message, a valid claim passing, a malformed review, 200 claims at once,
// a rotated certificate and the webhook stopped. The sidecar runs as a
// user holding exactly deploy/kubernetes/base/rbac-webhook.yaml.
func TestWebhook(t *testing.T) {
	w := newWebhookRig(t)
	t.Run("class before any node reported: a warning", w.testClassWarning)
	w.startCapacity("capacity", nil, "--capacity-ownerref-level=-1")
	w.waitCapacity()
	t.Run("claim larger than every pool", w.testClaimTooLarge)
	t.Run("claim sizes no volume can have", w.testClaimOverflow)
	t.Run("valid claim passes", w.testValidClaim)
	t.Run("expansion no pool of the zone can hold", w.testExpansion)
	t.Run("class whose pool no node serves", w.testClassPool)
	t.Run("malformed review", w.testMalformed)
	t.Run("200 claims at once", w.testConcurrent)
	t.Run("certificate rotated", w.testRotation)
	t.Run("webhook stopped", w.testStopped)
}

func newWebhookRig(t *testing.T) *whRig {
	w := &whRig{capRig: newCapRig(t), warned: &warnings{}}
	cfg := rest.CopyConfig(w.env.Config)
	cfg.QPS, cfg.Burst = 1000, 2000
	cfg.WarningHandler = w.warned
	w.user = admClient(t, cfg)
	w.createNode("a", w.za)
	w.createNode("b", w.zb)
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	w.class = w.nodeName("wh")
	if _, err := w.client.StorageV1().StorageClasses().Create(w.ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: w.class, Labels: w.labels()}, Provisioner: driverName,
		VolumeBindingMode: &mode, AllowVolumeExpansion: ptr.To(true), Parameters: map[string]string{"pool": "cap-a"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.deleteClaims)

	w.certDir = t.TempDir()
	w.ca = testcert.Loopback(t).Write(t, w.certDir)
	w.addr = attacherproc.FreeAddress(t)
	w.whKube = w.restrictedKubeconfig("loopvol-webhook-"+w.id, w.ns, "rbac-webhook.yaml")
	t.Setenv("NAMESPACE", w.ns)
	w.startWebhook()
	w.applyConfig()
	return w
}

// startWebhook starts (or restarts, on the same address) the sidecar.
func (w *whRig) startWebhook() {
	w.webhook = w.startSidecar("webhook", w.whKube, "--controllers=webhook", "--webhook-address="+w.addr,
		"--webhook-cert-dir="+w.certDir, "--webhook-configuration="+whConfig)
}

// applyConfig creates the shipped ValidatingWebhookConfiguration with a URL
// clientConfig instead of the Service and without a caBundle (the sidecar
// writes it), narrowed to the test's namespace so no other test's claims
// reach it. Its deletion is registered here, after the sidecar started, so
// it runs while the webhook still answers and can be waited for.
func (w *whRig) applyConfig() {
	t := w.t
	data, err := os.ReadFile(filepath.Join(admissionDir(t), "webhook.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc, _, _ := bytes.Cut(data, []byte("\n---\n"))
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(doc, &vwc); err != nil {
		t.Fatal(err)
	}
	if vwc.Name != whConfig || len(vwc.Webhooks) != 2 {
		t.Fatalf("webhook.yaml holds %s with %d webhooks", vwc.Name, len(vwc.Webhooks))
	}
	for i := range vwc.Webhooks {
		h := &vwc.Webhooks[i]
		if h.ClientConfig.Service == nil || h.ClientConfig.Service.Path == nil || len(h.ClientConfig.CABundle) != 0 {
			t.Fatalf("webhook %s: want a Service with a path and no caBundle", h.Name)
		}
		h.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: ptr.To("https://" + w.addr + *h.ClientConfig.Service.Path)}
		if h.NamespaceSelector != nil {
			h.NamespaceSelector.MatchExpressions = append(h.NamespaceSelector.MatchExpressions, metav1.LabelSelectorRequirement{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{w.ns},
			})
		}
	}
	vwc.Labels = w.labels()
	if _, err := w.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(w.ctx, &vwc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ValidatingWebhookConfiguration %s (left over from another test?): %v", whConfig, err)
	}
	t.Cleanup(w.deleteConfig)
}

// deleteConfig deletes the configuration and waits until the API server no
// longer calls the webhook: an oversized dry-run claim is admitted again.
func (w *whRig) deleteConfig() {
	ctx := context.WithoutCancel(w.ctx)
	err := w.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, whConfig, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		w.t.Errorf("cleanup: delete ValidatingWebhookConfiguration %s: %v", whConfig, err)
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		_, last = w.createClaim(ctx, "probe", "4Gi", true)
		return last == nil, nil
	})
	if err != nil {
		w.t.Errorf("cleanup: the API server still calls the webhook %s after its configuration was deleted: %v", shortWait, last)
	}
}

// createClaim creates claim e2e-<id>-<suffix> of the class in the test's
// namespace (a dry run when dry), as the administrator.
func (w *whRig) createClaim(ctx context.Context, suffix, size string, dry bool) (*corev1.PersistentVolumeClaim, error) {
	opts := metav1.CreateOptions{}
	if dry {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return w.user.CoreV1().PersistentVolumeClaims(w.ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + w.id + "-" + suffix, Labels: w.labels()},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: ptr.To(w.class),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}, opts)
}

// deleteClaims deletes the test's claims (finalizers first: no
// kube-controller-manager removes pvc-protection here).
func (w *whRig) deleteClaims() {
	ctx := context.WithoutCancel(w.ctx)
	claims := w.client.CoreV1().PersistentVolumeClaims(w.ns)
	list, err := claims.List(ctx, w.listOptions())
	if err != nil {
		w.t.Errorf("cleanup: list claims: %v", err)
		return
	}
	for _, c := range list.Items {
		_, err := claims.Patch(ctx, c.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		ignoreNotFound(w.t, err)
		ignoreNotFound(w.t, claims.Delete(ctx, c.Name, metav1.DeleteOptions{}))
	}
}

// waitCapacity waits until the capacity controller published both zones
// of the class with a maximumVolumeSize.
func (w *whRig) waitCapacity() {
	w.t.Helper()
	err := wait.PollUntilContextTimeout(w.ctx, 100*time.Millisecond, longWait, true, func(ctx context.Context) (bool, error) {
		objs, err := w.capacityObjects(ctx)
		if err != nil {
			return false, err
		}
		zones := map[string]bool{}
		for _, o := range objs {
			if o.StorageClassName == w.class && o.MaximumVolumeSize != nil {
				zones[zoneOf(&o)] = true
			}
		}
		return zones[w.za] && zones[w.zb], nil
	})
	if err != nil {
		w.t.Fatalf("the capacity of class %s was never published in both zones: %v", w.class, err)
	}
}

// largest is the class's largest maximumVolumeSize and its zone's free
// capacity, as published.
func (w *whRig) largest() (maxSize int64, free map[string]int64) {
	w.t.Helper()
	objs, err := w.capacityObjects(w.ctx)
	if err != nil {
		w.t.Fatal(err)
	}
	free = map[string]int64{}
	for _, o := range objs {
		if o.StorageClassName == w.class && o.MaximumVolumeSize != nil {
			maxSize = max(maxSize, o.MaximumVolumeSize.Value())
			free[zoneOf(&o)] = o.Capacity.Value()
		}
	}
	return maxSize, free
}

// denied wants err to be the webhook's denial containing every string.
func denied(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("admitted; want a denial with %q", want)
	}
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `admission webhook "`) {
		t.Fatalf("want the webhook's denial, got %v", err)
	}
	for _, s := range want {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("denial %q lacks %q", err, s)
		}
	}
}

func quantity(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }

func (w *whRig) testClassWarning(t *testing.T) {
	// The webhook is up once the sidecar wrote the caBundle and the API
	// server trusts it: until then the call fails open, without the
	// warning.
	w.warned.take()
	var got []string
	err := wait.PollUntilContextTimeout(w.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		_, err := w.user.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
			ObjectMeta: metav1.ObjectMeta{Name: w.nodeName("early")}, Provisioner: driverName, Parameters: map[string]string{"pool": "nosuch"},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err
		}
		got = w.warned.take()
		return len(got) > 0, nil
	})
	if err != nil {
		t.Fatalf("a class created before any node reported was never warned about: %v (log:\n%s)", err, tail(w.webhook.Log(), 3000))
	}
	want := fmt.Sprintf(`pool "nosuch" of StorageClass %s is not checked: no node has reported capacity for %s yet (no CSIStorageCapacity object in namespace %s)`,
		w.nodeName("early"), driverName, w.ns)
	if len(got) != 1 || !strings.Contains(got[0], want) {
		t.Fatalf("warnings %q, want one with %q", got, want)
	}
	t.Logf("warning: %s", got[0])
}

func (w *whRig) testClaimTooLarge(t *testing.T) {
	largest, _ := w.largest()
	_, err := w.createClaim(w.ctx, "big", "1Gi", false)
	denied(t, err, "largest pool can hold "+quantity(largest), "asked 1Gi", fmt.Sprintf("StorageClass %q", w.class),
		"of its 2 topology segments", "Ask for at most "+quantity(largest))
	t.Logf("denial: %v", err)
}

// testClaimOverflow: sizes past an int64 of bytes wrapped when converted
// (1e19 became 0) and were admitted while 8Ei was denied; each is denied,
// through the real API server, with the size asked and the largest pool.
func (w *whRig) testClaimOverflow(t *testing.T) {
	largest, _ := w.largest()
	for i, size := range []string{"1e19", "9223372036854775808", "1e100", "8Ei"} {
		_, err := w.createClaim(w.ctx, fmt.Sprintf("overflow-%d", i), size, true)
		denied(t, err, "more than any volume can be", "a size must be less than 9223372036854775807 bytes",
			"Ask for at most "+quantity(largest))
		t.Logf("%s: %v", size, err)
	}
}

func (w *whRig) testValidClaim(t *testing.T) {
	largest, _ := w.largest()
	if _, err := w.createClaim(w.ctx, "fits", quantity(largest), false); err != nil {
		t.Fatalf("a claim of exactly the largest pool's size: %v", err)
	}
	if _, err := w.createClaim(w.ctx, "small", "16Mi", false); err != nil {
		t.Fatalf("a small claim: %v", err)
	}
}

func (w *whRig) testExpansion(t *testing.T) {
	v := w.createVolume("grow", w.class, w.za, capVolumeSize)
	t.Cleanup(func() { w.deleteVolume(v) })
	name := "e2e-" + w.id + "-grow"
	claims := w.user.CoreV1().PersistentVolumeClaims(w.ns)
	size := resource.NewQuantity(capVolumeSize, resource.BinarySI).String()
	pvc, err := claims.Create(w.ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: w.labels()},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: ptr.To(w.class), VolumeName: v.pv,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ref := fmt.Sprintf(`{"spec":{"claimRef":{"kind":"PersistentVolumeClaim","apiVersion":"v1","namespace":%q,"name":%q,"uid":%q}}}`, w.ns, name, pvc.UID)
	if _, err := w.client.CoreV1().PersistentVolumes().Patch(w.ctx, v.pv, types.MergePatchType, []byte(ref), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	status := fmt.Sprintf(`{"status":{"phase":"Bound","accessModes":["ReadWriteOnce"],"capacity":{"storage":%q}}}`, size)
	if _, err := claims.Patch(w.ctx, name, types.MergePatchType, []byte(status), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	grow := func(to string) error {
		_, err := claims.Patch(w.ctx, name, types.MergePatchType, []byte(fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, to)), metav1.PatchOptions{})
		return err
	}
	// The webhook reads the volume from its cache: wait until it sees it
	// (until then it cannot know the zone and admits the expansion, so
	// the probe is a dry run).
	var last error
	err = wait.PollUntilContextTimeout(w.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		_, last = claims.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"resources":{"requests":{"storage":"1Gi"}}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil, nil
	})
	if err != nil {
		t.Fatalf("an expansion to 1Gi was never refused: %v", err)
	}
	_, free := w.largest()
	err = grow("1Gi")
	denied(t, err, "no pool of the volume's zone can hold the expansion", "asks for 1Gi", "more than its volume "+v.pv+" holds ("+size,
		zoneKey+"="+w.za+") has "+quantity(free[w.za]), "Ask for at most "+quantity(capVolumeSize+free[w.za]))
	t.Logf("denial: %v", err)
	if err := grow(resource.NewQuantity(2*capVolumeSize, resource.BinarySI).String()); err != nil {
		t.Fatalf("an expansion that fits the zone's pool: %v", err)
	}
}

func (w *whRig) testClassPool(t *testing.T) {
	classes := w.user.StorageV1().StorageClasses()
	_, err := classes.Create(w.ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: w.nodeName("nosuch"), Labels: w.labels()}, Provisioner: driverName, Parameters: map[string]string{"pool": "nosuch"},
	}, metav1.CreateOptions{})
	denied(t, err, fmt.Sprintf(`no node serves pool "nosuch" of StorageClass %s`, w.nodeName("nosuch")), "reports 0 bytes", `add pool "nosuch" to the nodes first`)
	t.Logf("denial: %v", err)
	w.warned.take()
	name := w.nodeName("served")
	if _, err := classes.Create(w.ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: w.labels()}, Provisioner: driverName, Parameters: map[string]string{"pool": "cap-b"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a class of a served pool: %v", err)
	}
	t.Cleanup(func() {
		ignoreNotFound(t, w.client.StorageV1().StorageClasses().Delete(context.WithoutCancel(w.ctx), name, metav1.DeleteOptions{}))
	})
	if got := w.warned.take(); len(got) > 0 {
		t.Errorf("a class of a served pool drew warnings %q", got)
	}
}

// httpsClient trusts ca only and keeps connections alive.
func httpsClient(ca []byte) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 16,
	}}
}

func (w *whRig) testMalformed(t *testing.T) {
	c := httpsClient(w.ca)
	for _, tc := range []struct{ body, want string }{
		{"{", "malformed AdmissionReview: not JSON of an AdmissionReview"},
		{`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}`, `want admission.k8s.io/v1 AdmissionReview`},
		{`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, "malformed AdmissionReview: no request"},
	} {
		rsp, err := c.Post("https://"+w.addr+"/validate", "application/json", strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(rsp.Body)
		rsp.Body.Close()
		if rsp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), tc.want) {
			t.Errorf("%s: status %d %q, want 400 with %q", tc.body, rsp.StatusCode, body, tc.want)
		}
	}
	// Still serving, the same process.
	if _, err := w.createClaim(w.ctx, "after-malformed", "1Gi", true); err == nil {
		t.Fatal("the webhook no longer refuses after malformed reviews")
	}
	if strings.Contains(w.webhook.Log(), "panic") {
		t.Fatal("the webhook's log shows a panic")
	}
}

// percentiles returns p50, p99 and the maximum of d (sorted in place).
func percentiles(d []time.Duration) (p50, p99, top time.Duration) {
	slices.Sort(d)
	return d[len(d)/2], d[(len(d)*99+99)/100-1], d[len(d)-1]
}

func (w *whRig) testConcurrent(t *testing.T) {
	const n = 200
	lat := make([]time.Duration, n)
	var mu sync.Mutex
	var refused []string
	err := parallel(w.ctx, n, n, func(ctx context.Context, i int) error {
		size := "16Mi"
		if i%2 == 1 {
			size = "1Gi" // refused
		}
		start := time.Now()
		_, err := w.createClaim(ctx, fmt.Sprintf("many-%03d", i), size, false)
		lat[i] = time.Since(start)
		switch {
		case i%2 == 0 && err != nil:
			return fmt.Errorf("claim %d of 16Mi: %w", i, err)
		case i%2 == 1 && err == nil:
			return fmt.Errorf("claim %d of 1Gi admitted", i)
		case i%2 == 1 && !strings.Contains(err.Error(), "largest pool can hold"):
			return fmt.Errorf("claim %d of 1Gi: %w", i, err)
		case err != nil:
			mu.Lock()
			refused = append(refused, err.Error())
			mu.Unlock()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p50, p99, top := percentiles(lat)
	t.Logf("%d claims created at once through the API server (half admitted, half refused, %d refusals): create p50 %s, p99 %s, max %s",
		n, len(refused), p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond), top.Round(10*time.Microsecond))

	// The webhook alone: reviews of a claim of the class posted straight
	// to it over kept-alive TLS connections, 4 at a time.
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "bench", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "PersistentVolumeClaim"}, Operation: admissionv1.Create,
			Namespace: w.ns, Name: "bench", Object: runtime.RawExtension{Raw: []byte(mustJSON(t, &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "bench", Namespace: w.ns},
				Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: ptr.To(w.class),
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
			}))},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, conc := range []int{1, 4} {
		w.postReviews(t, body, conc)
	}
}

// postReviews posts 4000 copies of body straight to the webhook, conc at a
// time over kept-alive connections, and logs the latency.
func (w *whRig) postReviews(t *testing.T, body []byte, conc int) {
	c := httpsClient(w.ca)
	const reviews = 4000
	direct := make([]time.Duration, reviews)
	err := parallel(w.ctx, reviews, conc, func(ctx context.Context, i int) error {
		start := time.Now()
		rsp, err := c.Post("https://"+w.addr+"/validate", "application/json", bytes.NewReader(body))
		if err != nil {
			return err
		}
		out, _ := io.ReadAll(rsp.Body)
		rsp.Body.Close()
		direct[i] = time.Since(start)
		if rsp.StatusCode != 200 || !bytes.Contains(out, []byte(`"allowed":false`)) {
			return fmt.Errorf("review %d: %d %s", i, rsp.StatusCode, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p50, p99, top := percentiles(direct[200:]) // the first ones set up connections
	t.Logf("%d reviews posted to the webhook, %d at a time: p50 %s, p99 %s, max %s",
		reviews, conc, p50.Round(time.Microsecond), p99.Round(time.Microsecond), top.Round(time.Microsecond))
}

// caBundles returns the caBundle of every webhook of the configuration.
func (w *whRig) caBundles() [][]byte {
	vwc, err := w.client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(w.ctx, whConfig, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	var out [][]byte
	for _, h := range vwc.Webhooks {
		out = append(out, h.ClientConfig.CABundle)
	}
	return out
}

func (w *whRig) testRotation(t *testing.T) {
	for i, b := range w.caBundles() {
		if !bytes.Equal(b, w.ca) {
			t.Fatalf("webhook %d: the caBundle is not the CA the sidecar serves with", i)
		}
	}
	pid := w.webhook.Pid()
	old := w.ca
	w.ca = testcert.Loopback(t).Write(t, w.certDir)
	err := wait.PollUntilContextTimeout(w.ctx, 100*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		for _, b := range w.caBundles() {
			if !bytes.Equal(b, w.ca) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the sidecar never put the new CA into the caBundle: %v", err)
	}
	// The API server calls the webhook with the new CA: the refusals go
	// on.
	err = wait.PollUntilContextTimeout(w.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		_, err := w.createClaim(ctx, "rotated", "1Gi", true)
		return err != nil && strings.Contains(err.Error(), "largest pool can hold"), nil
	})
	if err != nil {
		t.Fatalf("the webhook was never called again after the rotation: %v", err)
	}
	for i := range 20 {
		if _, err := w.createClaim(w.ctx, "rotated", "1Gi", true); err == nil || !strings.Contains(err.Error(), "largest pool can hold") {
			t.Fatalf("review %d after the rotation: %v", i, err)
		}
		if _, err := w.createClaim(w.ctx, fmt.Sprintf("rotated-%d", i), "16Mi", false); err != nil {
			t.Fatalf("claim %d after the rotation: %v", i, err)
		}
	}
	if _, err := httpsClient(old).Post("https://"+w.addr+"/validate", "application/json", strings.NewReader("{}")); err == nil {
		t.Error("the old CA still verifies the served certificate")
	}
	if w.webhook.Pid() != pid || !strings.Contains(w.webhook.Log(), "Certificate reloaded") {
		t.Error("the sidecar restarted or never reloaded the certificate")
	}
}

func (w *whRig) testStopped(t *testing.T) {
	if err := w.webhook.Stop(); err != nil {
		t.Logf("stop: %v", err)
	}
	// failurePolicy Ignore: the oversized claim is created.
	c, err := w.createClaim(w.ctx, "while-down", "1Gi", false)
	if err != nil {
		t.Fatalf("a claim while the webhook is down: %v", err)
	}
	t.Logf("warnings to the client while the webhook is down: %q (the API server sends none for a webhook that failed open)", w.warned.take())
	// What shows it is the audit event's failed-open annotation.
	var found string
	err = wait.PollUntilContextTimeout(w.ctx, 200*time.Millisecond, shortWait, true, func(context.Context) (bool, error) {
		found = failedOpen(t, w.env.AuditLogPath, w.ns, c.Name)
		return found != "", nil
	})
	if err != nil {
		t.Fatalf("no audit event of the claim's create says the webhook failed open: %v", err)
	}
	t.Logf("audit annotation: %s", found)

	// Back on the same address: refusing again, for the cleanup's wait.
	w.startWebhook()
	err = wait.PollUntilContextTimeout(w.ctx, 100*time.Millisecond, shortWait, true, func(ctx context.Context) (bool, error) {
		_, err := w.createClaim(ctx, "back", "1Gi", true)
		return err != nil, nil
	})
	if err != nil {
		t.Fatalf("the restarted webhook never refused: %v", err)
	}
}

// failedOpen finds the audit event of the create of claim ns/name and
// returns its failed-open annotation ("" when there is none yet).
func failedOpen(t *testing.T, path, ns, name string) string {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.Contains(line, []byte(name)) {
			continue
		}
		var ev struct {
			Verb      string `json:"verb"`
			Stage     string `json:"stage"`
			ObjectRef *struct {
				Resource, Namespace, Name string
			} `json:"objectRef"`
			Annotations map[string]string `json:"annotations"`
		}
		if json.Unmarshal(line, &ev) != nil || ev.ObjectRef == nil || ev.Verb != "create" || ev.ObjectRef.Resource != "persistentvolumeclaims" ||
			ev.ObjectRef.Namespace != ns || ev.ObjectRef.Name != name {
			continue
		}
		for k, v := range ev.Annotations {
			if strings.HasPrefix(k, whFailOpen) && strings.Contains(v, "pvc.loopvol.csi.io") {
				return k + "=" + v
			}
		}
	}
	return ""
}
