package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/loopvol/loopvol/pkg/csiclient"
)

// readyDriver is a ClaimDriver without capabilities.
type readyDriver struct{}

func (readyDriver) WaitReady(ctx context.Context) error  { return ctx.Err() }
func (readyDriver) Capabilities() csiclient.Capabilities { return csiclient.Capabilities{} }

func TestClaimConfigValidate(t *testing.T) {
	client := fake.NewClientset()
	good := ClaimConfig{DriverName: "d", Client: client, Informers: NewInformers(client, 0), Workers: 1,
		RetryIntervalStart: time.Second, RetryIntervalMax: time.Minute}
	for _, tc := range []struct {
		name    string
		change  func(*ClaimConfig)
		noCSI   bool
		wantErr string
	}{
		{name: "complete", change: func(*ClaimConfig) {}},
		{name: "no driver name", change: func(c *ClaimConfig) { c.DriverName = "" }, wantErr: "driver name"},
		{name: "no CSI connection", change: func(*ClaimConfig) {}, noCSI: true, wantErr: "CSI driver connection"},
		{name: "no informers", change: func(c *ClaimConfig) { c.Informers = nil }, wantErr: "informers"},
		{name: "no workers", change: func(c *ClaimConfig) { c.Workers = 0 }, wantErr: "workers"},
		{name: "negative resync", change: func(c *ClaimConfig) { c.Resync = -time.Second }, wantErr: "resync"},
		{name: "backoff upside down", change: func(c *ClaimConfig) { c.RetryIntervalMax = time.Millisecond }, wantErr: "maximum retry interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.change(&c)
			var csi ClaimDriver = readyDriver{}
			if tc.noCSI {
				csi = nil
			}
			err := c.Validate(csi)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate = %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}
