package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPoolCollector(t *testing.T) {
	c := PoolCollector{Usage: func() []PoolUsage {
		return []PoolUsage{{Pool: "a", Zone: "z1", SizeBytes: 1000, AvailableBytes: 400}}
	}}
	want := `
# HELP loopvol_pool_available_bytes Bytes new volumes may still get in the pool: free space minus space promised to sparse images minus the reserve.
# TYPE loopvol_pool_available_bytes gauge
loopvol_pool_available_bytes{pool="a",zone="z1"} 400
# HELP loopvol_pool_size_bytes Size of the filesystem that holds the pool.
# TYPE loopvol_pool_size_bytes gauge
loopvol_pool_size_bytes{pool="a",zone="z1"} 1000
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
