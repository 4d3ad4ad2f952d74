package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRegistrarFlags(t *testing.T) {
	env := func(name string) string {
		if name == "NODE_NAME" {
			return "node-from-env"
		}
		return ""
	}
	const path = "--kubelet-registration-path=/var/lib/kubelet/plugins/loopvol.csi.io/csi.sock"
	tests := []struct {
		name     string
		args     []string
		getenv   func(string) string
		want     registrarConfig
		wantNode string
		needsAPI bool
		wantErr  string
	}{
		{
			name:     "a node-driver-registrar command line: the registrar alone, kubelet mode, no API",
			args:     []string{"--csi-address=/csi/csi.sock", path},
			getenv:   noEnv,
			want:     registrarConfig{kubeletRegistrationPath: "/var/lib/kubelet/plugins/loopvol.csi.io/csi.sock", pluginRegistrationPath: "/registration", csiNodeMode: "kubelet"},
			needsAPI: false,
		},
		{
			name:     "direct mode: the node from $NODE_NAME, the API needed",
			args:     []string{path, "--csinode-mode=direct", "--plugin-registration-path=/tmp/reg"},
			getenv:   env,
			want:     registrarConfig{kubeletRegistrationPath: "/var/lib/kubelet/plugins/loopvol.csi.io/csi.sock", pluginRegistrationPath: "/tmp/reg", csiNodeMode: "direct"},
			wantNode: "node-from-env",
			needsAPI: true,
		},
		{name: "registrar without a registration path", args: []string{"--controllers=registrar"}, getenv: noEnv, wantErr: "the registrar needs --kubelet-registration-path"},
		{name: "relative registration path", args: []string{"--kubelet-registration-path=csi.sock"}, getenv: noEnv, wantErr: "must be an absolute path"},
		{name: "relative plugin registration path", args: []string{path, "--plugin-registration-path=reg"}, getenv: noEnv, wantErr: "--plugin-registration-path \"reg\" must be an absolute path"},
		{name: "unknown mode", args: []string{path, "--csinode-mode=both"}, getenv: noEnv, wantErr: `--csinode-mode="both"`},
		{name: "direct mode without a node name", args: []string{path, "--csinode-mode=direct"}, getenv: noEnv, wantErr: "needs --node-name or $NODE_NAME"},
		{name: "registrar flags unchecked without the registrar", args: []string{"--controllers=attach", "--csinode-mode=both"}, getenv: noEnv,
			want: registrarConfig{pluginRegistrationPath: "/registration", csiNodeMode: "both"}, needsAPI: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseFlags(tc.args, &bytes.Buffer{}, tc.getenv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseFlags(%q) = %v, want an error containing %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if cfg.registrar != tc.want {
				t.Errorf("registrar flags %+v, want %+v", cfg.registrar, tc.want)
			}
			if cfg.nodeName != tc.wantNode {
				t.Errorf("node name %q, want %q", cfg.nodeName, tc.wantNode)
			}
			if got := cfg.needsAPI(); got != tc.needsAPI {
				t.Errorf("needsAPI() = %t, want %t (controllers %v)", got, tc.needsAPI, cfg.controllers)
			}
		})
	}
}
