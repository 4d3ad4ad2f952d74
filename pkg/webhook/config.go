package webhook

import (
	"context"
	"errors"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/loopvol/loopvol/internal/kube"
)

// Path is the HTTP path the webhook serves every review at.
const Path = "/validate"

// Files of the certificate directory, as a mounted kubernetes.io/tls Secret
// holds them. CAFile is optional (cert-manager and most issuers write it);
// without it the serving certificate itself is the caBundle (self-signed).
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// DefaultCertCheckInterval is how often the certificate files are read
// again to see whether they changed.
const DefaultCertCheckInterval = time.Second

// DefaultClassCheckTimeout bounds the GetCapacity call a StorageClass costs;
// it stays well below the webhook configuration's timeoutSeconds.
const DefaultClassCheckTimeout = 2 * time.Second

// Bounds of the HTTPS server against slow, stalled and idle clients (the
// port answers anyone who can reach it, docs/security.md). The API server
// gives up on a review after the configuration's timeoutSeconds (3 and 5 s
// in the base, at most 30), so a request still being read after a few
// seconds is no API server's, and holding it only holds its memory.
const (
	// DefaultReadHeaderTimeout bounds the TLS handshake and the request
	// headers, a few hundred bytes from the API server.
	DefaultReadHeaderTimeout = 5 * time.Second
	// DefaultReadTimeout bounds the whole request, headers and body; a
	// 7 MiB review takes milliseconds on a cluster network.
	DefaultReadTimeout = 10 * time.Second
	// DefaultIdleTimeout is how long a kept-alive connection may wait for
	// its next request. It is longer than the API server's own 90 s
	// (client-go's IdleConnTimeout) so that the API server, not the
	// webhook, closes its idle connections: a POST written to a
	// connection the server has just closed fails unretried, and the
	// review fails open.
	DefaultIdleTimeout = 120 * time.Second
	// DefaultMaxHeaderBytes bounds the request headers (net/http's own
	// default is 1 MiB per connection).
	DefaultMaxHeaderBytes = 32 << 10
	// DefaultMaxConnections bounds the open connections; more wait to be
	// accepted. The API server keeps up to 25 idle connections to a
	// webhook (client-go's MaxIdleConnsPerHost), so this leaves room for
	// a few API servers and their bursts. An open connection costs tens of
	// KiB; the memory of the bodies is bounded by MaxRequestsInFlight.
	DefaultMaxConnections = 128
	// DefaultMaxRequestsInFlight bounds the reviews read and judged at
	// once, and so the memory their bodies hold (at most MaxBodyBytes
	// each: 112 MiB, within the sidecar's 256 MiB limit). A review is
	// answered from caches in well under a millisecond, or within
	// DefaultClassCheckTimeout for a class, so 16 answer thousands a
	// second; more wait for a turn until their read deadline.
	DefaultMaxRequestsInFlight = 16
)

// MaxBodyBytes is the largest AdmissionReview accepted: the API server's
// own limit on a request body is 3 MiB, and a review carries the object
// twice.
const MaxBodyBytes = 7 << 20

// CapacityGetter is the driver call the StorageClass check needs
// (csiclient.Client has it).
type CapacityGetter interface {
	GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error)
}

// WebhookConfigs reads and patches ValidatingWebhookConfigurations; the
// webhook touches only the one named Config.ConfigName.
type WebhookConfigs interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*admissionregistrationv1.ValidatingWebhookConfiguration, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*admissionregistrationv1.ValidatingWebhookConfiguration, error)
}

// Config configures the webhook.
type Config struct {
	// DriverName is the CSI driver whose classes, claims and volumes are
	// checked; every other one is allowed untouched.
	DriverName string
	// Informers are the process's shared informers.
	Informers *kube.Informers
	// Namespace holds the capacity controller's CSIStorageCapacity objects.
	Namespace string
	// CSI is the driver, asked for the capacity of a new class's pool.
	CSI CapacityGetter
	// Address is host:port to serve HTTPS on.
	Address string
	// CertDir holds tls.crt, tls.key and optionally ca.crt.
	CertDir string
	// ConfigName is the ValidatingWebhookConfiguration whose caBundle is
	// kept equal to the CA; "" leaves every configuration alone.
	ConfigName string
	// Configs patches ConfigName; needed when it is set.
	Configs WebhookConfigs
	// CertCheckInterval: how often the files are re-read (0: the default).
	CertCheckInterval time.Duration
	// ClassCheckTimeout bounds the GetCapacity of a class (0: the default).
	ClassCheckTimeout time.Duration
	// ReadHeaderTimeout, ReadTimeout, IdleTimeout, MaxHeaderBytes,
	// MaxConnections and MaxRequestsInFlight bound what a client can hold
	// (0: the Default of each).
	ReadHeaderTimeout   time.Duration
	ReadTimeout         time.Duration
	IdleTimeout         time.Duration
	MaxHeaderBytes      int
	MaxConnections      int
	MaxRequestsInFlight int
	// Registerer receives the webhook's metrics. Optional.
	Registerer prometheus.Registerer
	// Clock drives the certificate checks and the caBundle resync.
	// Optional: nil is the real clock; tests step a fake one instead of
	// waiting. (A review's latency is always measured in real time.)
	Clock clock.WithTicker
}

// Validate reports the first field that cannot work.
func (c *Config) Validate() error {
	switch {
	case c.DriverName == "":
		return errors.New("webhook: DriverName is empty")
	case c.Informers == nil:
		return errors.New("webhook: Informers is nil")
	case c.Namespace == "":
		return errors.New("webhook: Namespace (of the CSIStorageCapacity objects) is empty")
	case c.CSI == nil:
		return errors.New("webhook: CSI is nil")
	case c.Address == "":
		return errors.New("webhook: Address is empty")
	case c.CertDir == "":
		return errors.New("webhook: CertDir is empty")
	case c.ConfigName != "" && c.Configs == nil:
		return errors.New("webhook: ConfigName is set but Configs is nil")
	case c.CertCheckInterval < 0 || c.ClassCheckTimeout < 0:
		return errors.New("webhook: CertCheckInterval and ClassCheckTimeout must not be negative")
	case c.ReadHeaderTimeout < 0 || c.ReadTimeout < 0 || c.IdleTimeout < 0:
		return errors.New("webhook: ReadHeaderTimeout, ReadTimeout and IdleTimeout must not be negative")
	case c.MaxHeaderBytes < 0 || c.MaxConnections < 0 || c.MaxRequestsInFlight < 0:
		return errors.New("webhook: MaxHeaderBytes, MaxConnections and MaxRequestsInFlight must not be negative")
	}
	return nil
}
