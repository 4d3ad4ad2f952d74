package main

import (
	"errors"
	"flag"
	"fmt"
	"net"

	admissionregistrationv1 "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"

	"github.com/loopvol/loopvol/pkg/webhook"
)

// webhookConfig holds the flags of the admission webhook.
type webhookConfig struct {
	address       string
	certDir       string
	configuration string
}

// addFlags declares the webhook's flags.
func (c *webhookConfig) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.address, "webhook-address", ":9443", "webhook: host:port to serve admission reviews on, over HTTPS at "+webhook.Path+".")
	fs.StringVar(&c.certDir, "webhook-cert-dir", "/etc/loopvol/webhook-tls",
		"webhook: directory of the serving certificate, tls.crt and tls.key, and optionally ca.crt, as a mounted kubernetes.io/tls Secret holds them. "+
			"The files are read again every second: a rotated certificate is served without a restart.")
	fs.StringVar(&c.configuration, "webhook-configuration", "loopvol-webhook",
		"webhook: name of the ValidatingWebhookConfiguration whose caBundle the webhook keeps equal to ca.crt (or, without it, tls.crt); that object only is read and patched. Empty: leave it alone.")
}

// validate checks the webhook's flags; called only when it runs.
func (c *webhookConfig) validate(cfg *config) error {
	if _, _, err := net.SplitHostPort(c.address); err != nil {
		return fmt.Errorf("--webhook-address %q is not host:port: %w", c.address, err)
	}
	if c.certDir == "" {
		return errors.New("--webhook-cert-dir is empty")
	}
	if cfg.httpEndpoint != "" && cfg.httpEndpoint == c.address {
		return fmt.Errorf("--webhook-address and --http-endpoint are both %s", c.address)
	}
	return nil
}

// buildWebhook builds the admission webhook. Every replica serves (there is
// no Lease): the Service spreads the reviews over them. It reads the
// CSIStorageCapacity objects of $NAMESPACE, where the capacity controller
// writes them.
func buildWebhook(d *deps) (*runner, error) {
	c := &d.cfg.webhook
	ns := d.env("NAMESPACE")
	if ns == "" {
		return nil, errors.New("$NAMESPACE is empty: it names the namespace of the CSIStorageCapacity objects the webhook reads (set it from metadata.namespace with the downward API)")
	}
	cfg := webhook.Config{
		DriverName: d.driver,
		Informers:  d.informers,
		Namespace:  ns,
		CSI:        d.csi,
		Address:    c.address,
		CertDir:    c.certDir,
		ConfigName: c.configuration,
		Registerer: d.registry,
	}
	if c.configuration != "" {
		adm, err := admissionregistrationv1.NewForConfig(d.rest)
		if err != nil {
			return nil, err
		}
		cfg.Configs = adm.ValidatingWebhookConfigurations()
	}
	w, err := webhook.New(cfg)
	if err != nil {
		return nil, err
	}
	// Not in /healthz: the sidecar stays Ready while the webhook waits
	// for its certificate (the configuration fails open meanwhile).
	d.health.AddOwn("webhook", w.Ready)
	return &runner{run: w.Run}, nil
}
