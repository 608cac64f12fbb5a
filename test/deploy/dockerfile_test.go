package deploy

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testutil"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
	stage     int // index of the FROM it belongs to
}

func parseDockerfile(t testing.TB, text string) []instruction {
	t.Helper()
	var out []instruction
	stage := -1
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		cmd = strings.ToUpper(cmd)
		if cmd == "FROM" {
			stage++
		}
		out = append(out, instruction{cmd: cmd, args: strings.TrimSpace(args), stage: stage})
	}
	for _, l := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if c, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(c + " ")
			continue
		}
		cur.WriteString(l)
		flush()
	}
	flush()
	return out
}

// shellWords splits a command line like sh would for the simple forms used
// here: whitespace, "double" and 'single' quotes, ${VAR} from vars.
func shellWords(t testing.TB, s string, vars map[string]string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == 0 && (c == ' ' || c == '\t' || c == '\n'):
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
		case quote == 0 && (c == '"' || c == '\''):
			quote, in = c, true
		case quote != 0 && c == quote:
			quote = 0
		case c == '$' && quote != '\'' && i+1 < len(s) && s[i+1] == '{':
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				t.Fatalf("unterminated ${ in %q", s)
			}
			name := s[i+2 : i+end]
			v, ok := vars[name]
			if !ok {
				v = "${" + name + "}"
			}
			w.WriteString(v)
			in = true
			i += end
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if quote != 0 {
		t.Fatalf("unterminated quote in %q", s)
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// goBuild splits a "[ENV=v ...] go build [flags] [packages]" command.
type goBuild struct {
	env     map[string]string
	flags   map[string]string // -trimpath -> "", -ldflags -> value, -o -> path
	targets []string
}

func parseGoBuild(t testing.TB, words []string) goBuild {
	t.Helper()
	g := goBuild{env: map[string]string{}, flags: map[string]string{}}
	i := 0
	for ; i < len(words) && strings.Contains(words[i], "=") && !strings.HasPrefix(words[i], "-"); i++ {
		k, v, _ := strings.Cut(words[i], "=")
		g.env[k] = v
	}
	if i+1 >= len(words) || filepath.Base(words[i]) != "go" || words[i+1] != "build" {
		t.Fatalf("not a go build command: %q", words)
	}
	for i += 2; i < len(words); i++ {
		w := words[i]
		switch {
		case w == "-trimpath" || w == "-race" || w == "-a":
			g.flags[w] = ""
		case strings.HasPrefix(w, "-") && strings.Contains(w, "="):
			k, v, _ := strings.Cut(w, "=")
			g.flags[k] = v
		case strings.HasPrefix(w, "-") && i+1 < len(words):
			g.flags[w] = words[i+1]
			i++
		default:
			g.targets = append(g.targets, w)
		}
	}
	return g
}

// TestDockerfileBuildsWithTheMakefilesFlags: the image's binary is built
// exactly like `make build` builds bin/relayd (CGO off, -trimpath, the same
// -ldflags with the same version variables, the same package), so the tests
// that run bin/relayd run what is shipped. Only the output path and the
// cross-compilation target may differ.
func TestDockerfileBuildsWithTheMakefilesFlags(t *testing.T) {
	root := testutil.RepoRootT(t)
	vars := map[string]string{"VERSION": "v9.9.9-test", "COMMIT": "abc1234", "BUILDDATE": "2000-01-01T00:00:00Z"}

	cmd := exec.Command("make", "-s", "-n", "-C", root, "build", "GO=go",
		"VERSION="+vars["VERSION"], "COMMIT="+vars["COMMIT"], "BUILDDATE="+vars["BUILDDATE"])
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n build: %v", err)
	}
	// The lines of `make build` that build relayd: bin/relayd, the
	// shipped binary, without build tags, and bin/relayd-test, the same
	// with -tags testbuild only.
	var makeLine, testLine string
	for _, l := range strings.Split(string(out), "\n") {
		switch {
		case !strings.Contains(l, " build ") || !strings.Contains(l, "./cmd/relayd"):
		case strings.Contains(l, "/relayd-test "):
			testLine = l
		default:
			if makeLine != "" {
				t.Fatalf("make -n build builds ./cmd/relayd twice besides bin/relayd-test:\n%s", out)
			}
			makeLine = l
		}
	}
	if makeLine == "" || testLine == "" {
		t.Fatalf("make -n build printed no go build of ./cmd/relayd into bin/relayd and bin/relayd-test:\n%s", out)
	}
	mk := parseGoBuild(t, shellWords(t, makeLine, nil))
	if strings.Contains(makeLine, "-tags") {
		t.Errorf("make build builds bin/relayd with build tags: %q", makeLine)
	}
	if want := strings.Replace(strings.Replace(makeLine, " -o ", " -tags testbuild -o ", 1), "/relayd ", "/relayd-test ", 1); testLine != want {
		t.Errorf("make build builds bin/relayd-test as\n%q\nwant bin/relayd's build with -tags testbuild:\n%q", testLine, want)
	}

	ins := parseDockerfile(t, repoFile(t, "Dockerfile"))
	var runs []instruction
	for _, in := range ins {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			runs = append(runs, in)
		}
	}
	if len(runs) != 1 {
		t.Fatalf("want one RUN with go build in the Dockerfile, found %d", len(runs))
	}
	words := shellWords(t, runs[0].args, vars)
	for len(words) > 0 && strings.HasPrefix(words[0], "--") { // RUN --mount=...
		words = words[1:]
	}
	dk := parseGoBuild(t, words)

	t.Logf("make:       %s", makeLine)
	t.Logf("Dockerfile: %s", strings.Join(words, " "))
	if mk.env["CGO_ENABLED"] != "0" || dk.env["CGO_ENABLED"] != "0" {
		t.Errorf("CGO_ENABLED: make %q, Dockerfile %q; both must be 0 (static binary on distroless/static)", mk.env["CGO_ENABLED"], dk.env["CGO_ENABLED"])
	}
	for k := range dk.env {
		if k != "CGO_ENABLED" && k != "GOOS" && k != "GOARCH" {
			t.Errorf("the Dockerfile's go build sets %s, the Makefile does not", k)
		}
	}
	delete(mk.flags, "-o")
	delete(dk.flags, "-o")
	if len(mk.flags) != len(dk.flags) {
		t.Errorf("go build flags differ: make %q, Dockerfile %q", mk.flags, dk.flags)
	}
	for k, v := range mk.flags {
		if dv, ok := dk.flags[k]; !ok || dv != v {
			t.Errorf("go build %s: make %q, Dockerfile %q", k, v, dv)
		}
	}
	if _, ok := mk.flags["-trimpath"]; !ok {
		t.Error("make build does not use -trimpath")
	}
	if !slices.Equal(mk.targets, dk.targets) || !slices.Equal(mk.targets, []string{"./cmd/relayd"}) {
		t.Errorf("build targets: make %q, Dockerfile %q, want [./cmd/relayd]", mk.targets, dk.targets)
	}

	// Every -X names a variable that exists, with a value the build args set.
	vfile := filepath.Join(root, "internal", "version", "version.go")
	f, err := parser.ParseFile(token.NewFileSet(), vfile, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string]bool{}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.VAR {
			for _, s := range g.Specs {
				for _, n := range s.(*ast.ValueSpec).Names {
					declared[n.Name] = true
				}
			}
		}
	}
	ld := strings.Fields(mk.flags["-ldflags"])
	stamped := map[string]string{}
	for i, w := range ld {
		if w == "-X" && i+1 < len(ld) {
			sym, val, _ := strings.Cut(ld[i+1], "=")
			pkg, name := sym[:strings.LastIndex(sym, ".")], sym[strings.LastIndex(sym, ".")+1:]
			if pkg != "github.com/relayd/relayd/internal/version" || !declared[name] {
				t.Errorf("-X %s: no such variable in internal/version", sym)
			}
			stamped[name] = val
		}
	}
	for name, want := range map[string]string{"Version": vars["VERSION"], "Commit": vars["COMMIT"], "BuildDate": vars["BUILDDATE"]} {
		if stamped[name] != want {
			t.Errorf("version.%s stamped as %q, want the build arg's %q", name, stamped[name], want)
		}
	}
}

// TestDockerfileRuntimeMatchesTheDeployment: distroless static, non-root
// (the uid the Deployment runs as), ENTRYPOINT the copied binary, and a CMD
// the Deployment's args repeat, so the config path the image expects is
// the one the Deployment mounts.
func TestDockerfileRuntimeMatchesTheDeployment(t *testing.T) {
	ins := parseDockerfile(t, repoFile(t, "Dockerfile"))
	last := ins[len(ins)-1].stage
	var from, user, entry, cmdJSON, copyDest string
	labels, exposed := "", []string{}
	for _, in := range ins {
		if in.stage != last {
			continue
		}
		switch in.cmd {
		case "FROM":
			from = in.args
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = in.args
		case "CMD":
			cmdJSON = in.args
		case "COPY":
			if f := strings.Fields(in.args); strings.HasPrefix(f[0], "--from=") {
				copyDest = f[len(f)-1]
			}
		case "LABEL":
			labels += " " + in.args
		case "EXPOSE":
			exposed = append(exposed, strings.Fields(in.args)...)
		}
	}
	if from != "gcr.io/distroless/static-debian12:nonroot" {
		t.Errorf("runtime image = %q, want gcr.io/distroless/static-debian12:nonroot", from)
	}
	var entrypoint, cmd []string
	if err := json.Unmarshal([]byte(entry), &entrypoint); err != nil {
		t.Fatalf("ENTRYPOINT %s is not the JSON (exec) form: %v", entry, err)
	}
	if err := json.Unmarshal([]byte(cmdJSON), &cmd); err != nil {
		t.Fatalf("CMD %s is not the JSON (exec) form: %v", cmdJSON, err)
	}
	if !slices.Equal(entrypoint, []string{copyDest}) || copyDest != "/relayd" {
		t.Errorf("ENTRYPOINT %q, binary copied to %q; want [\"/relayd\"]", entrypoint, copyDest)
	}
	for _, l := range []string{"title", "source", "version", "revision", "created"} {
		if !strings.Contains(labels, "org.opencontainers.image."+l+"=") {
			t.Errorf("no org.opencontainers.image.%s label", l)
		}
	}

	for _, dir := range shipped {
		b := loadBundle(t, dir)
		c := b.container
		if len(c.Command) > 0 && !slices.Equal(c.Command, entrypoint) {
			t.Errorf("%s: the container's command %q overrides the image's ENTRYPOINT %q", dir, c.Command, entrypoint)
		}
		if len(c.Args) < len(cmd) || !slices.Equal(c.Args[:len(cmd)], cmd) {
			t.Errorf("%s: the container's args %q do not start with the image's CMD %q", dir, c.Args, cmd)
		}
		if p := flagValue(cmd, "c", "config"); p != b.configPath {
			t.Errorf("%s: image CMD reads %q, the Deployment mounts the config at %q", dir, p, b.configPath)
		}
		uid, err := strconv.ParseInt(strings.Split(user, ":")[0], 10, 64)
		if err != nil {
			t.Fatalf("USER %q: want a numeric uid (kubelet can only check runAsNonRoot on numeric users)", user)
		}
		psc := b.deployment.Spec.Template.Spec.SecurityContext
		if uid == 0 || psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != uid {
			t.Errorf("%s: image USER %q, pod runAsUser %v: want the same non-root uid", dir, user, psc.RunAsUser)
		}
		for _, p := range c.Ports {
			if !slices.Contains(exposed, strconv.Itoa(int(p.ContainerPort))) {
				t.Errorf("%s: container port %d is not EXPOSEd by the image", dir, p.ContainerPort)
			}
		}
	}
}

// TestDockerignoreKeepsWhatTheBuildNeeds: the context is the Go sources
// only, and every package relayd's main imports from this module lies in a
// folder the Dockerfile copies and .dockerignore lets through.
func TestDockerignoreKeepsWhatTheBuildNeeds(t *testing.T) {
	root := testutil.RepoRootT(t)
	lines := []string{}
	for _, l := range strings.Split(repoFile(t, ".dockerignore"), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 || lines[0] != "*" {
		t.Fatalf(".dockerignore should start with \"*\" and re-include what the build needs, got %q", lines)
	}
	included := map[string]bool{}
	for _, l := range lines[1:] {
		if p, ok := strings.CutPrefix(l, "!"); ok {
			included[strings.TrimSuffix(p, "/")] = true
		}
	}
	copied := map[string]bool{}
	for _, in := range parseDockerfile(t, repoFile(t, "Dockerfile")) {
		if in.cmd != "COPY" || strings.Contains(in.args, "--from=") {
			continue
		}
		f := strings.Fields(in.args)
		for _, src := range f[:len(f)-1] {
			src = strings.TrimSuffix(src, "/")
			copied[src] = true
			if !included[src] {
				t.Errorf("the Dockerfile copies %s, which .dockerignore excludes", src)
			}
		}
	}
	out, err := exec.Command("go", "list", "-C", root, "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", "./cmd/relayd").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	n := 0
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		top := strings.Split(filepath.ToSlash(rel), "/")[0]
		if !copied[top] {
			t.Errorf("relayd imports %s, but the Dockerfile does not copy %s/", rel, top)
		}
		n++
	}
	if n < 3 {
		t.Errorf("go list found only %d of relayd's own packages", n)
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if !copied[f] {
			t.Errorf("the Dockerfile does not copy %s", f)
		}
	}
}
