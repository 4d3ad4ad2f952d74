package e2ek8s

import (
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The JUnit report e2e.test writes with -report-dir (ginkgo's
// reporters.GenerateJUnitReportWithConfig): one testcase per spec, the
// spec's state in its status attribute, a skip's reason in <skipped
// message>, a failure's text in <failure>.
type junitSuites struct {
	Suites []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Cases []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name    string  `xml:"name,attr"`
	Status  string  `xml:"status,attr"`
	Time    float64 `xml:"time,attr"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
	Failure *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"failure"`
	Error *struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	} `xml:"error"`
}

// outcome is what became of one spec.
type outcome int

const (
	passed outcome = iota
	failed
	// skipped: the spec ran its setup and skipped itself, with a
	// reason (a capability the driver lacks, one node, ...).
	skipped
	// notSelected: left out by -ginkgo.focus/-ginkgo.skip (the fast
	// subset leaves out Serial, Disruptive and Slow).
	notSelected
)

func (o outcome) String() string {
	return [...]string{"passed", "failed", "skipped", "not selected"}[o]
}

// spec is one of the driver's generated specs.
type spec struct {
	name    string
	group   string // the storage test suite: provisioning, volumes, snapshottable, ...
	pattern string // the test pattern: Dynamic PV (ext4), ...
	outcome outcome
	reason  string // why it was skipped, or the failure's first line
	time    time.Duration
}

// driverSpec matches the names of the driver's specs:
// "[sig-storage] External Storage [Driver: loopvol.csi.io] [Testpattern: Dynamic PV (ext4)] volumes should store data".
var driverSpec = regexp.MustCompile(`External Storage \[Driver: ([^\]]+)\] \[Testpattern: ([^\]]+)\] (\S+)`)

// parseJUnit reads the report and returns the specs of driver. Specs of
// the suite's other drivers and of other suites are left out.
func parseJUnit(r io.Reader, driver string) ([]spec, error) {
	var doc junitSuites
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if err := xml.Unmarshal(data, &doc); err != nil {
		// A single <testsuite> at the top.
		var one junitSuite
		if err2 := xml.Unmarshal(data, &one); err2 != nil {
			return nil, fmt.Errorf("parse JUnit report: %w", err)
		}
		doc.Suites = []junitSuite{one}
	}
	var specs []spec
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			m := driverSpec.FindStringSubmatch(c.Name)
			if m == nil || m[1] != driver {
				continue
			}
			sp := spec{
				name:    strings.TrimPrefix(c.Name, "[It] "),
				pattern: m[2],
				group:   m[3],
				time:    time.Duration(c.Time * float64(time.Second)),
			}
			switch {
			case c.Failure != nil || c.Error != nil || (c.Status != "" && c.Status != "passed" && c.Status != "skipped" && c.Status != "pending"):
				sp.outcome = failed
				sp.reason = failureLine(c)
			case c.Skipped != nil || c.Status == "skipped" || c.Status == "pending":
				msg := ""
				if c.Skipped != nil {
					msg = c.Skipped.Message
				}
				// ginkgo writes "skipped" alone for a spec its filters
				// left out and "skipped - <reason>" for a Skip() call.
				if reason, ok := strings.CutPrefix(msg, "skipped - "); ok {
					sp.outcome = skipped
					sp.reason = firstLine(reason)
				} else {
					sp.outcome = notSelected
				}
			default:
				sp.outcome = passed
			}
			specs = append(specs, sp)
		}
	}
	return specs, nil
}

func failureLine(c junitCase) string {
	for _, s := range []*struct {
		Message string `xml:"message,attr"`
		Text    string `xml:",chardata"`
	}{c.Failure, c.Error} {
		if s == nil {
			continue
		}
		if s.Message != "" {
			return firstLine(s.Message)
		}
		// The text starts with "[FAILED] <message>" after the
		// timeline's header lines.
		for _, l := range strings.Split(s.Text, "\n") {
			if after, ok := strings.CutPrefix(strings.TrimSpace(l), "[FAILED] "); ok {
				return after
			}
		}
		return firstLine(s.Text)
	}
	return c.Status
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// groupRow is one line of the summary table.
type groupRow struct {
	group                                string
	total, pass, fail, skip, notSelected int
	time                                 time.Duration
}

// summarize counts the specs per group (the storage test suite), in name
// order, and the totals.
func summarize(specs []spec) (rows []groupRow, total groupRow) {
	by := map[string]*groupRow{}
	total.group = "all"
	for _, s := range specs {
		r := by[s.group]
		if r == nil {
			r = &groupRow{group: s.group}
			by[s.group] = r
		}
		for _, row := range []*groupRow{r, &total} {
			row.total++
			row.time += s.time
			switch s.outcome {
			case passed:
				row.pass++
			case failed:
				row.fail++
			case skipped:
				row.skip++
			case notSelected:
				row.notSelected++
			}
		}
	}
	for _, r := range by {
		rows = append(rows, *r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].group < rows[j].group })
	return rows, total
}

// table writes the summary as a Markdown table: spec group, generated
// specs, passed, failed, skipped by the suite, not selected, time.
func table(w io.Writer, specs []spec) {
	rows, total := summarize(specs)
	fmt.Fprintln(w, "| spec group | specs | passed | failed | skipped | not selected | time |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, r := range append(rows, total) {
		name := r.group
		if r.group == "all" {
			name = "**all**"
		}
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %s |\n", name, r.total, r.pass, r.fail, r.skip, r.notSelected, r.time.Round(time.Second))
	}
}

// skipReasons counts the specs per skip (or failure) reason, most first.
func reasons(specs []spec, o outcome) []string {
	count := map[string]int{}
	for _, s := range specs {
		if s.outcome == o {
			count[s.reason]++
		}
	}
	var out []string
	for r, n := range count {
		out = append(out, fmt.Sprintf("%4d × %s", n, r))
	}
	sort.Slice(out, func(i, j int) bool {
		ni, _ := strconv.Atoi(strings.TrimSpace(out[i][:4]))
		nj, _ := strconv.Atoi(strings.TrimSpace(out[j][:4]))
		if ni != nj {
			return ni > nj
		}
		return out[i] < out[j]
	})
	return out
}

// readJUnit parses the reports of one or more runs of e2e.test. Each run's
// report lists every spec, those it left out as not selected, so a spec
// is counted once, by the run that selected it.
func readJUnit(files []string, driver string) ([]spec, error) {
	var all []spec
	at := map[string]int{}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		specs, err := parseJUnit(fh, driver)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, s := range specs {
			i, seen := at[s.name]
			switch {
			case !seen:
				at[s.name] = len(all)
				all = append(all, s)
			case all[i].outcome == notSelected:
				all[i] = s
			}
		}
	}
	return all, nil
}
