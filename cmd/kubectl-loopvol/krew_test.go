package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// krewPlugin is the part of krew's Plugin (v1alpha2) the test reads.
type krewPlugin struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Version          string `json:"version"`
		ShortDescription string `json:"shortDescription"`
		Platforms        []struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			URI    string `json:"uri"`
			Sha256 string `json:"sha256"`
			Bin    string `json:"bin"`
			Files  []struct {
				From string `json:"from"`
				To   string `json:"to"`
			} `json:"files"`
		} `json:"platforms"`
	} `json:"spec"`
}

func TestKrewManifest(t *testing.T) {
	b, err := os.ReadFile("../../deploy/krew/loopvol.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var p krewPlugin
	// Lenient: krew's fields that the test does not read are allowed.
	if err := yaml.Unmarshal(b, &p); err != nil {
		t.Fatal(err)
	}
	if p.APIVersion != "krew.googlecontainertools.github.com/v1alpha2" || p.Kind != "Plugin" || p.Metadata.Name != "loopvol" {
		t.Errorf("apiVersion %q, kind %q, name %q: want krew's v1alpha2 Plugin named loopvol", p.APIVersion, p.Kind, p.Metadata.Name)
	}
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(p.Spec.Version) || p.Spec.ShortDescription == "" {
		t.Errorf("version %q, shortDescription %q", p.Spec.Version, p.Spec.ShortDescription)
	}
	var arches []string
	for _, pl := range p.Spec.Platforms {
		sel := pl.Selector.MatchLabels
		if sel["os"] != "linux" {
			t.Errorf("platform %v: os is not linux", sel)
		}
		arches = append(arches, sel["arch"])
		if pl.Bin != "kubectl-loopvol" {
			t.Errorf("platform %v: bin %q, want kubectl-loopvol", sel, pl.Bin)
		}
		want := "https://github.com/loopvol/loopvol/releases/download/" + p.Spec.Version + "/kubectl-loopvol_linux_" + sel["arch"] + ".tar.gz"
		if pl.URI != want {
			t.Errorf("platform %v: uri %q, want %q", sel, pl.URI, want)
		}
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(pl.Sha256) {
			t.Errorf("platform %v: sha256 %q is not 64 hex digits", sel, pl.Sha256)
		}
		if !slices.ContainsFunc(pl.Files, func(f struct {
			From string `json:"from"`
			To   string `json:"to"`
		}) bool {
			return f.From == pl.Bin
		}) {
			t.Errorf("platform %v: the archive's files do not include the binary %s", sel, pl.Bin)
		}
	}
	slices.Sort(arches)
	if strings.Join(arches, ",") != "amd64,arm64" {
		t.Errorf("platforms for %v, want amd64 and arm64", arches)
	}
}
