package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestWebhookFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    webhookConfig
		wantErr string
	}{
		{name: "defaults", args: []string{"--controllers=webhook"},
			want: webhookConfig{address: ":9443", certDir: "/etc/loopvol/webhook-tls", configuration: "loopvol-webhook"}},
		{name: "set", args: []string{"--controllers=webhook", "--webhook-address=127.0.0.1:8443", "--webhook-cert-dir=/tls", "--webhook-configuration="},
			want: webhookConfig{address: "127.0.0.1:8443", certDir: "/tls"}},
		{name: "bad address", args: []string{"--controllers=webhook", "--webhook-address=8443"}, wantErr: `--webhook-address "8443" is not host:port`},
		{name: "no cert dir", args: []string{"--controllers=webhook", "--webhook-cert-dir="}, wantErr: "--webhook-cert-dir is empty"},
		{name: "same port as diagnostics", args: []string{"--controllers=webhook", "--http-endpoint=:9443"}, wantErr: "--webhook-address and --http-endpoint are both :9443"},
		{name: "unchecked when the webhook does not run", args: []string{"--controllers=attach", "--webhook-address=8443"},
			want: webhookConfig{address: "8443", certDir: "/etc/loopvol/webhook-tls", configuration: "loopvol-webhook"}},
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
