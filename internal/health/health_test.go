package health

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestHandler(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		wantCode int
		wantBody string
	}{
		{name: "healthy", wantCode: http.StatusOK, wantBody: "ok"},
		{name: "driver away", err: errors.New("CSI driver at /csi.sock not ready for 3s: lost the connection"), wantCode: http.StatusServiceUnavailable, wantBody: "not ready for 3s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			Handler(func() error { return tc.err }, http.StatusServiceUnavailable).ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
			if rec.Code != tc.wantCode || !strings.Contains(rec.Body.String(), tc.wantBody) {
				t.Errorf("GET /healthz = %d %q, want %d with %q", rec.Code, rec.Body.String(), tc.wantCode, tc.wantBody)
			}
		})
	}
}

// TestOwnChecksStayOutOfHealthz: a check added with AddOwn answers at
// /healthz/<name> only; /healthz passes while it fails.
func TestOwnChecksStayOutOfHealthz(t *testing.T) {
	var h Checks
	h.Add("csi", func() error { return nil })
	h.AddOwn("webhook", func() error { return errors.New("waiting for the serving certificate") })
	mux := http.NewServeMux()
	h.Register(mux)
	for _, tc := range []struct {
		path     string
		wantCode int
		wantBody string
	}{
		{"/healthz", http.StatusOK, "ok"},
		{"/healthz/webhook", http.StatusServiceUnavailable, "waiting for the serving certificate"},
		{"/healthz/nothing", http.StatusNotFound, "not found"},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", tc.path, nil))
		if rec.Code != tc.wantCode || !strings.Contains(rec.Body.String(), tc.wantBody) {
			t.Errorf("GET %s = %d %q, want %d with %q", tc.path, rec.Code, rec.Body.String(), tc.wantCode, tc.wantBody)
		}
	}
}

// TestChecksNameTheFailing: /healthz fails while any check fails and names
// each failing one.
func TestChecksNameTheFailing(t *testing.T) {
	var h Checks
	if err := h.Check(); err != nil {
		t.Fatalf("no checks: %v", err)
	}
	h.Add("csi", func() error { return errors.New("driver away") })
	h.Add("pools", func() error { return nil })
	h.Add("registrar", func() error { return errors.New("not registered yet") })
	err := h.Check()
	if err == nil || err.Error() != "csi: driver away\nregistrar: not registered yet" {
		t.Errorf("Check = %q, want both failing checks named", err)
	}
}

// TestServe: Serve answers until ctx ends, then returns nil with the port
// closed; a listener that fails (closed under the server) ends Serve at
// once with its error, while ctx still runs.
func TestServe(t *testing.T) {
	handler := Handler(func() error { return nil }, http.StatusServiceUnavailable)
	t.Run("until ctx ends", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- Serve(ctx, ln, handler) }()
		resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "ok" {
			t.Errorf("GET = %d %q, want 200 ok", resp.StatusCode, body)
		}
		stop()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Serve after ctx ended = %v, want nil", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Serve did not return after ctx ended")
		}
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			c.Close()
			t.Error("the port still accepts connections after Serve returned")
		}
	})
	t.Run("the listener fails", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- Serve(t.Context(), ln, handler) }()
		ln.Close()
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("Serve = %v, want the listener's error", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Serve went on after its listener failed")
		}
	})
}
