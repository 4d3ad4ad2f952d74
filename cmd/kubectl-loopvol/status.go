package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/loopvol/loopvol/pkg/attach"
	"github.com/loopvol/loopvol/pkg/capacity"
	"github.com/loopvol/loopvol/pkg/fencing"
	"github.com/loopvol/loopvol/pkg/placement"
	"github.com/loopvol/loopvol/pkg/resize"
	"github.com/loopvol/loopvol/pkg/statusapi"
)

func newStatusCommand(run runner) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show pools, node plugins, controllers, webhook and policies on one screen",
		Long: "status shows, per zone and node, the node plugin and its registration (CSINode) and\n" +
			"the pools as the node plugin sees them; then the sidecar's controllers and their\n" +
			"leaders (Leases), the admission webhook and the ValidatingAdmissionPolicies.",
		Args: cobra.NoArgs,
		RunE: run(func(ctx context.Context, e *env, _ []string) error {
			r, err := e.status(ctx)
			if err != nil {
				return err
			}
			if ok, err := printObject(e.out, e.opts.output, r); ok {
				return err
			}
			r.write(e)
			return nil
		}),
	}
}

// StatusReport is what status shows.
type StatusReport struct {
	Driver          string             `json:"driver"`
	DriverNamespace string             `json:"driverNamespace"`
	Nodes           []NodeReport       `json:"nodes"`
	Controllers     []ControllerReport `json:"controllers"`
	Webhook         WebhookReport      `json:"webhook"`
	Policies        []PolicyReport     `json:"policies"`
}

// NodeReport is one node: its plugin, its registration and its pools.
type NodeReport struct {
	Name string `json:"name"`
	Zone string `json:"zone,omitempty"`
	// PluginPod is the node plugin Pod, "" when none runs on the node.
	PluginPod   string `json:"pluginPod,omitempty"`
	PluginReady bool   `json:"pluginReady"`
	// Registered says the node's CSINode lists the driver; Allocatable is
	// its volume limit there.
	Registered  bool   `json:"registered"`
	Allocatable *int32 `json:"allocatable,omitempty"`
	Version     string `json:"version,omitempty"`
	SelfFenced  bool   `json:"selfFenced,omitempty"`
	// Volumes is how many volumes the node has staged or holds a device of.
	Volumes int                    `json:"volumes"`
	Pools   []statusapi.PoolStatus `json:"pools,omitempty"`
	// Error says why the node plugin's status is missing.
	Error string `json:"error,omitempty"`
}

// ControllerReport is one leader-elected controller of the sidecar.
type ControllerReport struct {
	Name  string `json:"name"`
	Lease string `json:"lease"`
	// Found says the Lease exists; Holder and RenewTime are its spec's.
	Found     bool              `json:"found"`
	Holder    string            `json:"holder,omitempty"`
	RenewTime *metav1.MicroTime `json:"renewTime,omitempty"`
	// Expired says the holder has not renewed within its lease duration.
	Expired bool `json:"expired,omitempty"`
}

// WebhookReport is the admission webhook's configuration and Service.
type WebhookReport struct {
	Name  string `json:"name"`
	Found bool   `json:"found"`
	// Services are the Services the webhooks call, namespace/name.
	Services       []string `json:"services,omitempty"`
	ReadyEndpoints int      `json:"readyEndpoints"`
	// CABundle says every webhook of the configuration has a caBundle.
	CABundle bool `json:"caBundle"`
}

// PolicyReport is one of loopvol's ValidatingAdmissionPolicies.
type PolicyReport struct {
	Name     string   `json:"name"`
	Bound    bool     `json:"bound"`
	Bindings []string `json:"bindings,omitempty"`
}

// controller names and the Lease each elects its leader with; the resize
// and modify controllers share the resizer's.
func controllerLeases(driver string) []ControllerReport {
	return []ControllerReport{
		{Name: "attach", Lease: attach.LeaseName(driver)},
		{Name: "capacity", Lease: capacity.LeaseName(driver)},
		{Name: "resize, modify", Lease: resize.LeaseName(driver)},
		{Name: "placement", Lease: placement.LeaseName(driver)},
		{Name: "fencing", Lease: fencing.LeaseName(driver)},
	}
}

func (e *env) status(ctx context.Context) (*StatusReport, error) {
	c, err := e.gather(ctx, nil)
	if err != nil {
		return nil, err
	}
	r := &StatusReport{Driver: e.opts.driver, DriverNamespace: e.opts.driverNamespace}
	for _, n := range c.nodes {
		r.Nodes = append(r.Nodes, nodeReport(n))
	}
	if r.Controllers, err = e.controllers(ctx); err != nil {
		return nil, err
	}
	if r.Webhook, err = e.webhook(ctx); err != nil {
		return nil, err
	}
	if r.Policies, err = e.policies(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

func nodeReport(n *nodeView) NodeReport {
	r := NodeReport{Name: n.name, Zone: n.zone(), Registered: n.driver != nil}
	if n.pod != nil {
		r.PluginPod, r.PluginReady = n.pod.Name, podReady(n.pod)
	}
	if n.driver != nil && n.driver.Allocatable != nil {
		r.Allocatable = n.driver.Allocatable.Count
	}
	if n.status != nil {
		r.Version, r.SelfFenced = n.status.Version, n.status.SelfFenced
		r.Volumes, r.Pools = len(n.status.Volumes), n.status.Pools
	} else if n.pod != nil {
		r.Error = n.statusErr.Error()
	}
	return r
}

func (e *env) controllers(ctx context.Context) ([]ControllerReport, error) {
	out := controllerLeases(e.opts.driver)
	for i := range out {
		l, err := e.kube.CoordinationV1().Leases(e.opts.driverNamespace).Get(ctx, out[i].Lease, metav1.GetOptions{})
		if err != nil {
			if err = ignoreNotFound(err); err != nil {
				return nil, fmt.Errorf("get Lease %s/%s: %w", e.opts.driverNamespace, out[i].Lease, err)
			}
			continue
		}
		out[i].Found = true
		if l.Spec.HolderIdentity != nil {
			out[i].Holder = *l.Spec.HolderIdentity
		}
		out[i].RenewTime = l.Spec.RenewTime
		out[i].Expired = leaseExpired(l, e.now())
	}
	return out, nil
}

// leaseExpired says whether the Lease's holder let it run out: no leader acts.
func leaseExpired(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || l.Spec.RenewTime == nil {
		return true
	}
	d := 15 * time.Second
	if l.Spec.LeaseDurationSeconds != nil {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return now.After(l.Spec.RenewTime.Add(d))
}

// write prints the report as tables.
func (r *StatusReport) write(e *env) {
	w := e.out
	fmt.Fprintf(w, "Driver %s in namespace %s\n\n", r.Driver, r.DriverNamespace)
	var problems []string
	shared := false
	nodes := &table{header: []string{"ZONE", "NODE", "PLUGIN", "READY", "CSINODE", "LIMIT", "VOLUMES", "VERSION"}}
	pools := &table{header: []string{"NODE", "POOL", "SIZE", "USED", "PROMISED", "FREE", "VOLUMES", "ORPHANS", "HEALTH"}}
	for _, n := range r.Nodes {
		limit := "-"
		if n.Allocatable != nil {
			limit = strconv.Itoa(int(*n.Allocatable))
		}
		plugin, ready, reg := cell{text: "none", tone: warn}, cell{text: "-"}, cell{text: "missing", tone: warn}
		if n.PluginPod != "" {
			plugin = cut(n.PluginPod, 22)
			ready = cell{text: yesNo(n.PluginReady), tone: pick(n.PluginReady, good, bad)}
			reg.tone = bad
		}
		if n.Registered {
			reg = cell{text: "yes", tone: good}
		}
		volumes, version := "-", cell{text: "-"}
		if n.Error == "" && n.PluginPod != "" {
			volumes, version = strconv.Itoa(n.Volumes), cut(n.Version, 12)
		}
		if n.SelfFenced {
			version = cell{text: "self-fenced", tone: bad}
			problems = append(problems, n.Name+": the node plugin lost its heartbeat and froze its shared-pool volumes")
		}
		if n.Error != "" {
			version = cell{text: "error", tone: bad}
			problems = append(problems, n.Name+": "+n.Error)
		}
		nodes.add(cut(orDash(n.Zone), 10), cut(n.Name, 18), plugin, ready, reg, c(limit), c(volumes), version)
		for _, p := range n.Pools {
			health := cell{text: p.Health, tone: healthTone(p.Health), limit: 14}
			name := p.Name
			if p.Shared {
				name += "*"
				shared = true
			}
			pools.add(cut(n.Name, 16), cut(name, 14), c(bytesIEC(p.TotalBytes)), c(bytesIEC(p.TotalBytes-p.FreeBytes)),
				c(bytesIEC(p.PromisedBytes)), c(bytesIEC(p.FreeBytes)), c(strconv.Itoa(p.Volumes)), c(strconv.Itoa(p.OrphanImages)), health)
			if p.Message != "" {
				problems = append(problems, n.Name+"/"+p.Name+": "+p.Message)
			}
		}
	}
	fmt.Fprintln(w, "NODES")
	nodes.write(w, e.color)
	if len(pools.rows) > 0 {
		fmt.Fprintln(w, "\nPOOLS")
		pools.write(w, e.color)
		if shared {
			fmt.Fprintln(w, "* shared: every node of the zone serves the pool")
		}
	}
	if len(problems) > 0 {
		fmt.Fprintln(w)
		for _, p := range problems {
			fmt.Fprintln(w, paint(truncate(p, maxWidth), bad, e.color))
		}
	}

	fmt.Fprintf(w, "\nCONTROLLERS (Leases in %s)\n", r.DriverNamespace)
	ctl := &table{header: []string{"CONTROLLER", "LEASE", "LEADER", "RENEWED"}}
	for _, l := range r.Controllers {
		switch {
		case !l.Found:
			ctl.add(c(l.Name), cut(l.Lease, 40), cell{text: "not running", tone: warn}, c("-"))
		case l.Expired:
			ctl.add(c(l.Name), cut(l.Lease, 40), cell{text: orDash(l.Holder), tone: warn, limit: 26}, cell{text: renewed(l.RenewTime, e.now()) + " (expired)", tone: warn})
		default:
			ctl.add(c(l.Name), cut(l.Lease, 40), cell{text: l.Holder, tone: good, limit: 26}, c(renewed(l.RenewTime, e.now())))
		}
	}
	ctl.write(w, e.color)

	fmt.Fprintln(w)
	text, t := r.Webhook.summary()
	fmt.Fprintln(w, paint(truncate(text, maxWidth), t, e.color))

	if len(r.Policies) == 0 {
		fmt.Fprintln(w, "\nPOLICIES: none named loopvol-*")
		return
	}
	fmt.Fprintln(w, "\nPOLICIES")
	pt := &table{header: []string{"POLICY", "BOUND", "BINDINGS"}}
	for _, p := range r.Policies {
		pt.add(cut(p.Name, 44), cell{text: yesNo(p.Bound), tone: pick(p.Bound, good, bad)}, cut(orDash(strings.Join(p.Bindings, ",")), 44))
	}
	pt.write(w, e.color)
}

// renewed is how long ago a Lease was renewed.
func renewed(t *metav1.MicroTime, now time.Time) string {
	if t == nil {
		return "never"
	}
	return age(now.Sub(t.Time)) + " ago"
}

// healthTone colours a pool's health: ok, a warning while it can still
// take volumes, else bad.
func healthTone(h string) tone {
	switch h {
	case statusapi.HealthOK:
		return good
	case "PoolNearlyFull":
		return warn
	}
	return bad
}

// pick is a if cond, else b.
func pick[T any](cond bool, a, b T) T {
	if cond {
		return a
	}
	return b
}
