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
	}
	return nil
}
