package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/internal/harness/cluster"
	"github.com/loopvol/loopvol/internal/harness/testcert"
)

// sidecarHTTP is the controller sidecar's diagnostics endpoint (the pod
// shares the node's network: overlays/local, --http-endpoint=:9809).
const sidecarHTTP = "http://127.0.0.1:9809"

// webhookSecret is the Secret controller.yaml mounts for the webhook.
const webhookSecret = "loopvol-webhook-tls"

// testWebhook: the shipped ValidatingWebhookConfiguration in its Service
// form, as a user installs it. Before the certificate Secret exists the
// webhook waits and fails open (every scenario before this one made its
// claims so); with it, kubelet fills the mounted directory in, the sidecar
// writes the CA into the configuration's caBundle, and the API server
// reaches the webhook through the Service's endpoints: a claim larger than
// any pool and a class whose pool no node serves are refused with the
// webhook's message, a fitting claim passes. The Secret stays: the
// scenarios after this one run with the webhook answering.
func testWebhook(t *testing.T, c *cluster.Cluster) {
	ctx := context.Background()
	if cluster.NetNSNodeIP() == "" {
		t.Skip("the Service form needs a Node address (the test binary in its own network namespace: TestMain)")
	}
	if err := httpOK(ctx, sidecarHTTP+"/healthz/webhook"); err == nil || !strings.Contains(err.Error(), "waiting for the serving certificate") {
		t.Fatalf("before the Secret, /healthz/webhook: %v, want it waiting for the certificate", err)
	}
	if err := httpOK(ctx, sidecarHTTP+"/healthz"); err != nil {
		t.Fatalf("the sidecar is not healthy while the webhook waits for its certificate: %v", err)
	}

	pair := testcert.New(t, []string{"loopvol-webhook." + cluster.Namespace + ".svc"}, nil)
	ca := pair.CA
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: webhookSecret},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{testcert.CertFile: pair.Cert, testcert.KeyFile: pair.Key, testcert.CAFile: ca},
	}
	start := time.Now()
	if _, err := c.Client.CoreV1().Secrets(cluster.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Wait(ctx, "the webhook serving and its caBundle the Secret's CA", 3*time.Minute, func(ctx context.Context) (bool, error) {
		if httpOK(ctx, sidecarHTTP+"/healthz/webhook") != nil {
			return false, nil
		}
		vwc, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "loopvol-webhook", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, wh := range vwc.Webhooks {
			if !bytes.Equal(wh.ClientConfig.CABundle, ca) {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("Secret created → the webhook serving with the caBundle in place in %s (kubelet's secret volume sync, then the sidecar)", time.Since(start).Round(time.Millisecond))

	ns := namespace(t, c, "webhook")
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	denied := webhookRefusal(ctx, t, c, ns)
	if !apierrors.IsForbidden(denied) || !strings.Contains(denied.Error(), `admission webhook "pvc.loopvol.csi.io" denied the request`) ||
		!strings.Contains(denied.Error(), "largest pool can hold") || !strings.Contains(denied.Error(), "asked 100Ti") {
		t.Fatalf("the huge claim: %v, want the webhook's refusal with the sizes", denied)
	}
	t.Logf("refused: %v", denied)
	if _, err := c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "fits", "loopvol", "64Mi"), dry); err != nil {
		t.Fatalf("a claim that fits: %v", err)
	}
	class := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: "loopvol-nowhere"},
		Provisioner: cluster.DriverName,
		Parameters:  map[string]string{"pool": "nowhere"},
	}
	_, err := c.Client.StorageV1().StorageClasses().Create(ctx, class, dry)
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `no node serves pool "nowhere"`) {
		t.Fatalf("a class of a pool no node serves: %v, want the webhook's refusal", err)
	}
	t.Logf("refused: %v", err)

	reviews, err := reviewCount(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if reviews < 3 {
		t.Fatalf("loopvol_webhook_review_duration_seconds counts %d reviews, want at least the 3 above", reviews)
	}
	t.Logf("the sidecar's loopvol_webhook_review_duration_seconds counts %d reviews", reviews)
	deleteNamespace(ctx, t, c, ns)
}

// httpOK GETs url and returns nil on a 200, else an error with the body.
func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	rsp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer rsp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(rsp.Body)
	if rsp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", url, rsp.StatusCode, strings.TrimSpace(b.String()))
	}
	return nil
}

// reviewCount is how many reviews the sidecar's webhook has answered.
func reviewCount(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, sidecarHTTP+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	rsp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer rsp.Body.Close()
	n := 0
	s := bufio.NewScanner(rsp.Body)
	for s.Scan() {
		var v int
		if l := s.Text(); strings.HasPrefix(l, "loopvol_webhook_review_duration_seconds_count{") {
			if _, err := fmt.Sscan(l[strings.LastIndexByte(l, ' ')+1:], &v); err == nil {
				n += v
			}
		}
	}
	return n, s.Err()
}

// webhookRefusal waits until the API server reaches the webhook through
// its Service and returns the webhook's refusal of a claim larger than any
// pool (a dry run). Until the API server can call it (no endpoint yet, or
// a certificate it does not trust), the webhook fails open: the claim is
// admitted, and this tries again.
func webhookRefusal(ctx context.Context, t *testing.T, c *cluster.Cluster, ns string) error {
	t.Helper()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	var denied error
	if err := c.Wait(ctx, "a claim larger than any pool refused through the Service", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, denied = c.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, cluster.Claim(ns, "huge", "loopvol", "100Ti"), dry)
		return denied != nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	return denied
}
