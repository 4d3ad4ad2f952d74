package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// debPackage is one binary package as the machine's apt sources describe
// its candidate version (apt-cache show).
type debPackage struct {
	Name     string
	Version  string
	Arch     string
	Filename string // path in the archive's pool; its base is the cache file name
	SHA256   string
	Size     string
	Priority string
	Provides []string
	Depends  [][]string // groups of alternatives: Depends and Pre-Depends
	Stanza   string     // the control stanza, written to var/lib/dpkg/status.d
}

// fileName is the name of the package's .deb in the cache.
func (p *debPackage) fileName() string { return filepath.Base(p.Filename) }

// apt runs apt-cache and apt-get (the machine's sources, the machine's
// architecture) to find, resolve and download packages.
type apt struct {
	// cacheDir keeps downloaded .debs between runs.
	cacheDir string
	// resolvedDir keeps resolved package sets between runs, by the state
	// of apt's lists.
	resolvedDir string
	// log prints progress.
	log func(format string, args ...any)
}

// show returns the candidate versions of names. Names without one (virtual
// packages, names no source knows) are missing from the map.
func (a *apt) show(names []string) (map[string]*debPackage, error) {
	out := map[string]*debPackage{}
	if len(names) == 0 {
		return out, nil
	}
	cmd := exec.Command("apt-cache", append([]string{"show", "--no-all-versions"}, names...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	// apt-cache exits 100 when one name has no candidate but still prints
	// the others: judge by what it printed.
	if err != nil && len(stdout) == 0 && len(names) == 1 {
		return out, nil
	}
	if err != nil && len(stdout) == 0 {
		// Which one failed? Ask one by one.
		for _, n := range names {
			one, err := a.show([]string{n})
			if err != nil {
				return nil, err
			}
			for k, v := range one {
				out[k] = v
			}
		}
		return out, nil
	}
	for _, stanza := range strings.Split(strings.TrimSpace(string(stdout)), "\n\n") {
		p, err := parseStanza(stanza)
		if err != nil {
			return nil, err
		}
		if _, dup := out[p.Name]; !dup {
			out[p.Name] = p
		}
	}
	return out, nil
}

// providers lists the real packages that provide a virtual one.
func (a *apt) providers(name string) ([]string, error) {
	out, err := exec.Command("apt-cache", "showpkg", name).Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache showpkg %s: %w", name, err)
	}
	var names []string
	in := false
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.HasPrefix(line, "Reverse Provides:"):
			in = true
		case in && strings.TrimSpace(line) != "":
			names = append(names, strings.Fields(line)[0])
		}
	}
	sort.Strings(names)
	return uniq(names), nil
}

// parseStanza reads the fields of one apt-cache show stanza that resolving
// and downloading need.
func parseStanza(stanza string) (*debPackage, error) {
	fields := map[string]string{}
	var last string
	for _, line := range strings.Split(stanza, "\n") {
		if strings.HasPrefix(line, " ") && last != "" {
			fields[last] += "\n" + line
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		last = k
		fields[k] = strings.TrimSpace(v)
	}
	p := &debPackage{
		Name:     fields["Package"],
		Version:  fields["Version"],
		Arch:     fields["Architecture"],
		Filename: fields["Filename"],
		SHA256:   fields["SHA256"],
		Size:     fields["Size"],
		Priority: fields["Priority"],
		Stanza:   stanza,
	}
	if p.Name == "" || p.Version == "" || p.Filename == "" || p.SHA256 == "" {
		return nil, fmt.Errorf("apt-cache show: incomplete stanza %q", firstLine(stanza))
	}
	for _, f := range []string{"Pre-Depends", "Depends"} {
		p.Depends = append(p.Depends, parseDepends(fields[f])...)
	}
	for _, alt := range parseDepends(fields["Provides"]) {
		p.Provides = append(p.Provides, alt...)
	}
	return p, nil
}

// parseDepends splits a dependency field into groups of alternative package
// names, without versions and architecture qualifiers.
func parseDepends(field string) [][]string {
	var groups [][]string
	for _, group := range strings.Split(field, ",") {
		var alts []string
		for _, alt := range strings.Split(group, "|") {
			alt = strings.TrimSpace(alt)
			if i := strings.IndexAny(alt, " ("); i >= 0 {
				alt = alt[:i]
			}
			alt, _, _ = strings.Cut(alt, ":")
			if alt != "" {
				alts = append(alts, alt)
			}
		}
		if len(alts) > 0 {
			groups = append(groups, alts)
		}
	}
	return groups
}

// resolveCached is resolve, remembered for as long as apt's package lists
// stay the same (until apt-get update brings new ones): asking apt-cache
// costs about half a second a call.
func (a *apt) resolveCached(roots []string) ([]*debPackage, error) {
	key, err := a.listsKey(roots)
	if err != nil {
		return nil, err
	}
	file := filepath.Join(a.resolvedDir, key+".json")
	if b, err := os.ReadFile(file); err == nil {
		var pkgs []*debPackage
		if json.Unmarshal(b, &pkgs) == nil && len(pkgs) > 0 {
			return pkgs, nil
		}
	}
	pkgs, err := a.resolve(roots)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(pkgs)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(a.resolvedDir, 0o755); err != nil {
		return nil, err
	}
	return pkgs, writeFileAtomic(file, b)
}

// listsKey names the state of apt's package lists (the Release files,
// which hold the checksums of the package indexes) and the roots.
func (a *apt) listsKey(roots []string) (string, error) {
	out, err := exec.Command("apt-config", "shell", "LISTS", "Dir::State::lists/d").Output()
	if err != nil {
		return "", fmt.Errorf("apt-config: %w", err)
	}
	lists := strings.Trim(strings.TrimPrefix(strings.TrimSpace(string(out)), "LISTS="), "'")
	if lists == "" {
		return "", fmt.Errorf("apt-config: no Dir::State::lists")
	}
	h := sha256.New()
	fmt.Fprintf(h, "resolve-v1 %s\n", strings.Join(roots, " "))
	entries, err := os.ReadDir(lists)
	if err != nil {
		return "", err
	}
	n := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), "Release") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(lists, e.Name()))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d\n", e.Name(), len(b))
		h.Write(b)
		n++
	}
	if n == 0 {
		return "", fmt.Errorf("no package lists in %s: run apt-get update", lists)
	}
	return hex.EncodeToString(h.Sum(nil))[:32], nil
}

// writeFileAtomic writes a file through a temporary one, readable by all.
func writeFileAtomic(name string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(name), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), name)
}

// resolve returns roots and everything they depend on (Depends and
// Pre-Depends, never Recommends), sorted by name, the way apt-get install
// --no-install-recommends chooses on an empty system: the first alternative
// that can be installed, unless one already chosen satisfies the group; a
// virtual package through its only provider.
func (a *apt) resolve(roots []string) ([]*debPackage, error) {
	chosen := map[string]*debPackage{}
	provided := map[string]bool{}
	known := map[string]*debPackage{} // candidates looked up so far
	missing := map[string]bool{}      // names without a candidate
	lookup := func(names []string) error {
		var ask []string
		for _, n := range names {
			if known[n] == nil && !missing[n] {
				ask = append(ask, n)
			}
		}
		got, err := a.show(uniq(ask))
		if err != nil {
			return err
		}
		for _, n := range ask {
			if p := got[n]; p != nil {
				known[n] = p
			} else {
				missing[n] = true
			}
		}
		return nil
	}
	choose := func(p *debPackage) bool {
		if chosen[p.Name] != nil {
			return false
		}
		chosen[p.Name] = p
		provided[p.Name] = true
		for _, v := range p.Provides {
			provided[v] = true
		}
		return true
	}

	if err := lookup(roots); err != nil {
		return nil, err
	}
	var queue []*debPackage
	for _, r := range roots {
		p := known[r]
		if p == nil {
			return nil, fmt.Errorf("package %s: no candidate version in the apt sources (apt-get update?)", r)
		}
		if choose(p) {
			queue = append(queue, p)
		}
	}
	for len(queue) > 0 {
		level := queue
		queue = nil
		var names []string
		for _, p := range level {
			for _, g := range p.Depends {
				names = append(names, g...)
			}
		}
		if err := lookup(names); err != nil {
			return nil, err
		}
		for _, p := range level {
		groups:
			for _, g := range p.Depends {
				for _, alt := range g {
					if provided[alt] {
						continue groups
					}
				}
				for _, alt := range g {
					if dep := known[alt]; dep != nil {
						if choose(dep) {
							queue = append(queue, dep)
						}
						continue groups
					}
				}
				// Only virtual packages: take the provider apt would, the one
				// of the highest priority.
				for _, alt := range g {
					provs, err := a.providers(alt)
					if err != nil {
						return nil, err
					}
					if err := lookup(provs); err != nil {
						return nil, err
					}
					var best []*debPackage
					for _, n := range provs {
						c := known[n]
						switch {
						case c == nil:
						case len(best) == 0 || priorityRank(c.Priority) < priorityRank(best[0].Priority):
							best = []*debPackage{c}
						case priorityRank(c.Priority) == priorityRank(best[0].Priority):
							best = append(best, c)
						}
					}
					if len(best) > 1 {
						return nil, fmt.Errorf("%s depends on virtual package %s, which %s provide at the same priority: name one of them in the recipe", p.Name, alt, strings.Join(provs, ", "))
					}
					if len(best) == 1 {
						if choose(best[0]) {
							queue = append(queue, best[0])
						}
						continue groups
					}
				}
				return nil, fmt.Errorf("%s depends on %s: nothing in the apt sources provides it", p.Name, strings.Join(g, " | "))
			}
		}
	}
	var out []*debPackage
	for _, p := range chosen {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// fetch makes sure the cache holds each package's .deb with the checksum the
// apt sources give, downloading (apt-get download) only the ones it lacks,
// and returns the paths in the order of pkgs.
func (a *apt) fetch(pkgs []*debPackage) ([]string, error) {
	if err := os.MkdirAll(a.cacheDir, 0o755); err != nil {
		return nil, err
	}
	paths := make([]string, len(pkgs))
	var need []*debPackage
	for i, p := range pkgs {
		paths[i] = filepath.Join(a.cacheDir, p.fileName())
		ok, err := hasSHA256(paths[i], p.SHA256)
		if err != nil {
			return nil, err
		}
		if !ok {
			need = append(need, p)
		}
	}
	if len(need) == 0 {
		return paths, nil
	}
	tmp, err := os.MkdirTemp(a.cacheDir, ".download-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	args := []string{"download"}
	for _, p := range need {
		a.log("fetch %s %s", p.Name, p.Version)
		args = append(args, p.Name+"="+p.Version)
	}
	cmd := exec.Command("apt-get", args...)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apt-get download: %w: %s", err, out)
	}
	// apt-get download names files name_version_arch.deb with the epoch
	// escaped; find each by its package name.
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return nil, err
	}
	byName := map[string]string{}
	for _, e := range entries {
		if name, _, ok := strings.Cut(e.Name(), "_"); ok && strings.HasSuffix(e.Name(), ".deb") {
			byName[name] = filepath.Join(tmp, e.Name())
		}
	}
	for _, p := range need {
		src := byName[p.Name]
		if src == "" {
			return nil, fmt.Errorf("apt-get download did not download %s", p.Name)
		}
		ok, err := hasSHA256(src, p.SHA256)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%s: SHA256 differs from the apt sources' %s", src, p.SHA256)
		}
		if err := os.Rename(src, filepath.Join(a.cacheDir, p.fileName())); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

// hasSHA256 tells whether path exists with the given checksum.
func hasSHA256(path, want string) (bool, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, bufio.NewReader(f)); err != nil {
		return false, err
	}
	return hex.EncodeToString(h.Sum(nil)) == want, nil
}

// priorityRank orders Debian priorities, most important first.
func priorityRank(p string) int {
	for i, v := range []string{"required", "important", "standard", "optional", "extra"} {
		if p == v {
			return i
		}
	}
	return 5
}

func uniq(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
