package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/loopvol/loopvol/pkg/loop"
	"github.com/loopvol/loopvol/pkg/loop/looptest"
)

// BenchmarkLoopDiscardLimit measures what refusing discards on a thick
// volume's loop device costs its attach and detach (pkg/loop Tune and
// Detach): a thick cycle tunes the device to refuse discards, so its
// Detach also removes the device (LOOP_CTL_REMOVE) and the next Attach
// makes a new one; a thin cycle, the baseline, leaves the device to be
// reused. The cycles alternate, 100 of each (LOOPVOL_BENCH_RUNS).
//
//	go test -run '^$' -bench LoopDiscardLimit -benchtime 1x ./test/bench/
func BenchmarkLoopDiscardLimit(b *testing.B) {
	looptest.RequireRoot(b)
	runs := 100
	if v := os.Getenv("LOOPVOL_BENCH_RUNS"); v != "" {
		if _, err := fmt.Sscan(v, &runs); err != nil || runs < 1 {
			b.Fatalf("LOOPVOL_BENCH_RUNS=%q", v)
		}
	}
	dir := looptest.DirectIODir(b)
	image := filepath.Join(dir, "vol.img")
	f, err := os.Create(image)
	if err != nil {
		b.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, 64*mib); err != nil {
		b.Fatal(err)
	}
	f.Close()
	d := loop.New()
	for i := 0; i < b.N; i++ {
		attach := map[bool][]time.Duration{}
		detach := map[bool][]time.Duration{}
		for r := 0; r < 2*runs; r++ {
			thin := r%2 == 1
			start := time.Now()
			dev, err := d.Attach(context.Background(), image, false)
			if err != nil {
				b.Fatal(err)
			}
			if err := d.Tune(dev, thin); err != nil {
				b.Fatal(err)
			}
			attach[thin] = append(attach[thin], time.Since(start))
			start = time.Now()
			if err := d.Detach(dev); err != nil {
				b.Fatal(err)
			}
			detach[thin] = append(detach[thin], time.Since(start))
		}
		for _, row := range []struct {
			what string
			m    map[bool][]time.Duration
		}{{"attach+tune", attach}, {"detach", detach}} {
			thick, thin := summarize(row.m[false]), summarize(row.m[true])
			b.Logf("%-11s thin (discards pass): median %s p99 %s | thick (refused, device removed at detach): median %s p99 %s | thick/thin %.2f",
				row.what, ms(thin.median), ms(thin.p99), ms(thick.median), ms(thick.p99), float64(thick.median)/float64(thin.median))
		}
	}
}
