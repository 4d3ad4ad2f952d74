package bench

import (
	"fmt"
	"strings"
	"time"
)

// printAttacherReport prints the table, the write breakdown and the goals
// of issue 3 as markdown, ready for docs/benchmarks.md.
func printAttacherReport(k attacherKnobs, version string, withUpstream bool, ceilings []float64, results []attacherResult) {
	fmt.Printf("\n## attacher: VolumeAttachment throughput, kube-apiserver %s, %d VAs over %d nodes (external-attacher at its defaults: %d VAs), ListVolumes reconcile %t\n\n",
		version, k.vas, k.nodes, k.upstreamDefaultVAs, k.listVolumes)
	ceiling := 0.0
	if len(ceilings) > 0 {
		parts := make([]string, len(ceilings))
		for i, c := range ceilings {
			parts[i] = fmt.Sprintf("%.0f", c)
			ceiling = max(ceiling, c)
		}
		fmt.Printf("API server ceiling: %.0f VolumeAttachment status patches/s (%d unthrottled goroutines, %s; at start and end: %s; the higher one is used)\n\n",
			ceiling, k.ceilingWorkers, k.ceilingFor, strings.Join(parts, ", "))
	}
	upstreamOf := func(r attacherResult) *attacherResult {
		for i := range results {
			u := &results[i]
			if u.attacher == "external-attacher" && u.flags == r.flags && u.backlog == r.backlog && u.publishLatency == r.publishLatency && u.done {
				return u
			}
		}
		return nil
	}
	fmt.Println("| attacher | flags | publish latency | VAs | all attached | attaches/s | × external-attacher | median | p99 | all detached | ControllerPublish/VA | writes/(attach+detach) | peak RSS |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		if !r.done {
			fmt.Printf("| %s | %s | %s | %d | did not finish: %s | | | | | | | | |\n", r.attacher, r.scenario(), r.publishLatency, r.vas, r.problem)
			continue
		}
		ratio := "—"
		if u := upstreamOf(r); u != nil && r.attacher != "external-attacher" {
			ratio = fmt.Sprintf("%.1f×", r.attachesPerSec()/u.attachesPerSec())
		}
		fmt.Printf("| %s | %s | %s | %d | %.1f s | %.1f | %s | %s | %s | %.1f s | %.2f | %.2f | %.0f MB |\n",
			r.attacher, r.scenario(), r.publishLatency, r.vas, r.attachAll.Seconds(), r.attachesPerSec(), ratio,
			short(r.attachLat.median), short(r.attachLat.p99), r.detachAll.Seconds(),
			float64(r.publishes)/float64(r.vas), r.writesPerVA(), float64(r.mem.peakRSS)/1e6)
	}
	fmt.Println("\nA backlog run creates its VAs before the attacher starts and times from the attacher's first VA (finalizer seen) to the last attached.")
	fmt.Println("\nWrites in each window (apiserver_request_total, verbs POST/PUT/PATCH/APPLY/DELETE/DELETECOLLECTION, all response codes), the benchmark's own VolumeAttachment creates and deletes included here and subtracted in the table:")
	for _, r := range results {
		other := r.writes.total() - r.writes.total(attacherResources...)
		fmt.Printf("- %s: %s; own %.0f; other resources %.0f. ControllerUnpublish/VA %.2f; VAs published ≠ once: %d; VAs that showed an attachError: %d. CPU in the window: attacher %.1f s (%.1f ms per attach+detach), kube-apiserver %.1f s (%.1f ms). Attacher memory at the end: RssAnon %.0f MB, RssFile %.0f MB. The benchmark's creates took %.1f s; median creation → finalizer seen %s, finalizer → attached seen %s. API server writes until all attached: %.0f/s; CPU of the whole machine busy %.0f%%%s\n",
			r.name(), r.writes.filter(attacherResources...), r.ownWrites, other,
			float64(r.unpublish)/float64(r.vas), r.notOnce, r.attachErrs,
			r.attacherCPU.Seconds(), r.attacherCPU.Seconds()*1000/float64(r.vas), r.apiserverCPU, r.apiserverCPU*1000/float64(r.vas),
			float64(r.mem.anon)/1e6, float64(r.mem.file)/1e6,
			r.createAll.Seconds(), short(r.claimLat.median), short(r.workLat.median), r.attachWrites/r.attachAll.Seconds(), 100*r.cpuBusy, warn(r.foreign))
	}

	fmt.Println("\nGoals of issue 3 (loopvol's attacher):")
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	for _, r := range results {
		if r.attacher != "loopvol" || !r.done {
			continue
		}
		tag := fmt.Sprintf("%s, publish %s", r.scenario(), r.publishLatency)
		if r.flags == "tuned" && ceiling > 0 {
			goal := 0.8 * ceiling / 3
			rate := r.attachWrites / r.attachAll.Seconds()
			fmt.Printf("- tuned ≥ 80%% of ceiling/3 = %.0f attaches/s (%s): %.1f → %s; API server writes until all attached %.0f/s = %.0f%% of the ceiling, the machine's CPU %.0f%% busy",
				goal, tag, r.attachesPerSec(), verdict(r.attachesPerSec() >= goal), rate, 100*rate/ceiling, 100*r.cpuBusy)
			if !r.backlog {
				fmt.Printf(" (the benchmark's creates share the API server: with 1 create + 3 attacher writes per VA, ceiling/4 = %.0f attaches/s is the bound)", ceiling/4)
			}
			fmt.Println()
		}
		if r.flags == "defaults" {
			if u := upstreamOf(r); u != nil {
				x := r.attachesPerSec() / u.attachesPerSec()
				fmt.Printf("- defaults ≥ 20× external-attacher's defaults (%s): %.1f vs %.2f attaches/s = %.1f× → %s\n", tag, r.attachesPerSec(), u.attachesPerSec(), x, verdict(x >= 20))
			} else if withUpstream {
				fmt.Printf("- defaults ≥ 20× external-attacher's defaults (%s): no external-attacher figure\n", tag)
			}
		}
		fmt.Printf("- exactly 1 ControllerPublish per VA (%s): %d calls for %d VAs, %d VAs not once → %s\n", tag, r.publishes, r.vas, r.notOnce, verdict(r.notOnce == 0))
		fmt.Printf("- ≤ 4 writes per attach+detach (%s): %.2f → %s\n", tag, r.writesPerVA(), verdict(r.writesPerVA() <= 4))
		if r.vas >= 2000 {
			fmt.Printf("- peak RSS ≤ 60 MB at %d VAs (%s): %.0f MB → %s\n", r.vas, tag, float64(r.mem.peakRSS)/1e6, verdict(r.mem.peakRSS <= 60e6))
		}
	}
}

// short prints a latency in ms below 10 s, else in s.
func short(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000)
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

func warn(s string) string {
	if s == "" {
		return ""
	}
	return ". WARNING: " + s
}
