package csiclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/go-cmp/cmp"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
)

const testDriver = "loopvol.csi.io"

var allControllerCaps = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
	csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
}

// connect starts nothing; it connects to path with a short call timeout and
// closes the client at the end of the test.
func connect(ctx context.Context, t *testing.T, path string, mods ...func(*Config)) *Client {
	t.Helper()
	cfg := Config{Address: path, Timeout: 5 * time.Second}
	for _, m := range mods {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// eventually waits (bounded) until cond holds; the connection state has no
// event a test could wait on.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// A bound, not a figure: gRPC's reconnect backoff (1 s growing by 1.6)
	// under -race on two loaded cores once needed more than 20 s.
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestConnectCapabilities(t *testing.T) {
	tests := []struct {
		name   string
		driver *fakeDriver
		want   Capabilities
	}{
		{
			name:   "no controller service → no controller capabilities",
			driver: &fakeDriver{name: testDriver, caps: allControllerCaps},
			want:   Capabilities{},
		},
		{
			name: "publish only",
			driver: &fakeDriver{name: testDriver, controller: true, caps: []csi.ControllerServiceCapability_RPC_Type{
				csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
				csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
			}},
			want: Capabilities{ControllerService: true, PublishUnpublish: true},
		},
		{
			name:   "every capability",
			driver: &fakeDriver{name: testDriver, controller: true, caps: allControllerCaps},
			want: Capabilities{
				ControllerService:         true,
				PublishUnpublish:          true,
				PublishReadOnly:           true,
				ListVolumes:               true,
				ListVolumesPublishedNodes: true,
				SingleNodeMultiWriter:     true,
				ModifyVolume:              true,
			},
		},
		{
			name: "list volumes without published nodes cannot reconcile",
			driver: &fakeDriver{name: testDriver, controller: true, caps: []csi.ControllerServiceCapability_RPC_Type{
				csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
			}},
			want: Capabilities{ControllerService: true, ListVolumes: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			path := socketPath(t)
			serve(t, path, tc.driver)
			c := connect(ctx, t, path)
			if diff := cmp.Diff(tc.want, c.Capabilities()); diff != "" {
				t.Errorf("Capabilities (-want +got):\n%s", diff)
			}
			if got := c.Capabilities().CanListPublished(); got != (tc.want.ListVolumes && tc.want.ListVolumesPublishedNodes) {
				t.Errorf("CanListPublished = %v", got)
			}
			if c.DriverName() != testDriver {
				t.Errorf("DriverName = %q, want %q", c.DriverName(), testDriver)
			}
			if err := c.Healthy(); err != nil {
				t.Errorf("Healthy: %v", err)
			}
		})
	}
}

func TestConnectWaitsForSocketAndReadiness(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	path := socketPath(t)
	d := &fakeDriver{name: testDriver, controller: true, caps: allControllerCaps, notReady: 1}

	type result struct {
		c   *Client
		err error
	}
	got := make(chan result, 1)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		c, err := Connect(cctx, Config{Address: path, Timeout: time.Second})
		got <- result{c, err}
	}()
	// The socket appears only after Connect started waiting for it.
	serve(t, path, d)
	r := <-got
	if r.err != nil {
		t.Fatalf("Connect: %v", r.err)
	}
	defer func() { _ = r.c.Close() }()
	if !r.c.Capabilities().PublishUnpublish {
		t.Errorf("Capabilities = %+v, want PublishUnpublish", r.c.Capabilities())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.notReady != 0 {
		t.Errorf("Connect returned before the driver reported ready")
	}
}

func TestConnectEndsWithContext(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err := Connect(ctx, Config{Address: socketPath(t), Timeout: time.Second})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect without a socket = %v, want context.DeadlineExceeded", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{name: "valid", cfg: Config{Address: "/run/csi/socket", Timeout: time.Second}},
		{name: "no address", cfg: Config{Timeout: time.Second}, want: "address is empty"},
		{name: "no timeout", cfg: Config{Address: "/s"}, want: "timeout must be positive"},
		{name: "negative probe timeout", cfg: Config{Address: "/s", Timeout: time.Second, ProbeTimeout: -1}, want: "probe timeout"},
		{name: "page size too big", cfg: Config{Address: "/s", Timeout: time.Second, MaxEntries: 1 << 31}, want: "page size"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestControllerPublish(t *testing.T) {
	tests := []struct {
		name      string
		publish   func(context.Context, *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error)
		timeout   time.Duration
		wantCtx   map[string]string
		wantCode  codes.Code
		wantFinal bool
	}{
		{
			name: "success returns the publish context",
			publish: func(context.Context, *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
				return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"devicePath": "/dev/loop7"}}, nil
			},
			wantCtx:  map[string]string{"devicePath": "/dev/loop7"},
			wantCode: codes.OK,
		},
		{
			name: "resource exhausted is not final",
			publish: func(context.Context, *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
				return nil, status.Error(codes.ResourceExhausted, "node full")
			},
			wantCode: codes.ResourceExhausted,
		},
		{
			name: "failed precondition is final",
			publish: func(context.Context, *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
				return nil, status.Error(codes.FailedPrecondition, "attached elsewhere")
			},
			wantCode:  codes.FailedPrecondition,
			wantFinal: true,
		},
		{
			name: "a slow driver hits the timeout: deadline exceeded, not final",
			publish: func(ctx context.Context, _ *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
				<-ctx.Done()
				return nil, status.FromContextError(ctx.Err()).Err()
			},
			timeout:  100 * time.Millisecond,
			wantCode: codes.DeadlineExceeded,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			path := socketPath(t)
			d := &fakeDriver{name: testDriver, controller: true, caps: allControllerCaps, publish: tc.publish}
			serve(t, path, d)
			c := connect(ctx, t, path, func(cfg *Config) {
				if tc.timeout > 0 {
					cfg.Timeout = tc.timeout
				}
			})
			req := &csi.ControllerPublishVolumeRequest{
				VolumeId: "pool.0123", NodeId: "node-1", Readonly: true,
				Secrets: map[string]string{"password": "s3cret"},
			}
			pc, err := c.ControllerPublish(ctx, req)
			if code := status.Code(err); code != tc.wantCode {
				t.Fatalf("ControllerPublish error = %v, want code %s", err, tc.wantCode)
			}
			if got, _ := Code(err); got != tc.wantCode {
				t.Errorf("Code = %s, want %s", got, tc.wantCode)
			}
			if got := IsFinal(err); got != tc.wantFinal {
				t.Errorf("IsFinal = %v, want %v", got, tc.wantFinal)
			}
			if diff := cmp.Diff(tc.wantCtx, pc); diff != "" {
				t.Errorf("publish context (-want +got):\n%s", diff)
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			if len(d.publishReqs) != 1 || d.publishReqs[0].Secrets["password"] != "s3cret" || !d.publishReqs[0].Readonly {
				t.Errorf("driver got %v, want the request with its secrets", d.publishReqs)
			}
		})
	}
}

func TestListVolumes(t *testing.T) {
	vols := []*csi.ListVolumesResponse_Entry{
		volume("v1", "n1"),
		volume("v2"),
		{Volume: &csi.Volume{VolumeId: "v3"}}, // no status: left out
		volume("v4", "n1", "n2"),
		volume("v5", "n3"),
	}
	want := map[string][]string{"v1": {"n1"}, "v2": nil, "v4": {"n1", "n2"}, "v5": {"n3"}}
	tests := []struct {
		name       string
		maxEntries int
		badToken   bool
		want       map[string][]string
		wantErr    string
	}{
		{name: "one page", want: want},
		{name: "pages of two", maxEntries: 2, want: want},
		{name: "pages of one", maxEntries: 1, want: want},
		{name: "a token seen twice ends the pass", badToken: true, wantErr: "page token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			path := socketPath(t)
			serve(t, path, &fakeDriver{name: testDriver, controller: true, caps: allControllerCaps, volumes: vols, badToken: tc.badToken})
			c := connect(ctx, t, path, func(cfg *Config) { cfg.MaxEntries = tc.maxEntries })
			got, err := c.ListVolumes(ctx)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ListVolumes = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ListVolumes: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ListVolumes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReconnectReprobesCapabilities(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	path := socketPath(t)
	stop := serve(t, path, &fakeDriver{name: testDriver, controller: true, caps: []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	}})
	c := connect(ctx, t, path)

	stop() // the driver goes away; the process must not exit
	eventually(t, "the client reports the lost connection", func() bool { return c.Healthy() != nil })
	if err := c.Healthy(); !strings.Contains(err.Error(), "not ready") {
		t.Errorf("Healthy = %v", err)
	}
	_, err := c.ControllerPublish(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "v", NodeId: "n"})
	if code := status.Code(err); code != codes.Unavailable || IsFinal(err) {
		t.Errorf("ControllerPublish while disconnected = %v, want a transient Unavailable", err)
	}

	// It comes back with one more capability.
	serve(t, path, &fakeDriver{name: testDriver, controller: true, caps: allControllerCaps})
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatalf("WaitReady: %v", err)
	}
	if !c.Capabilities().CanListPublished() {
		t.Errorf("Capabilities after reconnect = %+v, want the new ones", c.Capabilities())
	}
	if _, err := c.ControllerPublish(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "v", NodeId: "n"}); err != nil {
		t.Errorf("ControllerPublish after reconnect: %v", err)
	}
}

func TestReconnectToAnotherDriverStaysUnhealthy(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	path := socketPath(t)
	stop := serve(t, path, &fakeDriver{name: testDriver, controller: true})
	c := connect(ctx, t, path)
	stop()
	serve(t, path, &fakeDriver{name: "other.csi.io", controller: true})
	eventually(t, "the client names the other driver", func() bool {
		err := c.Healthy()
		return err != nil && strings.Contains(err.Error(), `"other.csi.io"`)
	})
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := c.WaitReady(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitReady = %v, want it to wait", err)
	}
}

func TestMetricsByMethodAndCode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	path := socketPath(t)
	serve(t, path, &fakeDriver{name: testDriver, controller: true, caps: allControllerCaps,
		publish: func(context.Context, *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
			return nil, status.Error(codes.NotFound, "no such node")
		}})
	mm := metrics.NewCSIMetricsManagerWithOptions("", metrics.WithProcessStartTime(false))
	c := connect(ctx, t, path, func(cfg *Config) { cfg.Metrics = mm })
	_, _ = c.ControllerPublish(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "v", NodeId: "n"})

	mfs, err := mm.GetRegistry().Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var found []string
	for _, mf := range mfs {
		if mf.GetName() != "csi_sidecar_operations_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			found = append(found, fmt.Sprintf("%s %s %s %d", l["driver_name"], l["method_name"], l["grpc_status_code"], m.GetHistogram().GetSampleCount()))
		}
	}
	want := testDriver + " /csi.v1.Controller/ControllerPublishVolume NotFound 1"
	ok := false
	for _, f := range found {
		ok = ok || f == want
	}
	if !ok {
		t.Errorf("csi_sidecar_operations_seconds series = %q, want one %q", found, want)
	}
}

func TestIsFinal(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{err: nil, want: false},
		{err: errors.New("PersistentVolume not found"), want: false},
		{err: status.Error(codes.Canceled, ""), want: false},
		{err: status.Error(codes.DeadlineExceeded, ""), want: false},
		{err: status.Error(codes.Unavailable, ""), want: false},
		{err: status.Error(codes.ResourceExhausted, ""), want: false},
		{err: status.Error(codes.Aborted, ""), want: false},
		{err: status.Error(codes.InvalidArgument, ""), want: true},
		{err: status.Error(codes.NotFound, ""), want: true},
		{err: status.Error(codes.FailedPrecondition, ""), want: true},
		{err: status.Error(codes.Internal, ""), want: true},
		{err: fmt.Errorf("wrapped: %w", status.Error(codes.FailedPrecondition, "")), want: true},
		{err: fmt.Errorf("wrapped: %w", status.Error(codes.Aborted, "")), want: false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.err), func(t *testing.T) {
			if got := IsFinal(tc.err); got != tc.want {
				t.Errorf("IsFinal(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestOnReconnected: the callbacks run when the driver is ready again after
// it was not, not at the first connection, and not after removal.
func TestOnReconnected(t *testing.T) {
	c := &Client{ready: make(chan struct{})}
	calls := 0
	remove := c.OnReconnected(func() { calls++ })
	c.setReady(Capabilities{})
	c.setReady(Capabilities{}) // still ready: no transition
	if calls != 0 {
		t.Fatalf("%d calls at the first connection, want 0", calls)
	}
	c.setNotReady(errConnectionLost)
	c.setReady(Capabilities{})
	if calls != 1 {
		t.Fatalf("%d calls after a reconnect, want 1", calls)
	}
	remove()
	c.setNotReady(errConnectionLost)
	c.setReady(Capabilities{})
	if calls != 1 {
		t.Errorf("%d calls after remove, want still 1", calls)
	}
}
