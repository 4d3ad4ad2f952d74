package pool

import (
	"errors"
	"strings"
	"testing"
)

func TestParseVolumeID(t *testing.T) {
	good := DeriveVolumeID("pool-a", "pvc-1")
	tests := []struct {
		name  string
		in    string
		valid bool
	}{
		{name: "derived ID parses", in: good.String(), valid: true},
		{name: "empty", in: ""},
		{name: "no pool", in: "." + good.Hash},
		{name: "no hash", in: "pool-a."},
		{name: "short hash", in: "pool-a.abc"},
		{name: "upper-case hash", in: "pool-a." + strings.ToUpper(good.Hash)},
		{name: "dot dot", in: "../" + good.Hash},
		{name: "slash in pool", in: "a/b." + good.Hash},
		{name: "slash in hash", in: "pool-a." + good.Hash[:31] + "/"},
		{name: "NUL byte", in: "pool-a\x00." + good.Hash},
		{name: "10000 characters", in: strings.Repeat("a", 10000)},
		{name: "pool not a DNS label", in: "Pool_A." + good.Hash},
		{name: "two dots", in: "pool.a." + good.Hash},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id, err := ParseVolumeID(tc.in)
			if tc.valid {
				if err != nil {
					t.Fatalf("ParseVolumeID(%q) = %v", tc.in, err)
				}
				if id.String() != tc.in {
					t.Fatalf("round trip: got %q", id.String())
				}
				return
			}
			if !errors.Is(err, ErrInvalidID) {
				t.Fatalf("ParseVolumeID(%q) error = %v, want ErrInvalidID", tc.in, err)
			}
		})
	}
}

func TestDeriveVolumeIDIsStable(t *testing.T) {
	a, b := DeriveVolumeID("p", "name"), DeriveVolumeID("p", "name")
	if a != b {
		t.Fatalf("same name gave %v and %v", a, b)
	}
	if DeriveVolumeID("p", "other") == a {
		t.Fatal("different names gave the same ID")
	}
}

func TestValidateNodeID(t *testing.T) {
	for _, ok := range []string{"node-1", "worker.example.com", "a", "N_1"} {
		if err := ValidateNodeID(ok); err != nil {
			t.Errorf("ValidateNodeID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "..", "a/b", "-a", "a\x00", strings.Repeat("n", 200), ".hidden"} {
		if err := ValidateNodeID(bad); !errors.Is(err, ErrInvalidID) {
			t.Errorf("ValidateNodeID(%q) = %v, want ErrInvalidID", bad, err)
		}
	}
}

// FuzzParseVolumeID checks that whatever parses is a safe file name and
// round-trips; the seeds run with the normal tests.
func FuzzParseVolumeID(f *testing.F) {
	for _, s := range []string{DeriveVolumeID("p", "x").String(), "", "../etc/passwd", "a." + strings.Repeat("0", 32), "a\x00.b", "p.0123456789abcdef0123456789abcdef/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseVolumeID(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidID) {
				t.Fatalf("error %v does not wrap ErrInvalidID", err)
			}
			return
		}
		if id.String() != s {
			t.Fatalf("round trip %q → %q", s, id.String())
		}
		if strings.ContainsAny(s, "/\x00") || strings.Contains(s, "..") {
			t.Fatalf("unsafe ID %q accepted", s)
		}
	})
}
