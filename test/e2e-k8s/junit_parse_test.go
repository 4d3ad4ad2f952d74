package e2ek8s

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A report as e2e.test writes it (ginkgo's JUnit, shortened): a passed,
// a failed and a self-skipped spec of the driver, one its filters left
// out, and a spec of another suite.
const sampleJUnit = `<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="5" disabled="1" errors="0" failures="1" time="90.5">
  <testsuite name="Kubernetes e2e suite" package="/" tests="5" disabled="1" skipped="2" errors="0" failures="1" time="90.5">
    <testcase name="[It] [sig-storage] External Storage [Driver: loopvol.csi.io] [Testpattern: Dynamic PV (ext4)] volumes should store data" classname="Kubernetes e2e suite" status="passed" time="40.25"></testcase>
    <testcase name="[It] [sig-storage] External Storage [Driver: loopvol.csi.io] [Testpattern: Dynamic PV (xfs)] volume-expand should resize volume when PVC is edited while pod is using it" classname="Kubernetes e2e suite" status="failed" time="50"><failure type="failed">[FAILED] Timed out after 300s.
Expected the filesystem to grow
In [It] at: resize.go:123</failure></testcase>
    <testcase name="[It] [sig-storage] External Storage [Driver: loopvol.csi.io] [Testpattern: Pre-provisioned PV (default fs)] subPath should support existing directory" classname="Kubernetes e2e suite" status="skipped" time="0.25"><skipped message="skipped - Driver loopvol.csi.io doesn't support PreprovisionedPV -- skipping"></skipped></testcase>
    <testcase name="[It] [sig-storage] External Storage [Driver: loopvol.csi.io] [Testpattern: Dynamic PV (default fs)] volumeLimits should support volume limits [Serial]" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-apps] Deployment should work" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
  </testsuite>
</testsuites>`

func TestParseJUnit(t *testing.T) {
	specs, err := parseJUnit(strings.NewReader(sampleJUnit), "loopvol.csi.io")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		group, pattern string
		outcome        outcome
		reason         string
		time           time.Duration
	}{
		{group: "volumes", pattern: "Dynamic PV (ext4)", outcome: passed, time: 40250 * time.Millisecond},
		{group: "volume-expand", pattern: "Dynamic PV (xfs)", outcome: failed, reason: "Timed out after 300s.", time: 50 * time.Second},
		{group: "subPath", pattern: "Pre-provisioned PV (default fs)", outcome: skipped, reason: "Driver loopvol.csi.io doesn't support PreprovisionedPV -- skipping", time: 250 * time.Millisecond},
		{group: "volumeLimits", pattern: "Dynamic PV (default fs)", outcome: notSelected},
	}
	if len(specs) != len(want) {
		t.Fatalf("%d specs, want %d: %+v", len(specs), len(want), specs)
	}
	for i, w := range want {
		s := specs[i]
		if s.group != w.group || s.pattern != w.pattern || s.outcome != w.outcome || s.reason != w.reason || s.time != w.time {
			t.Errorf("spec %d: %+v, want %+v", i, s, w)
		}
	}
	rows, total := summarize(specs)
	if len(rows) != 4 || total.total != 4 || total.pass != 1 || total.fail != 1 || total.skip != 1 || total.notSelected != 1 {
		t.Errorf("summary %+v, total %+v", rows, total)
	}
	var b strings.Builder
	table(&b, specs)
	if !strings.Contains(b.String(), "| **all** | 4 | 1 | 1 | 1 | 1 | 1m31s |") {
		t.Errorf("table:\n%s", b.String())
	}
	if r := reasons(specs, skipped); len(r) != 1 || !strings.Contains(r[0], "1 × Driver loopvol.csi.io doesn't support PreprovisionedPV") {
		t.Errorf("skip reasons %q", r)
	}
}

func TestSelection(t *testing.T) {
	for _, tc := range []struct {
		name, suite, focus, skip string
		wantFocus, wantSkip      string
	}{
		{name: "default → fast", wantFocus: `External.Storage`, wantSkip: slowTags},
		{name: "rest → only the slow tags", suite: "rest", wantFocus: `External.Storage.*(` + slowTags + `)`},
		{name: "all", suite: "all", wantFocus: `External.Storage`},
		{name: "focus and skip narrow", suite: "fast", focus: "snapshot", skip: "xfs", wantFocus: `(External.Storage).*(snapshot)`, wantSkip: slowTags + "|xfs"},
		{name: "rest narrowed on either side of the tags", suite: "rest", focus: "disruptive|restart",
			wantFocus: `External.Storage.*((` + slowTags + `).*(disruptive|restart)|(disruptive|restart).*(` + slowTags + `))`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(suiteEnv, tc.suite)
			t.Setenv(focusEnv, tc.focus)
			t.Setenv(skipEnv, tc.skip)
			f, s, err := selection()
			if err != nil || f != tc.wantFocus || s != tc.wantSkip {
				t.Errorf("selection() = %q, %q, %v; want %q, %q", f, s, err, tc.wantFocus, tc.wantSkip)
			}
		})
	}
	// Against spec names as the suite writes them: the group's name
	// before its tags, the spec's words after.
	t.Setenv(suiteEnv, "rest")
	for _, tc := range []struct {
		focus, name string
		want        bool
	}{
		{"disruptive", "External Storage [Driver: loopvol.csi.io] [Testpattern: Dynamic PV (block volmode)] disruptive[Disruptive] [LinuxOnly] Should test that pv written before kubelet restart is readable after restart.", true},
		{"kubelet restart", "External Storage [Driver: loopvol.csi.io] [Testpattern: Dynamic PV (block volmode)] disruptive[Disruptive] [LinuxOnly] Should test that pv written before kubelet restart is readable after restart.", true},
		{"disruptive", "External Storage [Driver: loopvol.csi.io] [Testpattern: Dynamic PV (default fs)] subPath should be able to unmount after the subpath directory is deleted [LinuxOnly]", false},
	} {
		t.Setenv(focusEnv, tc.focus)
		focus, _, err := selection()
		if err != nil {
			t.Fatal(err)
		}
		if got := regexp.MustCompile(focus).MatchString(tc.name); got != tc.want {
			t.Errorf("rest, focus %q: %q matches %v, want %v", tc.focus, tc.name, got, tc.want)
		}
	}
	t.Setenv(suiteEnv, "bogus")
	if _, _, err := selection(); err == nil {
		t.Error("E2E_K8S_SUITE=bogus: no error")
	}
}

// Two runs' reports, as the rest suite's two runs write them: each lists
// every spec, the other run's as not selected.
func TestReadJUnitOfTwoRuns(t *testing.T) {
	dir := t.TempDir()
	limits := `[It] [sig-storage] External Storage [Driver: loopvol.csi.io] [Testpattern: Dynamic PV (default fs)] volumeLimits should support volume limits [Serial]`
	restart := `[It] [sig-storage] External Storage [Driver: loopvol.csi.io] [Testpattern: Dynamic PV (default fs)] disruptive[Disruptive] [LinuxOnly] Should test that pv written before kubelet restart is readable after restart.`
	report := func(name, limitsCase, restartCase string) string {
		f := filepath.Join(dir, name)
		doc := `<testsuites><testsuite>` +
			`<testcase name="` + limits + `" ` + limitsCase + `</testcase>` +
			`<testcase name="` + restart + `" ` + restartCase + `</testcase>` +
			`</testsuite></testsuites>`
		if err := os.WriteFile(f, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	left := `status="skipped" time="0"><skipped message="skipped"></skipped>`
	files := []string{
		report("junit_disruptive_01.xml", left, `status="failed" time="60"><failure>[FAILED] kubelet did not come back</failure>`),
		report("junit_parallel_01.xml", `status="passed" time="30">`, left),
	}
	specs, err := readJUnit(files, "loopvol.csi.io")
	if err != nil {
		t.Fatal(err)
	}
	_, total := summarize(specs)
	if total.total != 2 || total.pass != 1 || total.fail != 1 || total.notSelected != 0 {
		t.Errorf("total %+v of %+v, want 2 specs: 1 passed, 1 failed", total, specs)
	}
}

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		suite string
		procs int
		want  []pass
	}{
		{suite: "", procs: 4, want: []pass{{focus: "f", skip: "s", procs: 4}}},
		{suite: "fast", procs: 2, want: []pass{{focus: "f", skip: "s", procs: 2}}},
		{suite: "rest", procs: 1, want: []pass{{focus: "f", skip: "s", procs: 1}}},
		{suite: "rest", procs: 4, want: []pass{
			{name: "parallel_", focus: "f", skip: "s", labels: "!Disruptive", procs: 4},
			{name: "disruptive_", focus: "f", skip: "s", labels: "Disruptive", procs: 1},
		}},
		{suite: "all", procs: 3, want: []pass{
			{name: "parallel_", focus: "f", skip: "s", labels: "!Disruptive", procs: 3},
			{name: "disruptive_", focus: "f", skip: "s", labels: "Disruptive", procs: 1},
		}},
	} {
		if got := plan(tc.suite, "f", "s", tc.procs); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("plan(%q, %d) = %+v, want %+v", tc.suite, tc.procs, got, tc.want)
		}
	}
}
