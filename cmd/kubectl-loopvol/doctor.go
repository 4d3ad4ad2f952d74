package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// defaultKubeletDir is kubelet's --root-dir unless a distribution moves it.
const defaultKubeletDir = "/var/lib/kubelet"

// Results of a check.
const (
	resultPass = "pass"
	resultWarn = "warn"
	resultFail = "fail"
)

func newDoctorCommand(run runner) *cobra.Command {
	return &cobra.Command{
		Use:   "doctor",
		Short: "Check loopvol's installation and say what to do about each failure",
		Long: "doctor checks the CSIDriver, the node plugins' registration and kubelet directory,\n" +
			"the volume limits, CSIStorageCapacity per class and segment, the webhook's caBundle\n" +
			"and endpoints, the admission policies' bindings, the ServiceAccounts' RBAC, node\n" +
			"plugins missing where loopvol volumes are used, and every node's status and pools.\n" +
			"It prints one line per check and, for a failure, what to do; it exits 1 when a check\n" +
			"failed (warnings do not fail).",
		Args: cobra.NoArgs,
		RunE: run(func(ctx context.Context, e *env, _ []string) error {
			r, err := e.doctor(ctx)
			if err != nil {
				return err
			}
			if ok, err := printObject(e.out, e.opts.output, r); ok {
				if err != nil {
					return err
				}
			} else {
				r.write(e)
			}
			if r.Failed > 0 {
				return errChecksFailed
			}
			return nil
		}),
	}
}

// DoctorReport is what doctor found.
type DoctorReport struct {
	Checks   []CheckResult `json:"checks"`
	Failed   int           `json:"failed"`
	Warnings int           `json:"warnings"`
}

// CheckResult is one check: pass, warn or fail, what was found, and for
// anything but a pass what to do.
type CheckResult struct {
	Name   string `json:"name"`
	Result string `json:"result"`
	Detail string `json:"detail"`
	Hint   string `json:"hint,omitempty"`
}

func pass(name, detail string) CheckResult {
	return CheckResult{Name: name, Result: resultPass, Detail: detail}
}

func fail(name, detail, hint string) CheckResult {
	return CheckResult{Name: name, Result: resultFail, Detail: detail, Hint: hint}
}

func warning(name, detail, hint string) CheckResult {
	return CheckResult{Name: name, Result: resultWarn, Detail: detail, Hint: hint}
}

// doctorRun is one run of the checks over what gather found.
type doctorRun struct {
	*env
	c *cluster
}

func (e *env) doctor(ctx context.Context) (*DoctorReport, error) {
	c, err := e.gather(ctx, nil)
	if err != nil {
		return nil, err
	}
	d := &doctorRun{env: e, c: c}
	r := &DoctorReport{}
	for _, check := range []func(context.Context) CheckResult{
		d.checkCSIDriver,
		d.checkRegistration,
		d.checkKubeletDir,
		d.checkVolumeLimit,
		d.checkStorageCapacity,
		d.checkWebhook,
		d.checkPolicies,
		d.checkRBAC,
		d.checkPluginsWhereUsed,
		d.checkNodeStatus,
		d.checkPools,
		d.checkClaims,
	} {
		res := check(ctx)
		switch res.Result {
		case resultFail:
			r.Failed++
		case resultWarn:
			r.Warnings++
		}
		r.Checks = append(r.Checks, res)
	}
	return r, nil
}

func (r *DoctorReport) write(e *env) {
	width := 0
	for _, ch := range r.Checks {
		width = max(width, len(ch.Name))
	}
	for _, ch := range r.Checks {
		tn := map[string]tone{resultPass: good, resultWarn: warn, resultFail: bad}[ch.Result]
		// The detail is wrapped, not cut: it names what is wrong.
		lead := 6 + width + 2
		detail := wrap(ch.Detail, lead, lead)
		fmt.Fprintf(e.out, "%s  %-*s  %s\n", paint(fmt.Sprintf("%-4s", strings.ToUpper(ch.Result)), tn, e.color), width, ch.Name, detail)
		if ch.Hint != "" {
			fmt.Fprintln(e.out, wrap("      → "+ch.Hint, 0, 8))
		}
	}
	fmt.Fprintf(e.out, "\n%d checks: %d failed, %d warnings\n", len(r.Checks), r.Failed, r.Warnings)
}

// listNames joins names for a detail line, at most a few of them.
func listNames(names []string) string {
	const most = 4
	if len(names) <= most {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:most], ", ") + fmt.Sprintf(" and %d more", len(names)-most)
}
