package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/netutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
)

// caBundleResync is how often the caBundle is checked even when the CA did
// not change (someone may have reapplied the configuration with another).
const caBundleResync = time.Minute

// Webhook is the admission webhook server.
type Webhook struct {
	cfg     Config
	d       *decider
	metrics *metrics
	synced  []cache.InformerSynced
	cert    atomic.Pointer[tls.Certificate]
	ready   atomic.Bool
	// waiting is why the first certificate could not be loaded yet.
	waiting  atomic.Pointer[string]
	mu       sync.Mutex
	files    [3][]byte // tls.crt, tls.key, ca.crt as last loaded
	syncedCA []byte    // the caBundle last found or written
	// turns holds a token per review being read or judged
	// (MaxRequestsInFlight); nil (a Webhook built without New) is no
	// bound.
	turns chan struct{}
	// conns and peakConns count the open connections, now and at most.
	conns, peakConns atomic.Int64
}

// New builds the webhook and asks for its informers; Run serves it.
func New(cfg Config) (*Webhook, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.CertCheckInterval == 0 {
		cfg.CertCheckInterval = DefaultCertCheckInterval
	}
	if cfg.ClassCheckTimeout == 0 {
		cfg.ClassCheckTimeout = DefaultClassCheckTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout}, {&cfg.ReadTimeout, DefaultReadTimeout}, {&cfg.IdleTimeout, DefaultIdleTimeout}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	for _, n := range []struct {
		v   *int
		def int
	}{{&cfg.MaxHeaderBytes, DefaultMaxHeaderBytes}, {&cfg.MaxConnections, DefaultMaxConnections}, {&cfg.MaxRequestsInFlight, DefaultMaxRequestsInFlight}} {
		if *n.v == 0 {
			*n.v = n.def
		}
	}
	classes := cfg.Informers.StorageClasses()
	volumes := cfg.Informers.PersistentVolumes(kube.PVCapacity)
	sel := labels.SelectorFromSet(labels.Set{capacityDriverLabel: cfg.DriverName})
	capacities := cfg.Informers.CSIStorageCapacities(cfg.Namespace, sel)
	w := &Webhook{cfg: cfg, synced: []cache.InformerSynced{classes.HasSynced, volumes.HasSynced, capacities.HasSynced},
		turns: make(chan struct{}, cfg.MaxRequestsInFlight)}
	m, err := newMetrics(cfg.Registerer, func() float64 { return float64(w.conns.Load()) })
	if err != nil {
		return nil, err
	}
	w.metrics = m
	timeout := cfg.ClassCheckTimeout
	w.d = &decider{
		driver: cfg.DriverName, namespace: cfg.Namespace,
		classes: classes.GetStore(), volumes: volumes.GetStore(), capacities: capacities.GetStore(),
		csi: cfg.CSI,
		csiTimeout: func(ctx context.Context) (context.Context, context.CancelFunc) {
			return context.WithTimeout(ctx, timeout)
		},
	}
	return w, nil
}

// capacityDriverLabel is the capacity controller's driver label (the
// upstream name, pkg/capacity.DriverNameLabel).
const capacityDriverLabel = "csi.storage.k8s.io/drivername"

// Ready fails until the webhook serves with synced caches, and says so
// while it waits for its certificate.
func (w *Webhook) Ready() error {
	if why := w.waiting.Load(); why != nil {
		return fmt.Errorf("waiting for the serving certificate: %s", *why)
	}
	if !w.ready.Load() {
		return errors.New("not serving yet (loading the certificate, waiting for the caches)")
	}
	return nil
}

// certificateLog is how often awaitCertificate repeats what it waits for.
const certificateLog = time.Minute

// awaitCertificate loads the first certificate, retrying every
// CertCheckInterval while the files are missing or broken, and reports
// false when ctx ended first. A missing certificate is a state to wait in,
// not a failure: the Secret is often made after the controller pod (by
// cert-manager, by hand), and the webhook configuration fails open
// meanwhile. Exiting would restart the whole sidecar, and its attach,
// capacity and resizer controllers with it, for nothing.
func (w *Webhook) awaitCertificate(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	clk := w.cfg.Clock
	tick := clk.NewTicker(w.cfg.CertCheckInterval)
	defer tick.Stop()
	var said string
	var saidAt time.Time
	for {
		_, err := w.reload()
		if err == nil {
			if said != "" {
				logger.Info("Serving certificate found", "certDir", w.cfg.CertDir)
			}
			w.waiting.Store(nil)
			return true
		}
		why := err.Error()
		w.waiting.Store(&why)
		if why != said || clk.Since(saidAt) >= certificateLog {
			logger.Info("Waiting for the serving certificate; until it comes, the API server's calls fail and the webhook configuration's failurePolicy applies",
				"certDir", w.cfg.CertDir, "reason", why)
			said, saidAt = why, clk.Now()
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C():
		}
	}
}

// Run waits for the certificate and the caches, serves until ctx ends
// and meanwhile reloads the certificate and keeps the caBundle current.
func (w *Webhook) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("webhook")
	ctx = klog.NewContext(ctx, logger)
	if !w.awaitCertificate(ctx) {
		return nil
	}
	if !cache.WaitForCacheSync(ctx.Done(), w.synced...) {
		return nil
	}
	ln, err := net.Listen("tcp", w.cfg.Address)
	if err != nil {
		return fmt.Errorf("--webhook-address: %w", err)
	}
	// Connections beyond the limit wait in the listen queue until one
	// closes; the timeouts below make sure one does.
	ln = netutil.LimitListener(ln, w.cfg.MaxConnections)
	mux := http.NewServeMux()
	mux.Handle(Path, w)
	// HTTP/1.1 only, as controller-runtime's webhook server: a connection
	// then carries one review at a time, so MaxConnections bounds the
	// requests too. Over HTTP/2 one connection opens up to 250 streams,
	// each with a body of its own (and rapid reset, CVE-2023-44487, is that
	// class); the API server speaks HTTP/1.1 to webhooks just as well.
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	srv := &http.Server{
		Handler: mux,
		// Deadlines from the connection's accept (the TLS handshake is
		// bounded by the smaller of the first two), so a client that
		// stops sending is closed and what it sent is freed.
		ReadHeaderTimeout: w.cfg.ReadHeaderTimeout,
		ReadTimeout:       w.cfg.ReadTimeout,
		IdleTimeout:       w.cfg.IdleTimeout,
		MaxHeaderBytes:    w.cfg.MaxHeaderBytes,
		Protocols:         &protocols,
		ConnState:         w.connState,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return w.cert.Load(), nil },
		},
		BaseContext: func(net.Listener) context.Context { return ctx },
		// The server's own messages (TLS handshake errors of port
		// scanners, mostly) go to klog at V(4), not to stderr.
		ErrorLog: log.New(klogWriter{logger: logger}, "", 0),
	}
	logger.Info("Serving admission reviews", "address", ln.Addr().String(), "path", Path, "certDir", w.cfg.CertDir,
		"readHeaderTimeout", w.cfg.ReadHeaderTimeout, "readTimeout", w.cfg.ReadTimeout, "idleTimeout", w.cfg.IdleTimeout,
		"maxConnections", w.cfg.MaxConnections, "maxRequestsInFlight", w.cfg.MaxRequestsInFlight)
	errc := make(chan error, 1)
	go func() { errc <- srv.ServeTLS(ln, "", "") }()
	w.ready.Store(true)
	defer w.ready.Store(false)

	w.syncCABundle(ctx)
	clk := w.cfg.Clock
	tick := clk.NewTicker(w.cfg.CertCheckInterval)
	defer tick.Stop()
	lastResync := clk.Now()
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			return nil
		case err := <-errc:
			return fmt.Errorf("webhook server: %w", err)
		case <-tick.C():
			changed, err := w.reload()
			if err != nil {
				logger.Error(err, "Keeping the previous certificate")
			} else if changed {
				logger.Info("Certificate reloaded", "certDir", w.cfg.CertDir)
			}
			if changed || !w.caSynced() || clk.Since(lastResync) >= caBundleResync {
				lastResync = clk.Now()
				w.syncCABundle(ctx)
			}
		}
	}
}

// reload reads the certificate files and swaps in the pair when they
// changed; a broken new pair leaves the old one serving.
func (w *Webhook) reload() (bool, error) {
	var files [3][]byte
	for i, name := range []string{CertFile, KeyFile, CAFile} {
		data, err := os.ReadFile(filepath.Join(w.cfg.CertDir, name))
		if err != nil && (name != CAFile || !errors.Is(err, os.ErrNotExist)) {
			return false, fmt.Errorf("read the webhook certificate: %w", err)
		}
		files[i] = data
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cert.Load() != nil && bytes.Equal(files[0], w.files[0]) && bytes.Equal(files[1], w.files[1]) && bytes.Equal(files[2], w.files[2]) {
		return false, nil
	}
	pair, err := tls.X509KeyPair(files[0], files[1])
	if err != nil {
		return false, fmt.Errorf("webhook certificate %s, %s in %s: %w", CertFile, KeyFile, w.cfg.CertDir, err)
	}
	w.files = files
	w.cert.Store(&pair)
	return true, nil
}

// ca is the caBundle the API server needs: ca.crt, else tls.crt.
func (w *Webhook) ca() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.files[2]) > 0 {
		return w.files[2]
	}
	return w.files[0]
}

func (w *Webhook) caSynced() bool {
	if w.cfg.ConfigName == "" {
		return true
	}
	ca := w.ca()
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Equal(w.syncedCA, ca)
}

// syncCABundle sets the caBundle of every webhook of the configuration
// ConfigName to the CA, with one JSON patch that first tests each entry's
// name, and only when one differs.
func (w *Webhook) syncCABundle(ctx context.Context) {
	if w.cfg.ConfigName == "" {
		return
	}
	logger := klog.FromContext(ctx)
	ca := w.ca()
	vwc, err := w.cfg.Configs.Get(ctx, w.cfg.ConfigName, metav1.GetOptions{})
	if err != nil {
		logger.Error(err, "Cannot read the webhook configuration to check its caBundle", "configuration", w.cfg.ConfigName)
		return
	}
	var ops []kube.JSONPatchOp
	for i, wh := range vwc.Webhooks {
		if bytes.Equal(wh.ClientConfig.CABundle, ca) {
			continue
		}
		ops = append(ops,
			kube.JSONPatchOp{Op: "test", Path: fmt.Sprintf("/webhooks/%d/name", i), Value: kube.MustJSON(wh.Name)},
			kube.JSONPatchOp{Op: "add", Path: fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i), Value: kube.MustJSON(ca)})
	}
	if len(ops) > 0 {
		if _, err := w.cfg.Configs.Patch(ctx, w.cfg.ConfigName, types.JSONPatchType, kube.MustJSON(ops), metav1.PatchOptions{}); err != nil {
			logger.Error(err, "Cannot update the caBundle of the webhook configuration", "configuration", w.cfg.ConfigName)
			return
		}
		logger.Info("Updated the caBundle of the webhook configuration", "configuration", w.cfg.ConfigName, "webhooks", len(ops)/2)
	}
	w.mu.Lock()
	w.syncedCA = ca
	w.mu.Unlock()
}

// connState counts the open connections (a hijacked one is not the
// server's any more).
func (w *Webhook) connState(_ net.Conn, state http.ConnState) {
	switch state {
	case http.StateNew:
		n := w.conns.Add(1)
		for p := w.peakConns.Load(); n > p && !w.peakConns.CompareAndSwap(p, n); p = w.peakConns.Load() {
		}
	case http.StateClosed, http.StateHijacked:
		w.conns.Add(-1)
	}
}

// klogWriter passes net/http's server log lines to klog.
type klogWriter struct{ logger klog.Logger }

func (k klogWriter) Write(p []byte) (int, error) {
	k.logger.V(4).Info("HTTP server", "message", strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// ServeHTTP answers one AdmissionReview. A request that is no POST of a
// JSON AdmissionReview v1 with a request gets a 400 (405 for another
// method) with the reason as plain text; 503 when MaxRequestsInFlight
// reviews are being read and judged until this one's read deadline.
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	start := time.Now()
	if req.Method != http.MethodPost {
		http.Error(rw, "admission reviews are POSTed", http.StatusMethodNotAllowed)
		return
	}
	// A turn before the body is read: the bodies in memory are at most
	// MaxRequestsInFlight × MaxBodyBytes, however many clients send.
	// Waiting longer than ReadTimeout is pointless: the body's read
	// deadline has passed by then.
	if w.turns != nil {
		wait := time.NewTimer(w.cfg.ReadTimeout)
		select {
		case w.turns <- struct{}{}:
			wait.Stop()
			defer func() { <-w.turns }()
		case <-wait.C:
			http.Error(rw, fmt.Sprintf("busy: %d reviews are being read and judged; try again", cap(w.turns)), http.StatusServiceUnavailable)
			return
		case <-req.Context().Done():
			wait.Stop()
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(rw, req.Body, MaxBodyBytes))
	if err != nil {
		http.Error(rw, "malformed AdmissionReview: reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	review, err := decodeReview(body)
	if err != nil {
		http.Error(rw, "malformed AdmissionReview: "+err.Error(), http.StatusBadRequest)
		w.metrics.observe("", "", false, start)
		return
	}
	rsp := w.review(req.Context(), review.Request)
	defer w.metrics.observe(review.Request.Kind.Kind, string(review.Request.Operation), rsp.Allowed, start)
	rsp.UID = review.Request.UID
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: rsp})
	if err != nil {
		http.Error(rw, "encoding the response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(out)
}

// decodeReview parses an AdmissionReview v1 that carries a request.
func decodeReview(body []byte) (*admissionv1.AdmissionReview, error) {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, fmt.Errorf("not JSON of an AdmissionReview: %w", err)
	}
	if gv := admissionv1.SchemeGroupVersion.String(); review.APIVersion != gv || review.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("apiVersion %q, kind %q: want %s AdmissionReview (admissionReviewVersions: [v1])", review.APIVersion, review.Kind, gv)
	}
	if review.Request == nil {
		return nil, errors.New("no request")
	}
	if review.Request.UID == "" {
		return nil, errors.New("request has no uid")
	}
	return &review, nil
}

// review judges one request; anything not of the driver is allowed.
func (w *Webhook) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	logger := klog.FromContext(ctx)
	var v verdict
	var err error
	switch {
	case req.Kind.Group == "" && req.Kind.Kind == "PersistentVolumeClaim" && req.SubResource == "":
		var pvc, old *corev1.PersistentVolumeClaim
		if pvc, err = decodeClaim(req.Object.Raw); err != nil {
			break
		}
		switch req.Operation {
		case admissionv1.Create:
			v = w.d.claimCreate(pvc)
		case admissionv1.Update:
			if old, err = decodeClaim(req.OldObject.Raw); err == nil {
				v = w.d.claimExpand(old, pvc)
			}
		}
	case req.Kind.Group == storagev1.GroupName && req.Kind.Kind == "StorageClass" && req.Operation == admissionv1.Create:
		var sc storagev1.StorageClass
		if err = decode(req.Object.Raw, &sc); err == nil {
			v = w.d.classCreate(ctx, &sc)
		}
	}
	if err != nil {
		return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest,
			Message: fmt.Sprintf("%s of the review: %v", req.Kind.Kind, err),
		}}
	}
	rsp := &admissionv1.AdmissionResponse{Allowed: v.reason == "", Warnings: v.warnings}
	if v.reason != "" {
		logger.V(2).Info("Denied", "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "operation", req.Operation, "reason", v.reason)
		rsp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusForbidden, Reason: metav1.StatusReasonForbidden, Message: v.reason}
	}
	return rsp
}

// decode parses an embedded object; an empty one is an error.
func decode(raw []byte, into any) error {
	if len(raw) == 0 {
		return errors.New("the object is missing")
	}
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("the object is not valid JSON: %w", err)
	}
	return nil
}
