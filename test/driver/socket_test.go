package driver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/loopvol/loopvol/test/internal/driverproc"
	"golang.org/x/sys/unix"
)

// TestSecondDriverOnTheSameSocket: a second driver started on the endpoint
// of a running one exits with an error and leaves the first one's socket
// alone; the first one still answers.
func TestSecondDriverOnTheSameSocket(t *testing.T) {
	driverproc.RequireRoot(t)
	dir := t.TempDir()
	pool := filepath.Join(dir, "pool")
	if err := os.MkdirAll(pool, 0o750); err != nil {
		t.Fatal(err)
	}
	first := driverproc.Start(t, dir, "--mode=controller", "--zone=z", "--pool=p="+pool)
	var before unix.Stat_t
	if err := unix.Lstat(first.Socket, &before); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, driverproc.Binary(t), "--endpoint="+first.Endpoint,
		"--mode=controller", "--zone=z", "--pool=p="+pool).CombinedOutput()
	if err == nil {
		t.Fatalf("the second driver exited 0: %s", out)
	}
	if !strings.Contains(string(out), "served by another process") {
		t.Errorf("the second driver's message does not say the socket is in use: %s", out)
	}

	var after unix.Stat_t
	if err := unix.Lstat(first.Socket, &after); err != nil || after.Ino != before.Ino {
		t.Fatalf("the first driver's socket was replaced or removed (inode %d → %d, %v)", before.Ino, after.Ino, err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer pcancel()
	if _, err := csi.NewIdentityClient(first.Conn).Probe(pctx, &csi.ProbeRequest{}); err != nil {
		t.Errorf("the first driver no longer answers: %v", err)
	}
}
