package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
