package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/loopvol/loopvol/pkg/capacity"
	"github.com/loopvol/loopvol/pkg/statusapi"
)

// healthy makes the fixture pass every check: worker-2's pool is no
// longer nearly full, and the claim waiting for space is gone.
func healthy(f *fixture) {
	f.remove("PersistentVolumeClaim", "big")
	p := &f.nodes.status["worker-2"].Pools[0]
	p.FreeBytes, p.PromisedBytes, p.AvailableBytes, p.Health, p.Message = 150*gib, 40*gib, 150*gib, statusapi.HealthOK, ""
}

// doctorChecks runs doctor -o json and returns its exit code and checks by name.
func doctorChecks(t *testing.T, f *fixture) (int, map[string]CheckResult) {
	t.Helper()
	out, stderr, code := f.run(t, "default", false, "doctor", "-o", "json")
	var r DoctorReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("doctor -o json: %v\nstdout: %s\nstderr: %s", err, out, stderr)
	}
	checks := map[string]CheckResult{}
	for _, c := range r.Checks {
		checks[c.Name] = c
	}
	return code, checks
}

func TestDoctorGolden(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(f *fixture)
		code   int
	}{
		{name: "doctor-pass", change: healthy, code: 0},
		{name: "doctor-warn", code: 0, change: func(f *fixture) { f.remove("PersistentVolumeClaim", "big") }},
		{name: "doctor-broken", code: 1, change: func(f *fixture) {
			healthy(f)
			brokenRegistration(f)
			f.remove("ValidatingAdmissionPolicyBinding", "loopvol-pvc-access-modes")
			f.denied["loopvol-controller patch volumeattachments/status"] = true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.change != nil {
				tc.change(f)
			}
			out, stderr, code := f.run(t, "default", false, "doctor")
			if code != tc.code {
				t.Errorf("exit code %d, want %d; stderr: %s", code, tc.code, stderr)
			}
			if stderr != "" {
				t.Errorf("stderr %q: a failing check is no error message", stderr)
			}
			golden(t, tc.name, out)
			checkScreen(t, out, nil)
		})
	}
}

// brokenRegistration makes worker-3's kubelet not know the driver, as
// when the node plugin was given another kubelet directory than kubelet's.
func brokenRegistration(f *fixture) {
	f.remove("CSINode", "worker-3")
	f.add(&storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "worker-3"}})
	f.nodes.status["worker-3"].KubeletDir = "/var/lib/kubelet"
}

func TestDoctor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(f *fixture)
		check  string
		result string
		// hint is in the check's hint, detail in its detail.
		hint, detail string
	}{
		{name: "all healthy → pass, exit 0", change: healthy, check: "registration", result: resultPass},
		{name: "CSINode without the driver on a plugin's node → registration fails with the kubelet dir hint",
			change: func(f *fixture) { healthy(f); brokenRegistration(f) },
			check:  "registration", result: resultFail, hint: "/var/lib/rancher/k3s/agent/kubelet"},
		{name: "CSINode without the driver → kubelet-dir warns with what the plugin was given",
			change: func(f *fixture) { healthy(f); brokenRegistration(f) },
			check:  "kubelet-dir", result: resultWarn, hint: "/var/snap/microk8s/common/var/lib/kubelet"},
		{name: "a node plugin without its Pod under its kubelet directory → kubelet-dir fails, though registered",
			change: func(f *fixture) {
				healthy(f)
				f.nodes.status["worker-1"].KubeletDirHasPod = ptr.To(true)
				f.nodes.status["worker-2"].KubeletDirHasPod = ptr.To(false)
			},
			check: "kubelet-dir", result: resultFail, hint: "/var/lib/rancher/k3s/agent/kubelet"},
		{name: "node plugins with their Pod under their kubelet directory → kubelet-dir passes",
			change: func(f *fixture) {
				healthy(f)
				for _, st := range f.nodes.status {
					st.KubeletDirHasPod = ptr.To(true)
				}
			},
			check: "kubelet-dir", result: resultPass},
		{name: "plugin not Ready → registration fails",
			change: func(f *fixture) {
				healthy(f)
				f.remove("Pod", "loopvol-node-q7m8c")
				p := pluginPod("loopvol-node-q7m8c", "worker-3")
				p.Status.Conditions[0].Status = "False"
				f.add(p)
			},
			check: "registration", result: resultFail, hint: "registrar"},
		{name: "attachRequired false → csidriver fails",
			change: func(f *fixture) {
				healthy(f)
				f.remove("CSIDriver", testDriver)
				cd := csiDriver()
				*cd.Spec.AttachRequired = false
				f.add(cd)
			},
			check: "csidriver", result: resultFail, hint: "kubectl delete csidriver"},
		{name: "CSINode count differs from the plugin's limit → volume-limit fails",
			change: func(f *fixture) { healthy(f); f.nodes.status["worker-1"].MaxVolumes = 32 },
			check:  "volume-limit", result: resultFail, hint: "delete pod loopvol-node-4xk2p"},
		{name: "a segment without CSIStorageCapacity → storage-capacity fails",
			change: func(f *fixture) { healthy(f); f.remove("CSIStorageCapacity", "csisc-zone-b") },
			check:  "storage-capacity", result: resultFail, hint: "capacity controller"},
		{name: "the capacity controller's Lease ran out → storage-capacity fails",
			change: func(f *fixture) {
				healthy(f)
				f.remove("Lease", capacity.LeaseName(testDriver))
				f.add(lease(capacity.LeaseName(testDriver), "loopvol-controller-0", testNow.Add(-2*time.Minute)))
			},
			check: "storage-capacity", result: resultFail, hint: "the sidecar runs"},
		{name: "no per-node capacity controller Lease (--node-deployment) → storage-capacity passes",
			change: func(f *fixture) { healthy(f); f.remove("Lease", capacity.LeaseName(testDriver)) },
			check:  "storage-capacity", result: resultPass},
		{name: "no node has a topology segment → storage-capacity warns",
			change: func(f *fixture) {
				healthy(f)
				for _, n := range []string{"worker-1", "worker-2", "worker-3"} {
					f.remove("Node", n)
					f.add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
				}
			},
			check: "storage-capacity", result: resultWarn, hint: "registration check"},
		{name: "caBundle empty → webhook fails",
			change: func(f *fixture) {
				healthy(f)
				f.remove("ValidatingWebhookConfiguration", webhookConfiguration)
				f.add(webhookConfig(t, false))
			},
			check: "webhook", result: resultFail, hint: "ca.crt"},
		{name: "serving certificate for another name → webhook fails naming the host it must carry",
			change: func(f *fixture) {
				healthy(f)
				f.remove("Secret", "loopvol-webhook-tls")
				f.add(webhookSecret(servingCert(t, "loopvol-webhook.default.svc", testNow.Add(time.Hour), true)))
			},
			check: "webhook", result: resultFail, detail: "not " + webhookHost, hint: "<service>.<namespace>.svc"},
		{name: "serving certificate of another CA → webhook fails",
			change: func(f *fixture) {
				healthy(f)
				f.remove("Secret", "loopvol-webhook-tls")
				f.add(webhookSecret(servingCert(t, webhookHost, testNow.Add(time.Hour), false)))
			},
			check: "webhook", result: resultFail, detail: "unknown authority", hint: "chain to the caBundle"},
		{name: "serving certificate expired → webhook fails with the day",
			change: func(f *fixture) {
				healthy(f)
				f.remove("Secret", "loopvol-webhook-tls")
				f.add(webhookSecret(servingCert(t, webhookHost, testNow.Add(-24*time.Hour), true)))
			},
			check: "webhook", result: resultFail, detail: "the serving certificate expired 2026-04-30"},
		{name: "tls.key not the certificate's → webhook fails",
			change: func(f *fixture) {
				healthy(f)
				f.remove("Secret", "loopvol-webhook-tls")
				crt, _ := servingCert(t, webhookHost, testNow.Add(time.Hour), true)
				_, key := servingCert(t, webhookHost, testNow.Add(time.Hour), true)
				f.add(webhookSecret(crt, key))
			},
			check: "webhook", result: resultFail, detail: "tls.key is not the key of tls.crt"},
		{name: "serving Secret missing → webhook fails",
			change: func(f *fixture) { healthy(f); f.remove("Secret", "loopvol-webhook-tls") },
			check:  "webhook", result: resultFail, detail: "Secret loopvol/loopvol-webhook-tls is missing"},
		{name: "serving Secret unreadable → webhook warns that it checked the caBundle only",
			change: func(f *fixture) { healthy(f); f.forbidSecrets = true },
			check:  "webhook", result: resultWarn, detail: "serving certificate not checked: Secret loopvol/loopvol-webhook-tls"},
		{name: "the serving certificate trusted by the caBundle → webhook passes with its Secret and last day",
			change: healthy,
			check:  "webhook", result: resultPass, detail: "serving certificate loopvol/loopvol-webhook-tls (" + webhookHost + ", until 2026-07-30)"},
		{name: "controllers on every node (overlays/distributed) → rbac judges the node plugin's account, not the unused controller's",
			change: func(f *fixture) {
				healthy(f)
				distributed(f)
				f.denied["loopvol-controller patch volumeattachments/status"] = true
			},
			check: "rbac", result: resultPass, detail: "loopvol-node (attach, capacity, resizer, placement)"},
		{name: "no webhook and nothing to serve one (overlays/distributed) → webhook passes as not deployed",
			change: func(f *fixture) { healthy(f); distributed(f) },
			check:  "webhook", result: resultPass, detail: "not deployed"},
		{name: "webhook configuration gone while the sidecar serves one → webhook fails",
			change: func(f *fixture) { healthy(f); f.remove("ValidatingWebhookConfiguration", webhookConfiguration) },
			check:  "webhook", result: resultFail, detail: "is missing"},
		{name: "controllers on every node, the node account not bound → rbac fails naming it and the controller",
			change: func(f *fixture) {
				healthy(f)
				distributed(f)
				f.denied["loopvol-node patch volumeattachments/status"] = true
			},
			check: "rbac", result: resultFail, detail: "loopvol-node cannot patch volumeattachments/status (attach)"},
		{name: "the node plugin's heartbeat without its Lease role → rbac fails naming it",
			change: func(f *fixture) {
				healthy(f)
				for _, o := range f.objects {
					if p, ok := o.(*corev1.Pod); ok && p.Labels["app.kubernetes.io/component"] == "node" {
						p.Spec.Containers[0].Args = []string{"--mode=node", "--heartbeat-namespace=loopvol"}
					}
				}
				f.denied["loopvol-node update leases"] = true
			},
			check: "rbac", result: resultFail, detail: "loopvol-node cannot update leases in loopvol (the node plugin's heartbeat)"},
		{name: "the fencing controller without components/fencing's role → rbac fails naming it",
			change: func(f *fixture) {
				healthy(f)
				for _, o := range f.objects {
					if p, ok := o.(*corev1.Pod); ok && p.Name == "loopvol-controller-0" {
						p.Spec.Containers[0].Args[0] += ",fencing"
					}
				}
				f.denied["loopvol-controller patch nodes"] = true
			},
			check: "rbac", result: resultFail, detail: "loopvol-controller cannot patch nodes (fencing)"},
		{name: "the registrar writing CSINode itself without its role → rbac fails naming it",
			change: func(f *fixture) {
				healthy(f)
				for _, o := range f.objects {
					if p, ok := o.(*corev1.Pod); ok && p.Labels["app.kubernetes.io/component"] == "node" {
						p.Spec.Containers[1].Args = []string{"--controllers=registrar", "--csinode-mode", "direct"}
					}
				}
				f.denied["loopvol-node patch csinodes"] = true
			},
			check: "rbac", result: resultFail, detail: "loopvol-node cannot patch csinodes (registrar --csinode-mode=direct)"},
		{name: "no loopvol Pod → rbac judges the base's deployment",
			change: func(f *fixture) {
				healthy(f)
				f.denied["loopvol-controller create persistentvolumes"] = true
				out := f.objects[:0]
				for _, o := range f.objects {
					if p, ok := o.(*corev1.Pod); !ok || p.Namespace != testNS {
						out = append(out, o)
					}
				}
				f.objects = out
			},
			check: "rbac", result: resultFail, detail: "loopvol-controller cannot create persistentvolumes (csi-provisioner)"},
		{name: "no ready endpoint → webhook fails",
			change: func(f *fixture) {
				healthy(f)
				f.remove("EndpointSlice", "loopvol-webhook-x8v2k")
				f.add(webhookEndpoints(0))
			},
			check: "webhook", result: resultFail, hint: "failurePolicy Ignore"},
		{name: "a policy without binding → policies fails",
			change: func(f *fixture) {
				healthy(f)
				f.remove("ValidatingAdmissionPolicyBinding", "loopvol-storageclass-listed")
			},
			check: "policies", result: resultFail, hint: "binding"},
		{name: "RBAC denied → rbac fails",
			change: func(f *fixture) { healthy(f); f.denied["loopvol-controller update leases"] = true },
			check:  "rbac", result: resultFail, hint: "rbac-"},
		{name: "a loopvol Pod on a node without plugin → plugins-where-used fails",
			change: func(f *fixture) { healthy(f); f.remove("Pod", "loopvol-node-q7m8c") },
			check:  "plugins-where-used", result: resultFail, hint: "nodeSelector and tolerations"},
		{name: "exec fails → node-status fails with the error",
			change: func(f *fixture) {
				healthy(f)
				f.nodes.err["worker-2"] = errors.New(statusCommand + " in loopvol/loopvol-node-9fj3d: command terminated with exit code 1: connection refused")
			},
			check: "node-status", result: resultFail, hint: "pods/exec"},
		{name: "a pool nearly full → pools warns", check: "pools", result: resultWarn, hint: "grow the pool"},
		{name: "a claim waiting for space → claims fails", check: "claims", result: resultFail, hint: "free space, add a pool, or ask less"},
		{name: "a claim waiting long for a provisioner → claims warns",
			change: func(f *fixture) {
				healthy(f)
				slow := claim("default", "slow", "loopvol", "1Gi", "")
				slow.CreationTimestamp = metav1.NewTime(testNow.Add(-time.Hour))
				slow.Annotations = map[string]string{"volume.kubernetes.io/selected-node": "worker-1"}
				f.add(slow, pod("default", "slow-user", "", corev1.PodPending, "slow"))
			},
			check: "claims", result: resultWarn, hint: "describe pvc"},
		{name: "a WaitForFirstConsumer claim without a Pod → claims passes",
			change: func(f *fixture) {
				healthy(f)
				idle := claim("default", "idle", "loopvol", "1Gi", "")
				idle.CreationTimestamp = metav1.NewTime(testNow.Add(-time.Hour))
				f.add(idle)
			},
			check: "claims", result: resultPass},
		{name: "a pool unusable → pools fails",
			change: func(f *fixture) { f.nodes.status["worker-3"].Pools[0].Health = "PoolUnusable" },
			check:  "pools", result: resultFail, hint: "unusable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.change != nil {
				tc.change(f)
			}
			code, checks := doctorChecks(t, f)
			got, ok := checks[tc.check]
			if !ok {
				t.Fatalf("no check %q in %v", tc.check, checks)
			}
			if got.Result != tc.result {
				t.Errorf("%s: %s (%s), want %s", tc.check, got.Result, got.Detail, tc.result)
			}
			if !strings.Contains(got.Hint, tc.hint) {
				t.Errorf("%s: hint %q, want it to say %q", tc.check, got.Hint, tc.hint)
			}
			if !strings.Contains(got.Detail, tc.detail) {
				t.Errorf("%s: detail %q, want it to say %q", tc.check, got.Detail, tc.detail)
			}
			failed := false
			for _, c := range checks {
				failed = failed || c.Result == resultFail
			}
			if want := map[bool]int{true: 1, false: 0}[failed]; code != want {
				t.Errorf("exit code %d, want %d (a check failed: %v)", code, want, failed)
			}
			if tc.result == resultPass {
				for _, c := range checks {
					if c.Result != resultPass {
						t.Errorf("healthy cluster: %s is %s: %s", c.Name, c.Result, c.Detail)
					}
				}
			}
		})
	}
}

// distributed lays the fixture out as overlays/distributed does: no
// controller Pod, and so no webhook, and the sidecar's controllers in every
// node plugin Pod, under the node plugin's account.
func distributed(f *fixture) {
	f.remove("Pod", "loopvol-controller-0")
	f.remove("ValidatingWebhookConfiguration", webhookConfiguration)
	f.remove("Service", "loopvol-webhook")
	f.remove("EndpointSlice", "loopvol-webhook-x8v2k")
	f.remove("Secret", "loopvol-webhook-tls")
	for _, o := range f.objects {
		if p, ok := o.(*corev1.Pod); ok && p.Labels["app.kubernetes.io/component"] == "node" {
			p.Spec.Containers[1].Args = []string{"--controllers=attach,capacity,resizer,registrar,placement", "--node-deployment"}
		}
	}
}
