package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// scrape serves register's metrics as the binaries do and returns one
// scrape.
func scrape(t *testing.T, register func(*http.ServeMux)) string {
	t.Helper()
	mux := http.NewServeMux()
	register(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics = %d", rec.Code)
	}
	body, _ := io.ReadAll(rec.Body)
	return string(body)
}

func wantLines(t *testing.T, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("the scrape lacks %s", w)
		}
	}
}

// TestPlugin: the driver's calls are csi_plugin_operations_seconds by
// driver, method and code; a collector added to the registry is served
// beside them.
func TestPlugin(t *testing.T) {
	m := NewPlugin("loopvol.csi.io")
	m.RecordMetrics("/csi.v1.Controller/CreateVolume", nil, time.Second)
	m.RecordMetrics("/csi.v1.Node/NodeStageVolume", status.Error(codes.Aborted, "busy"), time.Millisecond)
	extra := prometheus.NewGauge(prometheus.GaugeOpts{Name: "loopvol_test_gauge", Help: "A gauge of the test."})
	m.GetRegistry().RawMustRegister(extra)
	body := scrape(t, func(mux *http.ServeMux) { m.RegisterToServer(mux, "/metrics") })
	wantLines(t, body,
		`csi_plugin_operations_seconds_count{driver_name="loopvol.csi.io",grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume"} 1`,
		`csi_plugin_operations_seconds_count{driver_name="loopvol.csi.io",grpc_status_code="Aborted",method_name="/csi.v1.Node/NodeStageVolume"} 1`,
		"loopvol_test_gauge 0",
	)
}

// TestSidecar: the sidecar's calls are csi_sidecar_operations_seconds, and
// the controllers' own registry is served with them.
func TestSidecar(t *testing.T) {
	m, own := NewSidecar()
	m.SetDriverName("loopvol.csi.io") // as pkg/csiclient does once connected
	m.RecordMetrics("/csi.v1.Controller/ControllerPublishVolume", status.Error(codes.NotFound, "no node"), time.Second)
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "loopvol_test_total", Help: "A counter of the test."})
	own.MustRegister(c)
	c.Inc()
	body := scrape(t, func(mux *http.ServeMux) { m.RegisterToServer(mux, "/metrics") })
	wantLines(t, body,
		`csi_sidecar_operations_seconds_count{driver_name="loopvol.csi.io",grpc_status_code="NotFound",method_name="/csi.v1.Controller/ControllerPublishVolume"} 1`,
		"loopvol_test_total 1",
	)
	if strings.Contains(body, "csi_plugin_operations_seconds") {
		t.Error("the sidecar serves the driver's histogram")
	}
}
