package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
)

// The chart's templates/generated/ is made from the kustomize sources by
// `go -C hack/helm run . -write`: the RBAC, the CSIDriver, the admission
// policies, the webhook configuration, what the fencing and snapshotter
// components add, and deploy/monitoring's PrometheusRule and PodMonitors. Those carry no
// value a user sets but the namespace and whether they are installed, so
// the kustomize files stay their one source, comments and all. The objects
// that values shape (the workloads, the ServiceAccounts, the
// StorageClasses, the policies' params) are written by hand in templates/,
// and the equality test holds them to the overlays.

// kustomization lists one kustomization's resources that the chart takes
// as they are, and what it does to them.
type kustomization struct {
	dir string // relative to deploy/kubernetes
	// cond is the template condition the whole file is wrapped in; "" for
	// none.
	cond string
	// namespaced: kustomize's namespace transformer reaches these
	// resources (the base's `namespace: loopvol`), so objects without a
	// namespace get the release's.
	namespaced bool
	// labels are what the kustomization's `labels:` adds; the chart's
	// loopvol.labels gives them (and Helm's own) to every generated object.
	labels bool
	// handWritten are the resources whose template is in templates/.
	handWritten []string
	// fileCond overrides cond for one resource.
	fileCond map[string]string
	// labelsInclude, if set, is the template that gives the objects'
	// labels in place of loopvol.labels or loopvol.helmLabels.
	labelsInclude string
	// escapeTemplates: the file's "{{" and "}}" are not Helm's and reach
	// the rendered object as they are.
	escapeTemplates bool
}

var kustomizations = []kustomization{
	{dir: "base", namespaced: true, labels: true, handWritten: []string{
		"namespace.yaml", "serviceaccounts.yaml", "storageclass.yaml", "controller.yaml", "node.yaml",
	}},
	{dir: "base/admission", cond: ".Values.admissionPolicies.enabled", namespaced: true, labels: true, handWritten: []string{
		"params.yaml",
	}, fileCond: map[string]string{
		// The webhook is served by the controller StatefulSet's sidecar;
		// deploy: distributed has none (overlays/distributed deletes it).
		"webhook.yaml": `eq (include "loopvol.webhookEnabled" .) "true"`,
	}},
	{dir: "components/fencing", cond: ".Values.fencing.enabled"},
	{dir: "components/snapshotter", cond: ".Values.snapshots.enabled"},
}

// clusterScoped are the kinds the generator knows to be cluster-scoped;
// any other kind of a namespaced kustomization gets the namespace. A kind
// in neither list stops the generator, so a new kind is a decision.
var (
	clusterScoped = []string{
		"ClusterRole", "ClusterRoleBinding", "CSIDriver", "StorageClass", "ValidatingAdmissionPolicy",
		"ValidatingAdmissionPolicyBinding", "ValidatingWebhookConfiguration", "VolumeSnapshotClass",
		"VolumeGroupSnapshotClass",
	}
	namespacedKinds = []string{"Role", "RoleBinding", "ConfigMap", "Service", "ServiceAccount", "PrometheusRule"}
)

// generatedDir is where the generated templates go, inside the chart.
const generatedDir = "templates/generated"

// generate returns the generated templates by file name.
func generate(repo string) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, k := range kustomizations {
		resources, err := kustomizationResources(filepath.Join(repo, "deploy", "kubernetes", k.dir))
		if err != nil {
			return nil, err
		}
		for _, r := range resources {
			if slices.Contains(k.handWritten, r) || !strings.HasSuffix(r, ".yaml") {
				continue // a hand-written template, or a directory (another kustomization)
			}
			src := path.Join(k.dir, r)
			fk := k
			if c, ok := k.fileCond[r]; ok {
				fk.cond = c
			}
			tpl, err := generateFile(repo, path.Join("kubernetes", src), fk)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", src, err)
			}
			out[strings.ReplaceAll(src, "/", "_")] = tpl
		}
	}
	// The PrometheusRule is no part of any overlay; the chart offers it
	// as monitoring.prometheusRule.enabled. Its alerts' annotations are
	// Prometheus templates, which Helm must pass through.
	rule := kustomization{
		cond:            ".Values.monitoring.prometheusRule.enabled",
		namespaced:      true,
		labelsInclude:   "loopvol.prometheusRuleLabels",
		escapeTemplates: true,
	}
	tpl, err := generateFile(repo, "monitoring/prometheusrule.yaml", rule)
	if err != nil {
		return nil, fmt.Errorf("monitoring/prometheusrule.yaml: %w", err)
	}
	out["monitoring_prometheusrule.yaml"] = tpl
	// So are the PodMonitors, as monitoring.podMonitors.enabled.
	monitors := kustomization{
		cond:          ".Values.monitoring.podMonitors.enabled",
		namespaced:    true,
		labelsInclude: "loopvol.podMonitorLabels",
	}
	tpl, err = generateFile(repo, "monitoring/podmonitors.yaml", monitors)
	if err != nil {
		return nil, fmt.Errorf("monitoring/podmonitors.yaml: %w", err)
	}
	out["monitoring_podmonitors.yaml"] = tpl
	return out, nil
}

// kustomizationResources is the resources list of dir/kustomization.yaml.
func kustomizationResources(dir string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := kyaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return k.Resources, nil
}

// generateFile makes the template of deploy/<src>.
func generateFile(repo, src string, k kustomization) ([]byte, error) {
	data, err := os.ReadFile(filepath.Join(repo, "deploy", src))
	if err != nil {
		return nil, err
	}
	if k.escapeTemplates {
		// Escaped before it is parsed, so that the positions of the edits
		// below are those of the escaped text. The escapes keep the YAML
		// as it was: "{{" never starts a scalar of these files (it would
		// be a flow mapping), so each one lies inside a scalar.
		data = escapeTemplates(data)
	} else if bytes.Contains(data, []byte("{{")) {
		return nil, fmt.Errorf(`holds "{{", which Helm would take for a template: escape it in the generator first`)
	}
	// The source is edited line by line where the parsed tree points,
	// rather than re-encoded: a re-encoded file loses its folded CEL
	// expressions' line breaks and the layout its comments refer to.
	e := &editor{lines: strings.Split(string(data), "\n")}
	dec := kyaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc kyaml.Node
		if err := dec.Decode(&doc); err != nil {
			if err == io.EOF {
				break
			}
			return nil, err
		}
		if len(doc.Content) == 0 {
			continue
		}
		if err := templateObject(e, doc.Content[0], k); err != nil {
			return nil, err
		}
	}
	body, err := e.apply()
	if err != nil {
		return nil, err
	}
	// ServiceAccount user names (the policies' params, messages, comments).
	body = strings.ReplaceAll(body, "system:serviceaccount:loopvol:", "system:serviceaccount:{{ .Release.Namespace }}:")

	var b strings.Builder
	fmt.Fprintf(&b, "# Generated from deploy/%s by hack/helm (go -C hack/helm run . -write):\n# edit that file, not this one.\n", src)
	if k.cond != "" {
		fmt.Fprintf(&b, "{{- if %s }}\n", k.cond)
	}
	b.WriteString(strings.TrimRight(body, "\n") + "\n")
	if k.cond != "" {
		b.WriteString("{{- end }}\n")
	}
	return []byte(b.String()), nil
}

const (
	tplNamespace  = "{{ .Release.Namespace }}"
	tplController = `{{ include "loopvol.controllerServiceAccount" . }}`
)

// templateObject makes one object of a kustomize source a template: the
// release's namespace wherever the source names loopvol's (and on the
// namespaced objects kustomize's namespace transformer reaches), the
// controller side's ServiceAccount as the subject of every binding that
// names it (the node's in deploy: distributed), and the chart's labels.
func templateObject(e *editor, obj *kyaml.Node, k kustomization) error {
	kind := scalar(field(obj, "kind"))
	meta := field(obj, "metadata")
	name := field(meta, "name")
	if meta == nil || name == nil || meta.Style&kyaml.FlowStyle != 0 {
		return fmt.Errorf("%s: no metadata.name, or metadata in flow style", kind)
	}
	where := fmt.Sprintf("%s %s", kind, name.Value)
	nameKey := key(meta, "name")
	indent := strings.Repeat(" ", nameKey.Column-1)

	if field(meta, "namespace") == nil && k.namespaced {
		switch {
		case slices.Contains(namespacedKinds, kind):
			e.insertAfter(name.Line, indent+"namespace: "+tplNamespace)
		case !slices.Contains(clusterScoped, kind):
			return fmt.Errorf("%s: kind in neither clusterScoped nor namespacedKinds of hack/helm", where)
		}
	}
	if kind == "RoleBinding" || kind == "ClusterRoleBinding" {
		if subjects := field(obj, "subjects"); subjects != nil {
			for _, s := range subjects.Content {
				if n := field(s, "name"); scalar(field(s, "kind")) == "ServiceAccount" && n.Value == "loopvol-controller" {
					e.replace(n, tplController)
				}
			}
		}
	}
	if err := replaceNamespace(e, obj); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}

	include := "loopvol.helmLabels"
	if k.labels {
		include = "loopvol.labels"
	}
	if k.labelsInclude != "" {
		include = k.labelsInclude
	}
	labels := field(meta, "labels")
	if labels == nil {
		e.insertAfter(name.Line, indent+"labels:")
		e.insertAfter(name.Line, fmt.Sprintf("%s  {{- include %q . | nindent %d }}", indent, include, len(indent)+2))
		return nil
	}
	if labels.Style&kyaml.FlowStyle != 0 || len(labels.Content) == 0 {
		return fmt.Errorf("%s: labels in flow style", where)
	}
	first := labels.Content[0]
	e.insertAfter(key(meta, "labels").Line, fmt.Sprintf("%s{{- include %q . | nindent %d }}", strings.Repeat(" ", first.Column-1), include, first.Column-1))
	if k.labels {
		// loopvol.labels gives these, as kustomize's labels override
		// the file's.
		for i := 0; i+1 < len(labels.Content); i += 2 {
			if l := labels.Content[i]; l.Value == "app.kubernetes.io/name" || l.Value == "app.kubernetes.io/part-of" {
				e.deleteLine(l.Line)
			}
		}
	}
	return nil
}

// replaceNamespace puts the release's namespace into every namespace
// field that names loopvol's: metadata, subjects, paramRef, a Service
// reference.
func replaceNamespace(e *editor, y *kyaml.Node) error {
	switch y.Kind {
	case kyaml.MappingNode:
		for i := 0; i+1 < len(y.Content); i += 2 {
			k, v := y.Content[i], y.Content[i+1]
			if k.Value == "namespace" && v.Kind == kyaml.ScalarNode && v.Value == "loopvol" {
				if v.Style != 0 {
					return fmt.Errorf("a quoted namespace at line %d", v.Line)
				}
				e.replace(v, tplNamespace)
				continue
			}
			if err := replaceNamespace(e, v); err != nil {
				return err
			}
		}
	case kyaml.SequenceNode:
		for _, c := range y.Content {
			if err := replaceNamespace(e, c); err != nil {
				return err
			}
		}
	}
	return nil
}

func key(m *kyaml.Node, name string) *kyaml.Node {
	if m == nil || m.Kind != kyaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == name {
			return m.Content[i]
		}
	}
	return nil
}

func field(m *kyaml.Node, name string) *kyaml.Node {
	if m == nil || m.Kind != kyaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == name {
			return m.Content[i+1]
		}
	}
	return nil
}

func scalar(n *kyaml.Node) string {
	if n == nil {
		return ""
	}
	return n.Value
}

// editor collects edits of a file's lines at the positions the parser
// reported, and applies them at once, so that no edit moves another's
// position.
type editor struct {
	lines    []string
	replaces []replacement
	inserts  map[int][]string // after line (1-based)
	deletes  map[int]bool
}

type replacement struct {
	line, col int // 1-based, as the parser counts
	old, new  string
}

// replace puts text where the plain scalar n is.
func (e *editor) replace(n *kyaml.Node, text string) {
	e.replaces = append(e.replaces, replacement{line: n.Line, col: n.Column, old: n.Value, new: text})
}

func (e *editor) insertAfter(line int, text string) {
	if e.inserts == nil {
		e.inserts = map[int][]string{}
	}
	e.inserts[line] = append(e.inserts[line], text)
}

func (e *editor) deleteLine(line int) {
	if e.deletes == nil {
		e.deletes = map[int]bool{}
	}
	e.deletes[line] = true
}

func (e *editor) apply() (string, error) {
	// Right to left within a line: a flow mapping holds a subject's name
	// and namespace on one line.
	slices.SortFunc(e.replaces, func(a, b replacement) int {
		if a.line != b.line {
			return a.line - b.line
		}
		return b.col - a.col
	})
	lines := slices.Clone(e.lines)
	for _, r := range e.replaces {
		l := lines[r.line-1]
		at := r.col - 1
		if at+len(r.old) > len(l) || l[at:at+len(r.old)] != r.old {
			return "", fmt.Errorf("line %d: %q is not at column %d", r.line, r.old, r.col)
		}
		lines[r.line-1] = l[:at] + r.new + l[at+len(r.old):]
	}
	var out []string
	for i, l := range lines {
		if !e.deletes[i+1] {
			out = append(out, l)
		}
		out = append(out, e.inserts[i+1]...)
	}
	return strings.Join(out, "\n"), nil
}

var helmDelims = regexp.MustCompile(`\{\{|\}\}`)

// escapeTemplates makes every "{{" and "}}" of data a Helm template that
// prints it.
func escapeTemplates(data []byte) []byte {
	return helmDelims.ReplaceAllFunc(data, func(d []byte) []byte {
		return []byte(`{{ "` + string(d) + `" }}`)
	})
}
