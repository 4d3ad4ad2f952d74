package e2e

import (
	"testing"
	"time"

	"github.com/loopvol/loopvol/internal/harness/testenv"
)

// TestRefusedLine: a forbidden line is left out only inside a warm-up window
// (or its log slack), and lines without a klog header are never left out.
func TestRefusedLine(t *testing.T) {
	at := func(s string) time.Time {
		tm, err := time.ParseInLocation("2006-01-02 15:04:05.000000", s, time.Local)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	year := time.Now().Format("2006")
	warm := []testenv.Window{{Start: at(year + "-12-05 12:27:05.000000"), End: at(year + "-12-05 12:27:09.000000")}}
	const (
		inside  = "E1205 12:27:09.806453    8686 event.go:365] \"Server rejected event\" err=\"events is forbidden\"\n"
		after   = "E1205 12:27:12.000001    8686 event.go:365] \"Server rejected event\" err=\"events is forbidden\"\n"
		before  = "E1205 12:27:04.999999    8686 event.go:365] \"Server rejected event\" err=\"events is forbidden\"\n"
		noStamp = "events is forbidden\n"
		fine    = "I1205 12:27:20.000000    8686 pv.go:42] \"Removed finalizer\"\n"
	)
	for _, c := range []struct {
		name, log, want string
		left            int
	}{
		{"inside the window and its slack", inside + fine, "", 1},
		{"after the slack", inside + after, after, 1},
		{"before the window", before, before, 0},
		{"no klog header", noStamp, noStamp, 0},
		{"nothing refused", fine, "", 0},
	} {
		if got, left := refusedLine(c.log, warm); got != c.want || left != c.left {
			t.Errorf("%s: refusedLine = %q, %d left out; want %q, %d", c.name, got, left, c.want, c.left)
		}
	}
	if got, _ := refusedLine(inside, nil); got != inside {
		t.Errorf("no warm-up: refusedLine = %q, want %q", got, inside)
	}
}
