package webhook

import (
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/loopvol/loopvol/internal/kube"
)

func TestConfigValidate(t *testing.T) {
	client := fake.NewClientset()
	valid := func() Config {
		return Config{DriverName: testDriver, Informers: kube.NewInformers(client, 0), Namespace: "loopvol", CSI: &fakeCSI{},
			Address: ":9443", CertDir: "/tls", ConfigName: "loopvol-webhook", Configs: client.AdmissionregistrationV1().ValidatingWebhookConfigurations()}
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{name: "valid", change: func(*Config) {}},
		{name: "no configuration to maintain", change: func(c *Config) { c.ConfigName, c.Configs = "", nil }},
		{name: "no driver", change: func(c *Config) { c.DriverName = "" }, want: "DriverName is empty"},
		{name: "no informers", change: func(c *Config) { c.Informers = nil }, want: "Informers is nil"},
		{name: "no namespace", change: func(c *Config) { c.Namespace = "" }, want: "Namespace"},
		{name: "no driver connection", change: func(c *Config) { c.CSI = nil }, want: "CSI is nil"},
		{name: "no address", change: func(c *Config) { c.Address = "" }, want: "Address is empty"},
		{name: "no cert dir", change: func(c *Config) { c.CertDir = "" }, want: "CertDir is empty"},
		{name: "configuration without client", change: func(c *Config) { c.Configs = nil }, want: "ConfigName is set but Configs is nil"},
		{name: "negative interval", change: func(c *Config) { c.CertCheckInterval = -1 }, want: "must not be negative"},
		{name: "negative read timeout", change: func(c *Config) { c.ReadTimeout = -1 }, want: "ReadHeaderTimeout, ReadTimeout and IdleTimeout must not be negative"},
		{name: "negative connection limit", change: func(c *Config) { c.MaxConnections = -1 }, want: "MaxHeaderBytes, MaxConnections and MaxRequestsInFlight must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.change(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error with %q", err, tc.want)
			}
		})
	}
}
