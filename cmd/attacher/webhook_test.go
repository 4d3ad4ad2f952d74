package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestWebhookFlags(t *testing.T) {
	// bounds are the defaults of the bounds against hostile clients.
	bounds := func(c webhookConfig) webhookConfig {
		c.readHeaderTimeout, c.readTimeout, c.idleTimeout = 5*time.Second, 10*time.Second, 120*time.Second
		c.maxHeaderBytes, c.maxConnections, c.maxRequestsInFlight = 32<<10, 128, 16
		return c
	}
	tests := []struct {
		name    string
		args    []string
		want    webhookConfig
		wantErr string
	}{
		{name: "defaults", args: []string{"--controllers=webhook"},
			want: bounds(webhookConfig{address: ":9443", certDir: "/etc/loopvol/webhook-tls", configuration: "loopvol-webhook"})},
		{name: "set", args: []string{"--controllers=webhook", "--webhook-address=127.0.0.1:8443", "--webhook-cert-dir=/tls", "--webhook-configuration="},
			want: bounds(webhookConfig{address: "127.0.0.1:8443", certDir: "/tls"})},
		{name: "bounds set", args: []string{"--controllers=webhook", "--webhook-read-header-timeout=1s", "--webhook-read-timeout=2s", "--webhook-idle-timeout=3s",
			"--webhook-max-header-bytes=4096", "--webhook-max-connections=5", "--webhook-max-requests-inflight=6"},
			want: webhookConfig{address: ":9443", certDir: "/etc/loopvol/webhook-tls", configuration: "loopvol-webhook",
				readHeaderTimeout: time.Second, readTimeout: 2 * time.Second, idleTimeout: 3 * time.Second,
				maxHeaderBytes: 4096, maxConnections: 5, maxRequestsInFlight: 6}},
		{name: "bad address", args: []string{"--controllers=webhook", "--webhook-address=8443"}, wantErr: `--webhook-address "8443" is not host:port`},
		{name: "no cert dir", args: []string{"--controllers=webhook", "--webhook-cert-dir="}, wantErr: "--webhook-cert-dir is empty"},
		{name: "same port as diagnostics", args: []string{"--controllers=webhook", "--http-endpoint=:9443"}, wantErr: "--webhook-address and --http-endpoint are both :9443"},
		{name: "no read timeout", args: []string{"--controllers=webhook", "--webhook-read-timeout=0"}, wantErr: "--webhook-read-timeout=0s: want a positive duration"},
		{name: "no connection limit", args: []string{"--controllers=webhook", "--webhook-max-connections=0"}, wantErr: "--webhook-max-connections=0: want a positive number"},
		{name: "unchecked when the webhook does not run", args: []string{"--controllers=attach", "--webhook-address=8443"},
			want: bounds(webhookConfig{address: "8443", certDir: "/etc/loopvol/webhook-tls", configuration: "loopvol-webhook"})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseFlags(tc.args, &bytes.Buffer{}, noEnv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseFlags(%q) = %v, want an error containing %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if cfg.webhook != tc.want {
				t.Errorf("webhook flags %+v, want %+v", cfg.webhook, tc.want)
			}
		})
	}
}
