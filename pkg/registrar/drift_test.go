package registrar

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// In kubelet mode with an API client, the entry kubelet wrote is read and
// compared with NodeGetInfo; nothing is ever written.
func TestDriftCheck(t *testing.T) {
	tests := []struct {
		name      string
		objs      []runtime.Object
		forbidden bool
		wantLog   string
		wantMore  bool
	}{
		{name: "entry as the driver reports → quiet", objs: []runtime.Object{csiNodeObj("1", ours(3))}, wantLog: "matches NodeGetInfo", wantMore: true},
		{name: "another count → drift logged", objs: []runtime.Object{csiNodeObj("1", otherDriver, ours(2))}, wantLog: "differs from what the driver reports", wantMore: true},
		{name: "no entry → logged", objs: []runtime.Object{csiNodeObj("1", otherDriver)}, wantLog: "has no entry of the driver", wantMore: true},
		{name: "no CSINode → logged", wantLog: "Kubelet has written no CSINode", wantMore: true},
		{name: "no permission → said once, then no more checks", forbidden: true, wantLog: "No permission to read CSINodes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(4)))
			ctx := klog.NewContext(context.Background(), logger)
			client := fake.NewClientset(tc.objs...)
			if tc.forbidden {
				client.PrependReactor("get", "csinodes", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "storage.k8s.io", Resource: "csinodes"}, testNode, nil)
				})
			}
			cfg := kubeletConfig(t, newFakeDriver(3))
			cfg.Client, cfg.NodeName = client, testNode
			r, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if r.drift == nil || r.node != nil {
				t.Fatal("kubelet mode with a client must check drift and never write")
			}
			if more := r.drift.check(ctx); more != tc.wantMore {
				t.Errorf("check() = %t, want %t", more, tc.wantMore)
			}
			f := &fixture{client: client}
			if diff := cmp.Diff([]apiAction{get("csinodes", testNode)}, f.actions()); diff != "" {
				t.Errorf("API actions (-want +got):\n%s", diff)
			}
			log := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			if !strings.Contains(log, tc.wantLog) {
				t.Errorf("log lacks %q:\n%s", tc.wantLog, log)
			}
			if strings.Contains(log, "forbidden") {
				t.Errorf("the log repeats the API's refusal, which the e2e tests take for missing RBAC:\n%s", log)
			}
		})
	}
}

// Without a client, kubelet mode has no drift checker and no CSINode
// controller: nothing can reach the API.
func TestKubeletModeWithoutClientHasNoAPIParts(t *testing.T) {
	r, err := New(kubeletConfig(t, newFakeDriver(3)))
	if err != nil {
		t.Fatal(err)
	}
	if r.drift != nil || r.node != nil {
		t.Fatal("kubelet mode without a client built a part that uses the API")
	}
}
