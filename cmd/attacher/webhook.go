package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"time"

	admissionregistrationv1 "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"

	"github.com/loopvol/loopvol/pkg/webhook"
)

// webhookConfig holds the flags of the admission webhook.
type webhookConfig struct {
	address       string
	certDir       string
	configuration string
	// Bounds against slow, stalled and idle clients of the port.
	readHeaderTimeout   time.Duration
	readTimeout         time.Duration
	idleTimeout         time.Duration
	maxHeaderBytes      int
	maxConnections      int
	maxRequestsInFlight int
}

// addFlags declares the webhook's flags.
func (c *webhookConfig) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.address, "webhook-address", ":9443", "webhook: host:port to serve admission reviews on, over HTTPS at "+webhook.Path+".")
	fs.StringVar(&c.certDir, "webhook-cert-dir", "/etc/loopvol/webhook-tls",
		"webhook: directory of the serving certificate, tls.crt and tls.key, and optionally ca.crt, as a mounted kubernetes.io/tls Secret holds them. "+
			"The files are read again every second: a rotated certificate is served without a restart.")
	fs.StringVar(&c.configuration, "webhook-configuration", "loopvol-webhook",
		"webhook: name of the ValidatingWebhookConfiguration whose caBundle the webhook keeps equal to ca.crt (or, without it, tls.crt); that object only is read and patched. Empty: leave it alone.")
	// The API server gives up on a review after the configuration's
	// timeoutSeconds (3 and 5 s in the base): the bounds close what no
	// API server still waits for (docs/webhook.md, Serving).
	fs.DurationVar(&c.readHeaderTimeout, "webhook-read-header-timeout", webhook.DefaultReadHeaderTimeout,
		"webhook: time a connection has for its TLS handshake and the headers of a request; then it is closed.")
	fs.DurationVar(&c.readTimeout, "webhook-read-timeout", webhook.DefaultReadTimeout,
		"webhook: time a connection has to send a whole request, headers and body; then it is closed and the memory of what it sent is freed.")
	fs.DurationVar(&c.idleTimeout, "webhook-idle-timeout", webhook.DefaultIdleTimeout,
		"webhook: time a kept-alive connection may wait for its next request; then it is closed. Keep it above the API server's 90 s, so that the API server closes its idle connections first.")
	fs.IntVar(&c.maxHeaderBytes, "webhook-max-header-bytes", webhook.DefaultMaxHeaderBytes,
		"webhook: largest request headers accepted, in bytes; larger gets 431.")
	fs.IntVar(&c.maxConnections, "webhook-max-connections", webhook.DefaultMaxConnections,
		"webhook: open connections at most; more wait to be accepted. The API server keeps up to 25 idle connections to the webhook: allow that many per API server, and more.")
	fs.IntVar(&c.maxRequestsInFlight, "webhook-max-requests-inflight", webhook.DefaultMaxRequestsInFlight,
		fmt.Sprintf("webhook: reviews read and judged at once; more wait for a turn until their read deadline, then get 503. "+
			"Bodies in memory are at most this many times %d MiB.", webhook.MaxBodyBytes>>20))
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
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--webhook-read-header-timeout", c.readHeaderTimeout}, {"--webhook-read-timeout", c.readTimeout}, {"--webhook-idle-timeout", c.idleTimeout}} {
		if d.v <= 0 {
			return fmt.Errorf("%s=%s: want a positive duration (an unbounded wait is what it bounds)", d.flag, d.v)
		}
	}
	for _, n := range []struct {
		flag string
		v    int
	}{{"--webhook-max-header-bytes", c.maxHeaderBytes}, {"--webhook-max-connections", c.maxConnections}, {"--webhook-max-requests-inflight", c.maxRequestsInFlight}} {
		if n.v <= 0 {
			return fmt.Errorf("%s=%d: want a positive number", n.flag, n.v)
		}
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

		ReadHeaderTimeout:   c.readHeaderTimeout,
		ReadTimeout:         c.readTimeout,
		IdleTimeout:         c.idleTimeout,
		MaxHeaderBytes:      c.maxHeaderBytes,
		MaxConnections:      c.maxConnections,
		MaxRequestsInFlight: c.maxRequestsInFlight,
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
