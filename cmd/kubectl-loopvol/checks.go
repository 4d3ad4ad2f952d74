package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/loopvol/loopvol/pkg/capacity"
	"github.com/loopvol/loopvol/pkg/statusapi"
)

// kubeletDirHint is what to do when kubelet does not see the node plugin:
// its directory is the distribution's.
const kubeletDirHint = "most often kubelet's directory is not " + defaultKubeletDir +
	" (k3s: /var/lib/rancher/k3s/agent/kubelet, microk8s: /var/snap/microk8s/common/var/lib/kubelet, k0s: /var/lib/k0s/kubelet):" +
	" set kubeletDir in the ConfigMap loopvol-node-settings of your overlay to kubelet's --root-dir and apply it again"

func (d *doctorRun) checkCSIDriver(ctx context.Context) CheckResult {
	const name = "csidriver"
	cd, err := d.kube.StorageV1().CSIDrivers().Get(ctx, d.opts.driver, metav1.GetOptions{})
	if err != nil {
		return fail(name, fmt.Sprintf("CSIDriver %s: %v", d.opts.driver, err),
			"apply your overlay of deploy/kubernetes (kubectl apply -k deploy/kubernetes/overlays/<overlay>)")
	}
	s := cd.Spec
	var must, should []string
	if s.AttachRequired == nil || !*s.AttachRequired {
		must = append(must, "attachRequired is not true (attach is loopvol's fencing)")
	}
	// Empty is the API's default, Persistent.
	if len(s.VolumeLifecycleModes) > 0 && !slices.Equal(s.VolumeLifecycleModes, []storagev1.VolumeLifecycleMode{storagev1.VolumeLifecyclePersistent}) {
		must = append(must, fmt.Sprintf("volumeLifecycleModes is %v, not [Persistent]", s.VolumeLifecycleModes))
	}
	if s.StorageCapacity == nil || !*s.StorageCapacity {
		must = append(must, "storageCapacity is not true (the scheduler ignores the capacity per segment)")
	}
	if s.PodInfoOnMount == nil || !*s.PodInfoOnMount {
		should = append(should, "podInfoOnMount is not true")
	}
	if s.FSGroupPolicy == nil || *s.FSGroupPolicy != storagev1.FileFSGroupPolicy {
		should = append(should, "fsGroupPolicy is not File")
	}
	if s.RequiresRepublish != nil && *s.RequiresRepublish {
		should = append(should, "requiresRepublish is true")
	}
	switch {
	case len(must) > 0:
		return fail(name, strings.Join(append(must, should...), "; "),
			"attachRequired and volumeLifecycleModes are immutable: kubectl delete csidriver "+d.opts.driver+
				", then apply deploy/kubernetes/base/csidriver.yaml (through your overlay) again")
	case len(should) > 0:
		return warning(name, strings.Join(should, "; "), "apply deploy/kubernetes/base/csidriver.yaml (through your overlay) again")
	}
	return pass(name, "CSIDriver "+d.opts.driver+" has the fields loopvol needs")
}

// pluginNodes are the nodes that run a node plugin Pod.
func (d *doctorRun) pluginNodes() []*nodeView {
	return slices.DeleteFunc(slices.Clone(d.c.nodes), func(n *nodeView) bool { return n.pod == nil })
}

func (d *doctorRun) checkRegistration(context.Context) CheckResult {
	const name = "registration"
	nodes := d.pluginNodes()
	if len(nodes) == 0 {
		return fail(name, "no node plugin Pod in "+d.opts.driverNamespace,
			"apply your overlay, and check the DaemonSet: kubectl -n "+d.opts.driverNamespace+" describe daemonset loopvol-node")
	}
	var missing, notReady []string
	for _, n := range nodes {
		switch {
		case n.driver == nil:
			missing = append(missing, n.name)
		case !podReady(n.pod):
			notReady = append(notReady, n.name+" ("+n.pod.Name+")")
		}
	}
	switch {
	case len(missing) > 0:
		pod := d.c.node(missing[0]).pod.Name
		return fail(name, fmt.Sprintf("CSINode lacks %s on %s", d.opts.driver, listNames(missing)),
			"kubelet has not accepted the node plugin's registration: read kubectl -n "+d.opts.driverNamespace+
				" logs "+pod+" -c registrar; "+kubeletDirHint)
	case len(notReady) > 0:
		return fail(name, "node plugin not Ready on "+listNames(notReady),
			"the registrar is Ready once kubelet confirmed the registration: kubectl -n "+d.opts.driverNamespace+
				" describe pod, and the logs of its registrar and driver containers")
	}
	return pass(name, fmt.Sprintf("%d of %d nodes: CSINode lists %s, node plugin Ready", len(nodes), len(nodes), d.opts.driver))
}

func (d *doctorRun) checkKubeletDir(context.Context) CheckResult {
	const name = "kubelet-dir"
	var registered, verified int
	var wrong, suspects []string
	for _, n := range d.pluginNodes() {
		// A node plugin given its Pod's UID says whether kubelet keeps
		// that Pod's directory under the kubelet directory it was given:
		// the proof either way. kubelet's configuration (configz) does
		// not tell its root directory, so without it, where the
		// registration failed, the directory is only a suspect.
		if n.status != nil && n.status.KubeletDirHasPod != nil {
			if !*n.status.KubeletDirHasPod {
				wrong = append(wrong, n.name+" (given "+n.status.KubeletDir+")")
				continue
			}
			verified++
		}
		switch {
		case n.driver != nil:
			registered++
		case n.status != nil:
			suspects = append(suspects, n.name+" (given "+n.status.KubeletDir+")")
		default:
			suspects = append(suspects, n.name+" (unknown)")
		}
	}
	switch {
	case len(wrong) > 0:
		return fail(name, "kubelet keeps its Pods elsewhere than the directory the node plugin was given: "+listNames(wrong),
			"the node plugin's own Pod directory is not under it; "+kubeletDirHint)
	case len(suspects) > 0:
		return warning(name, "not registered: "+listNames(suspects),
			"if that is not the node's kubelet --root-dir: "+kubeletDirHint)
	case registered == 0:
		return warning(name, "no node plugin to check", "")
	case verified > 0:
		return pass(name, fmt.Sprintf("kubelet found the registration socket on %d nodes; %d plugins see their Pod under it", registered, verified))
	}
	return pass(name, fmt.Sprintf("kubelet found the registration socket on %d nodes", registered))
}

func (d *doctorRun) checkVolumeLimit(context.Context) CheckResult {
	const name = "volume-limit"
	var wrong []string
	var checked int
	var pod string
	for _, n := range d.pluginNodes() {
		if n.status == nil || n.status.MaxVolumes == 0 || n.driver == nil {
			continue
		}
		checked++
		got := "none"
		if n.driver.Allocatable != nil && n.driver.Allocatable.Count != nil {
			if int64(*n.driver.Allocatable.Count) == n.status.MaxVolumes {
				continue
			}
			got = fmt.Sprint(*n.driver.Allocatable.Count)
		}
		wrong = append(wrong, fmt.Sprintf("%s (CSINode %s, plugin %d)", n.name, got, n.status.MaxVolumes))
		pod = n.pod.Name
	}
	switch {
	case len(wrong) > 0:
		return fail(name, "CSINode's count is not the plugin's limit: "+listNames(wrong),
			"kubelet reads the limit at registration and every nodeAllocatableUpdatePeriodSeconds of the CSIDriver;"+
				" restart the node plugin to register again: kubectl -n "+d.opts.driverNamespace+" delete pod "+pod)
	case checked == 0:
		return pass(name, "no node plugin sets a volume limit")
	}
	return pass(name, fmt.Sprintf("CSINode's allocatable count is the plugin's limit on %d nodes", checked))
}

func (d *doctorRun) checkStorageCapacity(ctx context.Context) CheckResult {
	const name = "storage-capacity"
	cd, err := d.kube.StorageV1().CSIDrivers().Get(ctx, d.opts.driver, metav1.GetOptions{})
	if err == nil && (cd.Spec.StorageCapacity == nil || !*cd.Spec.StorageCapacity) {
		return warning(name, "the CSIDriver does not ask the scheduler to use capacity", "see the csidriver check")
	}
	scs, err := d.kube.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail(name, "list StorageClasses: "+err.Error(), "")
	}
	caps, err := d.kube.StorageV1().CSIStorageCapacities(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{capacity.DriverNameLabel: d.opts.driver}.String()})
	if err != nil {
		return fail(name, "list CSIStorageCapacities: "+err.Error(), "")
	}
	segments := map[string]map[string]string{}
	for _, n := range d.c.nodes {
		if n.driver == nil || n.node == nil {
			continue
		}
		seg := map[string]string{}
		for _, k := range n.driver.TopologyKeys {
			if v, ok := n.node.Labels[k]; ok {
				seg[k] = v
			}
		}
		if len(seg) > 0 {
			segments[labels.Set(seg).String()] = seg
		}
	}
	var missing []string
	var classes int
	for _, sc := range scs.Items {
		if sc.Provisioner != d.opts.driver {
			continue
		}
		classes++
		for _, key := range slices.Sorted(maps.Keys(segments)) {
			if !hasCapacity(caps.Items, sc.Name, segments[key], d.opts.driver) {
				missing = append(missing, sc.Name+"×"+key)
			}
		}
	}
	logs := " and its logs: kubectl -n " + d.opts.driverNamespace + " logs loopvol-controller-0 -c sidecar"
	switch {
	case classes == 0:
		return warning(name, "no StorageClass of "+d.opts.driver, "apply deploy/kubernetes/base/storageclass.yaml, or a class of your own")
	case len(missing) > 0:
		return fail(name, "no CSIStorageCapacity for "+listNames(missing),
			"the capacity controller publishes them (Lease "+capacity.LeaseName(d.opts.driver)+"): check it leads"+
				" (kubectl loopvol status)"+logs)
	case len(segments) == 0:
		return warning(name, "no registered node of "+d.opts.driver+" has a topology segment: there is nothing to check",
			"see the registration check: kubelet labels a node with the node plugin's topology keys when it registers the plugin")
	}
	// The objects exist; they are current only while a capacity controller
	// acts. A central one holds its Lease, which must not have run out
	// (per-node instances, --node-deployment, elect no leader: a missing
	// Lease says nothing).
	lease, err := d.kube.CoordinationV1().Leases(d.opts.driverNamespace).Get(ctx, capacity.LeaseName(d.opts.driver), metav1.GetOptions{})
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return fail(name, "get Lease "+capacity.LeaseName(d.opts.driver)+": "+err.Error(), "")
	case err == nil && leaseExpired(lease, d.now()):
		return fail(name, fmt.Sprintf("%d classes × %d segments have their CSIStorageCapacity, but no capacity controller leads"+
			" (Lease %s last renewed %s): nobody keeps them current", classes, len(segments), lease.Name, renewed(lease.Spec.RenewTime, d.now())),
			"the scheduler places claims by capacity that may be gone; check the sidecar runs (kubectl loopvol status)"+logs)
	}
	return pass(name, fmt.Sprintf("%d classes × %d segments, each has its CSIStorageCapacity", classes, len(segments)))
}

// hasCapacity says whether an object of the driver covers class in segment.
func hasCapacity(caps []storagev1.CSIStorageCapacity, class string, segment map[string]string, driver string) bool {
	for _, c := range caps {
		if c.StorageClassName != class || c.Labels[capacity.DriverNameLabel] != driver || c.NodeTopology == nil {
			continue
		}
		if maps.Equal(c.NodeTopology.MatchLabels, segment) && len(c.NodeTopology.MatchExpressions) == 0 {
			return true
		}
	}
	return false
}

func (d *doctorRun) checkWebhook(ctx context.Context) CheckResult {
	const name = "webhook"
	s, err := d.webhookState(ctx)
	switch {
	case err != nil:
		return fail(name, err.Error(), "")
	case s.config == nil:
		// overlays/distributed leaves the webhook out with the central
		// sidecar that would serve it.
		if pods, err := d.loopvolPods(ctx); err == nil && len(pods) > 0 && !runsController(pods, "webhook") {
			return pass(name, "not deployed: no loopvol Pod runs the webhook controller, and there is no "+webhookConfiguration+
				" to call it (the admission policies still check)")
		}
		return fail(name, "ValidatingWebhookConfiguration "+webhookConfiguration+" is missing",
			"apply deploy/kubernetes/base/admission/webhook.yaml (through your overlay)")
	}
	var problems []string
	for _, wh := range s.config.Webhooks {
		certs, err := parseCABundle(wh.ClientConfig.CABundle)
		if err != nil {
			problems = append(problems, wh.Name+": caBundle "+err.Error())
			continue
		}
		for _, cert := range certs {
			if d.now().After(cert.NotAfter) {
				problems = append(problems, fmt.Sprintf("%s: caBundle certificate %q expired %s", wh.Name, cert.Subject.CommonName, cert.NotAfter.UTC().Format("2006-01-02")))
			}
		}
	}
	served, unchecked := d.servingCerts(ctx, s, &problems)
	switch {
	case len(problems) > 0:
		return fail(name, listNames(problems),
			"the serving certificate must name <service>.<namespace>.svc and chain to the caBundle; the sidecar"+
				" (--controllers=webhook) serves it from its Secret (mounted at "+defaultCertDir+") and copies that Secret's ca.crt"+
				" into caBundle: check the Secret and the sidecar's logs (kubectl -n "+d.opts.driverNamespace+" logs loopvol-controller-0 -c sidecar)")
	case s.ready == 0:
		return fail(name, fmt.Sprintf("Service %s has no ready endpoint", strings.Join(s.services, ",")),
			"the controller Pod serves the webhook: kubectl -n "+d.opts.driverNamespace+
				" get pods -l app.kubernetes.io/component=controller; with failurePolicy Ignore, claims are admitted unchecked meanwhile")
	case len(unchecked) > 0:
		return warning(name, "serving certificate not checked: "+listNames(unchecked),
			"doctor reads the Secret the webhook's Pods mount at the sidecar's "+certDirFlag+" (reading Secrets needs get on them)")
	}
	return pass(name, fmt.Sprintf("caBundle (%d webhooks) trusts the serving certificate %s; %s: %d ready endpoints",
		len(s.config.Webhooks), listNames(served), strings.Join(s.services, ","), s.ready))
}

// servingCerts checks the serving certificate of each of the webhook's
// Services (checkServingCert), adding what is wrong to problems. served
// says which Secrets passed, and until when; unchecked what could not be
// read.
func (d *doctorRun) servingCerts(ctx context.Context, s *webhookState, problems *[]string) (served, unchecked []string) {
	for _, svc := range s.services {
		ns, name, _ := strings.Cut(svc, "/")
		var webhooks []admissionregistrationv1.ValidatingWebhook
		for _, wh := range s.config.Webhooks {
			if r := wh.ClientConfig.Service; r != nil && r.Namespace == ns && r.Name == name {
				webhooks = append(webhooks, wh)
			}
		}
		secrets, err := d.servingSecrets(ctx, ns, name)
		switch {
		case err != nil:
			*problems = append(*problems, err.Error())
			continue
		case len(secrets) == 0:
			unchecked = append(unchecked, "no Pod of Service "+svc+" mounts a Secret at the sidecar's "+certDirFlag)
			continue
		}
		for _, sn := range secrets {
			secret, err := d.kube.CoreV1().Secrets(ns).Get(ctx, sn, metav1.GetOptions{})
			switch {
			case apierrors.IsForbidden(err):
				unchecked = append(unchecked, "Secret "+ns+"/"+sn+": "+err.Error())
				continue
			case apierrors.IsNotFound(err):
				*problems = append(*problems, "Secret "+ns+"/"+sn+" is missing: the webhook has no certificate to serve")
				continue
			case err != nil:
				*problems = append(*problems, "get Secret "+ns+"/"+sn+": "+err.Error())
				continue
			}
			p, until := checkServingCert(secret, ns, name, webhooks, d.now())
			*problems = append(*problems, p...)
			if len(p) == 0 {
				served = append(served, fmt.Sprintf("%s/%s (%s.%s.svc, until %s)", ns, sn, name, ns, until.UTC().Format(time.DateOnly)))
			}
		}
	}
	return served, unchecked
}

func (d *doctorRun) checkPolicies(ctx context.Context) CheckResult {
	const name = "policies"
	ps, err := d.policies(ctx)
	if err != nil {
		return fail(name, err.Error(), "")
	}
	if len(ps) == 0 {
		return warning(name, "no ValidatingAdmissionPolicy "+policyPrefix+"*", "apply deploy/kubernetes/base/admission (through your overlay)")
	}
	var unbound []string
	for _, p := range ps {
		if !p.Bound {
			unbound = append(unbound, p.Name)
		}
	}
	if len(unbound) > 0 {
		return fail(name, "not bound: "+listNames(unbound),
			"a policy without a ValidatingAdmissionPolicyBinding checks nothing: each ships with a binding of its name in deploy/kubernetes/base/admission; apply it")
	}
	return pass(name, fmt.Sprintf("%d policies, each bound", len(ps)))
}

// access is one request a ServiceAccount must be allowed.
type access struct {
	verb, group, resource, subresource, name string
	// namespace of the request: "" for a cluster-wide one.
	namespace string
}

func (a access) String() string {
	res := a.resource
	if a.subresource != "" {
		res += "/" + a.subresource
	}
	if a.namespace != "" {
		res += " in " + a.namespace
	}
	return a.verb + " " + res
}

// controllerAccess is, for each controller of loopvol's sidecar
// (--controllers), one request its RBAC (deploy/kubernetes/base/rbac-*.yaml,
// components/fencing) must allow: the write it cannot work without.
// Namespaced ones are in the driver's namespace (ns).
func controllerAccess(ns string) map[string][]access {
	return map[string][]access{
		"attach":    {{verb: "patch", group: "storage.k8s.io", resource: "volumeattachments", subresource: "status"}},
		"capacity":  {{verb: "create", group: "storage.k8s.io", resource: "csistoragecapacities", namespace: ns}},
		"resizer":   {{verb: "patch", resource: "persistentvolumeclaims", subresource: "status"}},
		"webhook":   {{verb: "patch", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: webhookConfiguration}},
		"placement": {{verb: "list", resource: "pods"}},
		"fencing":   {{verb: "patch", resource: "nodes"}, {verb: "list", group: "coordination.k8s.io", resource: "leases", namespace: ns}},
	}
}

// need is a request one container's ServiceAccount must be allowed, and why.
type need struct {
	serviceAccount string
	access         access
	// by names the container and what in it needs the access.
	by string
}

// rbacNeeds is what the containers of loopvol's Pods in the driver's
// namespace need of the API, by what each runs: the sidecar's controllers
// (and, with --leader-election, their Leases), the
// registrar writing CSINode itself (--csinode-mode=direct), csi-provisioner,
// and the node plugin's heartbeat (--heartbeat-namespace). The same image
// runs centrally or on every node (overlays/distributed binds the
// controllers' roles to the node plugin's account): what the Pods run says
// which account needs what. Without a Pod of loopvol, the base's
// deployment is assumed.
func (d *doctorRun) rbacNeeds(ctx context.Context) ([]need, error) {
	ns := d.opts.driverNamespace
	pods, err := d.loopvolPods(ctx)
	if err != nil {
		return nil, err
	}
	if len(pods) == 0 {
		pods = append(pods, corev1.Pod{Spec: corev1.PodSpec{ServiceAccountName: "loopvol-controller", Containers: []corev1.Container{
			{Name: "sidecar", Args: []string{"--controllers=attach,capacity,resizer,webhook,placement", "--leader-election"}},
			{Name: "csi-provisioner", Args: []string{"--leader-election"}}}}})
	}
	byController := controllerAccess(ns)
	lease := access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: ns}
	var out []need
	add := func(sa string, a access, by string) {
		for _, n := range out {
			if n.serviceAccount == sa && n.access == a {
				return
			}
		}
		out = append(out, need{serviceAccount: sa, access: a, by: by})
	}
	for _, p := range pods {
		sa := cmp.Or(p.Spec.ServiceAccountName, "default")
		for _, c := range p.Spec.Containers {
			args := containerArgs(c)
			if ctrls := sidecarControllers(c); ctrls != nil {
				elected := boolFlag(args, "--leader-election")
				for _, ctrl := range ctrls {
					for _, a := range byController[ctrl] {
						add(sa, a, ctrl)
					}
					if mode, _ := flagValue(args, "--csinode-mode"); ctrl == "registrar" && mode == "direct" {
						add(sa, access{verb: "patch", group: "storage.k8s.io", resource: "csinodes"}, "registrar --csinode-mode=direct")
					}
					if ctrl != "registrar" && ctrl != "webhook" && elected {
						add(sa, lease, ctrl+"'s leader election")
					}
				}
			}
			if c.Name == "csi-provisioner" {
				add(sa, access{verb: "create", resource: "persistentvolumes"}, "csi-provisioner")
				add(sa, access{verb: "list", group: "storage.k8s.io", resource: "csinodes"}, "csi-provisioner")
				if boolFlag(args, "--leader-election") {
					add(sa, lease, "csi-provisioner's leader election")
				}
			}
			if hb, ok := flagValue(args, "--heartbeat-namespace"); ok && hb != "" {
				add(sa, access{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: hb}, "the node plugin's heartbeat")
			}
		}
	}
	return out, nil
}

// loopvolPods are the Pods of loopvol in the driver's namespace.
func (e *env) loopvolPods(ctx context.Context) ([]corev1.Pod, error) {
	pods, err := e.kube.CoreV1().Pods(e.opts.driverNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=loopvol"})
	if err != nil {
		return nil, fmt.Errorf("list loopvol's Pods: %w", err)
	}
	return pods.Items, nil
}

// containerArgs is a container's command line (command and args).
func containerArgs(c corev1.Container) []string { return append(slices.Clone(c.Command), c.Args...) }

// sidecarControllers are the controllers a container of loopvol's sidecar
// runs (--controllers), nil for any other container.
func sidecarControllers(c corev1.Container) []string {
	if list, ok := flagValue(containerArgs(c), "--controllers"); ok {
		return strings.Split(list, ",")
	}
	return nil
}

// runsController says whether a container of pods runs the sidecar's
// controller ctrl.
func runsController(pods []corev1.Pod, ctrl string) bool {
	for _, p := range pods {
		for _, c := range p.Spec.Containers {
			if slices.Contains(sidecarControllers(c), ctrl) {
				return true
			}
		}
	}
	return false
}

func (d *doctorRun) checkRBAC(ctx context.Context) CheckResult {
	const name = "rbac"
	needs, err := d.rbacNeeds(ctx)
	if err != nil {
		return fail(name, err.Error(), "")
	}
	var denied []string
	missing := map[string]error{}
	for _, n := range needs {
		if _, seen := missing[n.serviceAccount]; !seen {
			_, err := d.kube.CoreV1().ServiceAccounts(d.opts.driverNamespace).Get(ctx, n.serviceAccount, metav1.GetOptions{})
			missing[n.serviceAccount] = err
			if err != nil {
				denied = append(denied, fmt.Sprintf("ServiceAccount %s: %v", n.serviceAccount, err))
			}
		}
		if missing[n.serviceAccount] != nil {
			continue
		}
		a := n.access
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + d.opts.driverNamespace + ":" + n.serviceAccount,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + d.opts.driverNamespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: a.verb, Group: a.group, Resource: a.resource,
				Subresource: a.subresource, Name: a.name, Namespace: a.namespace},
		}}
		got, err := d.kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			return fail(name, "SubjectAccessReview: "+err.Error(), "doctor needs to create subjectaccessreviews (docs/kubectl-plugin.md, RBAC)")
		}
		if !got.Status.Allowed {
			denied = append(denied, fmt.Sprintf("%s cannot %s (%s)", n.serviceAccount, a, n.by))
		}
	}
	if len(denied) > 0 {
		return fail(name, listNames(denied),
			"apply the ClusterRoles, Roles and bindings of deploy/kubernetes/base/rbac-*.yaml (and components/fencing with fencing) through your overlay;"+
				" in another namespace than loopvol, the bindings' subjects must name it")
	}
	// Who needs what, without the Leases each elected one also needs.
	var accounts []string
	users := map[string][]string{}
	for _, n := range needs {
		if !slices.Contains(accounts, n.serviceAccount) {
			accounts = append(accounts, n.serviceAccount)
		}
		if !strings.HasSuffix(n.by, "leader election") && !slices.Contains(users[n.serviceAccount], n.by) {
			users[n.serviceAccount] = append(users[n.serviceAccount], n.by)
		}
	}
	slices.Sort(accounts)
	var who []string
	for _, sa := range accounts {
		who = append(who, sa+" ("+strings.Join(users[sa], ", ")+")")
	}
	return pass(name, fmt.Sprintf("%d requests allowed to what runs: %s", len(needs), strings.Join(who, "; ")))
}

func (d *doctorRun) checkPluginsWhereUsed(ctx context.Context) CheckResult {
	const name = "plugins-where-used"
	pvs, err := d.driverVolumes(ctx)
	if err != nil {
		return fail(name, err.Error(), "")
	}
	claims := map[string]bool{}
	for _, pv := range pvs {
		if ref := pv.Spec.ClaimRef; ref != nil {
			claims[ref.Namespace+"/"+ref.Name] = true
		}
	}
	pods, err := d.kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail(name, "list Pods: "+err.Error(), "")
	}
	var missing []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if n := d.c.node(p.Spec.NodeName); n != nil && n.pod != nil {
			continue
		}
		for _, cl := range podClaims(p) {
			if claims[p.Namespace+"/"+cl] {
				missing = append(missing, p.Spec.NodeName+" (Pod "+p.Namespace+"/"+p.Name+")")
				break
			}
		}
	}
	if len(missing) > 0 {
		return fail(name, "no node plugin on "+listNames(missing),
			"the DaemonSet loopvol-node does not run there: check its nodeSelector and tolerations against the node's labels and taints"+
				" (kubectl -n "+d.opts.driverNamespace+" describe daemonset loopvol-node)")
	}
	return pass(name, "every node with a Pod using a loopvol volume runs a node plugin")
}

func (d *doctorRun) checkNodeStatus(context.Context) CheckResult {
	const name = "node-status"
	var failed []string
	var ok int
	for _, n := range d.pluginNodes() {
		if n.statusErr != nil {
			failed = append(failed, n.name+": "+n.statusErr.Error())
			continue
		}
		ok++
	}
	if len(failed) > 0 {
		return fail(name, listNames(failed),
			"`"+statusCommand+"` runs in the node plugin's "+statusContainer+" container through pods/exec: check that you may"+
				" create pods/exec in "+d.opts.driverNamespace+", and that the driver is Ready (its logs)")
	}
	return pass(name, fmt.Sprintf("%d node plugins answered", ok))
}

func (d *doctorRun) checkPools(context.Context) CheckResult {
	const name = "pools"
	var broken, warned []string
	var pools int
	for _, n := range d.c.nodes {
		if n.status == nil {
			continue
		}
		if n.status.SelfFenced {
			broken = append(broken, n.name+": self-fenced")
		}
		for _, p := range n.status.Pools {
			pools++
			switch healthTone(p.Health) {
			case warn:
				warned = append(warned, n.name+"/"+p.Name+": "+p.Health)
			case bad:
				broken = append(broken, n.name+"/"+p.Name+": "+p.Health)
			}
		}
	}
	switch {
	case len(broken) > 0:
		return fail(name, listNames(broken),
			"kubectl loopvol status shows each pool's message; a pool that is unusable or overcommitted takes no new volume (docs/operations.md)")
	case len(warned) > 0:
		return warning(name, listNames(warned), "free space or grow the pool before it fills (docs/operations.md)")
	case pools == 0:
		return warning(name, "no node plugin reported a pool", "")
	}
	return pass(name, fmt.Sprintf("%d pools %s", pools, statusapi.HealthOK))
}

// claimsStuckAfter is how long a Pending claim may wait for something
// other than space before doctor warns: provisioning, binding and a
// WaitForFirstConsumer claim's scheduling take seconds.
const claimsStuckAfter = 5 * time.Minute

// checkClaims names the Pending claims of the driver's classes that wait
// for space (describe's Waiting: line): they fail, as nothing changes
// until space is freed or the claim asks less. Claims waiting long for
// anything else warn; a WaitForFirstConsumer claim no Pod uses yet waits
// as it should.
func (d *doctorRun) checkClaims(ctx context.Context) CheckResult {
	const name = "claims"
	pvcs, err := d.kube.CoreV1().PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail(name, "list PersistentVolumeClaims: "+err.Error(), "")
	}
	var noSpace, stuck []string
	pending := 0
	for i := range pvcs.Items {
		pvc := &pvcs.Items[i]
		if pvc.Status.Phase != corev1.ClaimPending {
			continue
		}
		if ours, err := d.claimIsOurs(ctx, pvc); err != nil || !ours {
			continue
		}
		pending++
		p, err := d.claimPath(ctx, pvc, nil)
		if err != nil {
			stuck = append(stuck, pvc.Namespace+"/"+pvc.Name+": "+err.Error())
			continue
		}
		switch {
		case strings.HasPrefix(p.Waiting, waitingForSpace):
			noSpace = append(noSpace, pvc.Namespace+"/"+pvc.Name+" ("+p.Requested+")")
		case strings.HasPrefix(p.Waiting, waitingForAPod):
		case d.now().Sub(pvc.CreationTimestamp.Time) > claimsStuckAfter:
			stuck = append(stuck, pvc.Namespace+"/"+pvc.Name+" "+p.Waiting)
		}
	}
	switch {
	case len(noSpace) > 0:
		return fail(name, "waiting for space: "+listNames(noSpace),
			"no pool of the claim's topology has that much available (kubectl loopvol status shows each pool's free space):"+
				" free space, add a pool, or ask less; kubectl loopvol describe pvc NAME -n NAMESPACE says what the claim waits for")
	case len(stuck) > 0:
		return warning(name, "waiting for more than "+claimsStuckAfter.String()+": "+listNames(stuck),
			"kubectl loopvol describe pvc NAME -n NAMESPACE shows the Events on the claim's way")
	}
	return pass(name, fmt.Sprintf("no claim waits for space (%d Pending)", pending))
}
