package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// webhookConfiguration is the ValidatingWebhookConfiguration the sidecar
// keeps the caBundle of (its --webhook-configuration default).
const webhookConfiguration = "loopvol-webhook"

// policyPrefix starts the name of every ValidatingAdmissionPolicy loopvol ships.
const policyPrefix = "loopvol-"

// webhookState is the webhook configuration and the Services it calls.
type webhookState struct {
	config *admissionregistrationv1.ValidatingWebhookConfiguration
	// services are "namespace/name"; ready counts their ready endpoints.
	services []string
	ready    int
}

func (e *env) webhookState(ctx context.Context) (*webhookState, error) {
	cfg, err := e.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhookConfiguration, metav1.GetOptions{})
	if err != nil {
		if err = ignoreNotFound(err); err != nil {
			return nil, fmt.Errorf("get ValidatingWebhookConfiguration %s: %w", webhookConfiguration, err)
		}
		return &webhookState{}, nil
	}
	s := &webhookState{config: cfg}
	for _, wh := range cfg.Webhooks {
		svc := wh.ClientConfig.Service
		if svc == nil || slices.Contains(s.services, svc.Namespace+"/"+svc.Name) {
			continue
		}
		s.services = append(s.services, svc.Namespace+"/"+svc.Name)
		n, err := e.readyEndpoints(ctx, svc.Namespace, svc.Name)
		if err != nil {
			return nil, err
		}
		s.ready += n
	}
	return s, nil
}

// readyEndpoints counts the ready endpoints of a Service's EndpointSlices.
func (e *env) readyEndpoints(ctx context.Context, ns, name string) (int, error) {
	slices, err := e.kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return 0, fmt.Errorf("list the EndpointSlices of Service %s/%s: %w", ns, name, err)
	}
	n := 0
	for _, s := range slices.Items {
		if s.Labels[discoveryv1.LabelServiceName] != name {
			continue
		}
		for _, ep := range s.Endpoints {
			// An unknown readiness counts as ready, as the API says
			// consumers should take it.
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				n += len(ep.Addresses)
			}
		}
	}
	return n, nil
}

func (e *env) webhook(ctx context.Context) (WebhookReport, error) {
	s, err := e.webhookState(ctx)
	if err != nil {
		return WebhookReport{}, err
	}
	r := WebhookReport{Name: webhookConfiguration, Found: s.config != nil, Services: s.services, ReadyEndpoints: s.ready}
	if s.config != nil {
		r.CABundle = len(s.config.Webhooks) > 0
		for _, wh := range s.config.Webhooks {
			r.CABundle = r.CABundle && len(wh.ClientConfig.CABundle) > 0
		}
	}
	return r, nil
}

// summary is the webhook's line in status, and its tone.
func (r WebhookReport) summary() (string, tone) {
	if !r.Found {
		return fmt.Sprintf("WEBHOOK %s: not found", r.Name), warn
	}
	t := good
	ca := "caBundle set"
	if !r.CABundle {
		ca, t = "caBundle missing", bad
	}
	if r.ReadyEndpoints == 0 {
		t = bad
	}
	return fmt.Sprintf("WEBHOOK %s: Service %s, %d ready endpoint%s, %s", r.Name,
		strings.Join(r.Services, ","), r.ReadyEndpoints, pick(r.ReadyEndpoints == 1, "", "s"), ca), t
}

func (e *env) policies(ctx context.Context) ([]PolicyReport, error) {
	ps, err := e.kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ValidatingAdmissionPolicies: %w", err)
	}
	bs, err := e.kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ValidatingAdmissionPolicyBindings: %w", err)
	}
	var out []PolicyReport
	for _, p := range ps.Items {
		if !strings.HasPrefix(p.Name, policyPrefix) {
			continue
		}
		r := PolicyReport{Name: p.Name}
		for _, b := range bs.Items {
			if b.Spec.PolicyName == p.Name {
				r.Bindings = append(r.Bindings, b.Name)
			}
		}
		r.Bound = len(r.Bindings) > 0
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b PolicyReport) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// parseCABundle parses a caBundle: one or more PEM certificates, nothing else.
func parseCABundle(b []byte) ([]*x509.Certificate, error) {
	if len(b) == 0 {
		return nil, errors.New("empty")
	}
	var certs []*x509.Certificate
	for rest := b; len(strings.TrimSpace(string(rest))) > 0; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("not PEM")
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a PEM block of type %q, not CERTIFICATE", block.Type)
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, cert)
	}
	return certs, nil
}

// defaultCertDir is the sidecar's --webhook-cert-dir default.
const defaultCertDir = "/etc/loopvol/webhook-tls"

// certDirFlag is the sidecar's flag naming the serving certificate's directory.
const certDirFlag = "--webhook-cert-dir"

// servingSecrets names the Secrets that the Pods behind Service ns/name
// mount at the directory the sidecar serves its certificate from (its
// --webhook-cert-dir): the certificate the API server meets when it calls
// the webhook, whatever the overlay or chart named the Secret.
func (e *env) servingSecrets(ctx context.Context, ns, name string) ([]string, error) {
	svc, err := e.kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get Service %s/%s: %w", ns, name, err)
	}
	if len(svc.Spec.Selector) == 0 {
		return nil, nil
	}
	pods, err := e.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: labels.Set(svc.Spec.Selector).String()})
	if err != nil {
		return nil, fmt.Errorf("list the Pods of Service %s/%s: %w", ns, name, err)
	}
	var out []string
	for _, p := range pods.Items {
		for _, c := range p.Spec.Containers {
			dir, ok := flagValue(containerArgs(c), certDirFlag)
			if !ok {
				dir = defaultCertDir
			}
			for _, m := range c.VolumeMounts {
				if path.Clean(m.MountPath) != path.Clean(dir) {
					continue
				}
				for _, v := range p.Spec.Volumes {
					if v.Name == m.Name && v.Secret != nil && !slices.Contains(out, v.Secret.SecretName) {
						out = append(out, v.Secret.SecretName)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// flagValue is the value of flag (--name=value or --name value, or with
// one dash, as Go's flag packages take them) in args.
func flagValue(args []string, flag string) (string, bool) {
	short := strings.TrimPrefix(flag, "-")
	for i, a := range args {
		for _, f := range []string{flag, short} {
			if v, ok := strings.CutPrefix(a, f+"="); ok {
				return v, true
			}
			if a == f && i+1 < len(args) {
				return args[i+1], true
			}
		}
	}
	return "", false
}

// boolFlag says whether the boolean flag is set in args (--name,
// --name=true, or with one dash).
func boolFlag(args []string, flag string) bool {
	short := strings.TrimPrefix(flag, "-")
	for _, a := range args {
		for _, f := range []string{flag, short} {
			if a == f || a == f+"=true" {
				return true
			}
		}
	}
	return false
}

// checkServingCert judges the certificate and key of a kubernetes.io/tls
// Secret as the API server will when it calls webhooks through Service
// ns/svc: the key is the certificate's, and the certificate is valid now,
// names <svc>.<ns>.svc and chains to each webhook's caBundle. It returns
// the problems, and the certificate's last day when it has none.
func checkServingCert(secret *corev1.Secret, ns, svc string, webhooks []admissionregistrationv1.ValidatingWebhook, now time.Time) (problems []string, until time.Time) {
	where := "Secret " + secret.Namespace + "/" + secret.Name
	crt, key := secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey]
	chain, err := parseCABundle(crt)
	if err != nil {
		return []string{where + ": " + corev1.TLSCertKey + " " + err.Error()}, time.Time{}
	}
	if _, err := tls.X509KeyPair(crt, key); err != nil {
		return []string{where + ": " + corev1.TLSPrivateKeyKey + " is not the key of " + corev1.TLSCertKey + ": " + err.Error()}, time.Time{}
	}
	leaf := chain[0]
	if now.After(leaf.NotAfter) {
		return []string{fmt.Sprintf("%s: the serving certificate expired %s", where, leaf.NotAfter.UTC().Format(time.DateOnly))}, time.Time{}
	}
	intermediates := x509.NewCertPool()
	for _, c := range chain[1:] {
		intermediates.AddCert(c)
	}
	host := svc + "." + ns + ".svc"
	// Webhooks with the same caBundle fail the same way: one line each way.
	var reasons []string
	refused := map[string][]string{}
	for _, wh := range webhooks {
		roots := x509.NewCertPool()
		cas, err := parseCABundle(wh.ClientConfig.CABundle)
		if err != nil {
			continue // the caBundle's own problem, said on its own
		}
		for _, c := range cas {
			roots.AddCert(c)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, Intermediates: intermediates,
			CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			if _, seen := refused[err.Error()]; !seen {
				reasons = append(reasons, err.Error())
			}
			refused[err.Error()] = append(refused[err.Error()], wh.Name)
		}
	}
	for _, r := range reasons {
		problems = append(problems, fmt.Sprintf("%s: the API server would refuse its certificate for %s: %s", where, strings.Join(refused[r], ", "), r))
	}
	if len(problems) > 0 {
		return problems, time.Time{}
	}
	return nil, leaf.NotAfter
}
