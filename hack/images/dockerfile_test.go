package main

import (
	"encoding/json"
	"os"
	"path"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// dockerStage is what a Dockerfile stage says, in the terms of a recipe.
type dockerStage struct {
	name       string
	from       string
	packages   []string
	trees      []string          // COPY <dir>/ / of the build context
	fromBuild  map[string]string // COPY --from=build <src> <dst>: dst → src
	user       string
	entrypoint []string
	labels     []string
	links      []string // RUN test -L <path>: the base image has that link
	runs       []string
	other      []string // instructions the Go recipe knows nothing of
}

// parseDockerfile reads the stages of a Dockerfile: instructions joined
// over continuation lines, ARG defaults substituted in FROM.
func parseDockerfile(t *testing.T, file string) map[string]*dockerStage {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	cur := ""
	for _, l := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(l)
		if cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur += strings.TrimSuffix(trimmed, "\\") + " "
			continue
		}
		lines = append(lines, cur+trimmed)
		cur = ""
	}
	args := map[string]string{}
	stages := map[string]*dockerStage{}
	var st *dockerStage
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "ARG":
			k, v, _ := strings.Cut(rest, "=")
			if st == nil {
				args[k] = v
			}
		case "FROM":
			f := strings.Fields(rest)
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				f = f[1:]
			}
			if len(f) != 3 || !strings.EqualFold(f[1], "AS") {
				t.Fatalf("FROM without a stage name: %q", l)
			}
			from := regexp.MustCompile(`\$\{?(\w+)\}?`).ReplaceAllStringFunc(f[0], func(v string) string {
				return args[strings.Trim(v, "${}")]
			})
			st = &dockerStage{name: f[2], from: from, fromBuild: map[string]string{}}
			stages[st.name] = st
		case "RUN":
			st.runs = append(st.runs, rest)
			for _, cmd := range strings.Split(rest, "&&") {
				f := strings.Fields(cmd)
				switch {
				case len(f) >= 2 && f[0] == "apt-get" && f[1] == "install":
					for _, a := range f[2:] {
						if !strings.HasPrefix(a, "-") {
							st.packages = append(st.packages, a)
						}
					}
				case len(f) == 3 && f[0] == "test" && f[1] == "-L":
					st.links = append(st.links, f[2])
				case strings.Join(f, " ") == "apt-get update", strings.Join(f, " ") == "rm -rf /var/lib/apt/lists/*":
				default:
					st.other = append(st.other, "RUN "+strings.TrimSpace(cmd))
				}
			}
		case "COPY":
			f := strings.Fields(rest)
			from := ""
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				if v, ok := strings.CutPrefix(f[0], "--from="); ok {
					from = v
				}
				f = f[1:]
			}
			if len(f) < 2 {
				t.Fatalf("COPY without a destination: %q", l)
			}
			dst := f[len(f)-1]
			for _, src := range f[:len(f)-1] {
				switch {
				case from == "build":
					d := dst
					if strings.HasSuffix(dst, "/") {
						d = path.Join(dst, path.Base(src))
					}
					st.fromBuild[d] = src
				case from == "" && dst == "/":
					st.trees = append(st.trees, src)
				default:
					st.other = append(st.other, l)
				}
			}
		case "USER":
			st.user = rest
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(rest), &st.entrypoint); err != nil {
				t.Fatalf("ENTRYPOINT is not a JSON list: %q", l)
			}
		case "LABEL":
			for _, kv := range strings.Fields(rest) {
				k, _, _ := strings.Cut(kv, "=")
				st.labels = append(st.labels, k)
			}
		case "WORKDIR", "ENV":
			st.other = append(st.other, l)
		default:
			st.other = append(st.other, l)
		}
	}
	return stages
}

// TestDockerfileMatchesRecipes holds both recipes to each other: the
// Dockerfile's image stages install the same packages, copy the same files
// to the same places, and set the same user and entrypoint as recipe.go.
func TestDockerfileMatchesRecipes(t *testing.T) {
	stages := parseDockerfile(t, "../../Dockerfile")
	build := stages["build"]
	if build == nil {
		t.Fatal("Dockerfile has no build stage")
	}
	buildRuns := strings.Join(build.runs, " ")
	for _, r := range recipes {
		t.Run(r.name, func(t *testing.T) {
			st := stages[r.name]
			if st == nil {
				t.Fatalf("Dockerfile has no stage %s", r.name)
			}
			if st.from != r.from {
				t.Errorf("FROM %s, recipe from %s", st.from, r.from)
			}
			if got, want := sorted(st.packages), sorted(r.packages); !reflect.DeepEqual(got, want) {
				t.Errorf("apt-get install %v, recipe packages %v", got, want)
			}
			var wantTrees []string
			if r.tree != "" {
				wantTrees = []string{"hack/images/rootfs/" + r.tree + "/"}
			}
			if !reflect.DeepEqual(st.trees, wantTrees) {
				t.Errorf("COPY <dir>/ / of %v, recipe tree %v", st.trees, wantTrees)
			}
			want := map[string]string{}
			for _, p := range r.binaries {
				want[p.dst] = "/out/" + p.src
				// The build stage builds it statically, with the version.
				re := regexp.MustCompile(`CGO_ENABLED=0 [^&]*go build -trimpath -ldflags "-X main.version=\$\{VERSION\}" -o /out/` + p.src + ` ./cmd/` + p.src + `\b`)
				if !re.MatchString(buildRuns) {
					t.Errorf("the build stage does not build /out/%s statically from ./cmd/%s with -X main.version", p.src, p.src)
				}
			}
			if !reflect.DeepEqual(st.fromBuild, want) {
				t.Errorf("COPY --from=build %v, recipe binaries %v", st.fromBuild, want)
			}
			// The links the Go recipe adds for the base image are there
			// in the base image.
			if got, want := sorted(st.links), sortedKeys(r.base.symlinks); !reflect.DeepEqual(got, want) && len(got)+len(want) > 0 {
				t.Errorf("RUN test -L %v, recipe base links %v", got, want)
			}
			if st.user != r.user {
				t.Errorf("USER %q, recipe user %q", st.user, r.user)
			}
			if !reflect.DeepEqual(st.entrypoint, r.entrypoint) {
				t.Errorf("ENTRYPOINT %q, recipe entrypoint %q", st.entrypoint, r.entrypoint)
			}
			if want := []string{"org.opencontainers.image.version"}; !reflect.DeepEqual(st.labels, want) {
				t.Errorf("LABEL %v, the Go recipe sets %v", st.labels, want)
			}
			if len(st.other) > 0 {
				t.Errorf("instructions the Go recipe does not follow: %q", st.other)
			}
		})
	}
}

// TestMakefileBuildsTheBinaries checks that make static builds every binary
// a recipe places, the way the Dockerfile's build stage does.
func TestMakefileBuildsTheBinaries(t *testing.T) {
	b, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recipes {
		for _, p := range r.binaries {
			want := `CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(STATIC)/` + p.src + ` ./cmd/` + p.src
			if !strings.Contains(string(b), want) {
				t.Errorf("Makefile lacks %q", want)
			}
		}
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}
