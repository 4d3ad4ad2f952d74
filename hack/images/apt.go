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
	Stanza   string // the control stanza, written to var/lib/dpkg/status.d
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

// parseStanza reads the fields of one apt-cache show stanza that
// downloading needs.
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
		Stanza:   stanza,
	}
	if p.Name == "" || p.Version == "" || p.Filename == "" || p.SHA256 == "" {
		return nil, fmt.Errorf("apt-cache show: incomplete stanza %q", firstLine(stanza))
	}
	return p, nil
}

// resolveCached is resolve, remembered for as long as apt's package lists
// stay the same (until apt-get update brings new ones): asking apt costs
// seconds.
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
	fmt.Fprintf(h, "resolve-v2 %s\n", strings.Join(roots, " "))
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

// resolve returns roots and everything they depend on, sorted by name: the
// packages apt-get install --no-install-recommends would install on a
// system that has none (apt's own choice, simulated against an empty dpkg
// status), at the versions it would install.
func (a *apt) resolve(roots []string) ([]*debPackage, error) {
	status, err := os.CreateTemp("", "loopvol-empty-dpkg-status-")
	if err != nil {
		return nil, err
	}
	status.Close()
	defer os.Remove(status.Name())
	args := []string{"--simulate", "-o", "Dir::State::status=" + status.Name(), "-o", "Debug::NoLocking=1",
		"install", "--no-install-recommends"}
	cmd := exec.Command("apt-get", append(args, roots...)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("apt-get install --simulate %s: %w: %s", strings.Join(roots, " "), err, out)
	}
	// "Inst name (version suite [arch])"
	var want []string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "Inst" && strings.HasPrefix(f[2], "(") {
			name, _, _ := strings.Cut(f[1], ":")
			want = append(want, name+"="+strings.TrimPrefix(f[2], "("))
		}
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("apt-get install --simulate %s installs nothing: %s", strings.Join(roots, " "), out)
	}
	cmd = exec.Command("apt-cache", append([]string{"show"}, want...)...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	shown, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache show: %w: %s", err, stderr.Bytes())
	}
	byName := map[string]*debPackage{}
	for _, stanza := range strings.Split(strings.TrimSpace(string(shown)), "\n\n") {
		p, err := parseStanza(stanza)
		if err != nil {
			return nil, err
		}
		if _, dup := byName[p.Name]; !dup {
			byName[p.Name] = p
		}
	}
	var pkgs []*debPackage
	for _, nv := range want {
		name, version, _ := strings.Cut(nv, "=")
		p := byName[name]
		if p == nil || p.Version != version {
			return nil, fmt.Errorf("apt-cache show %s: no such package", nv)
		}
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
	return pkgs, nil
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

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
