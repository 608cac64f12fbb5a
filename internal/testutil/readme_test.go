package testutil

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// README.md's prerequisites name the Go version `make test` needs: the
// highest `go` line of the repository's modules (a module's go line is the
// oldest Go that builds it; the tool modules under tools/ count, since
// `make test` builds them).
func TestREADMENamesTheGoVersionTheModulesNeed(t *testing.T) {
	root := RepoRootT(t)
	goLine := regexp.MustCompile(`(?m)^go (\d+\.\d+(?:\.\d+)?)\s*$`)
	var want, from string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != "go.mod" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		m := goLine.FindSubmatch(b)
		if m == nil {
			t.Errorf("%s has no go line", path)
			return nil
		}
		if v := string(m[1]); want == "" || versionLess(want, v) {
			want, from = v, path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want == "" {
		t.Fatalf("no go.mod found under %s", root)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	rel, _ := filepath.Rel(root, from)
	named := regexp.MustCompile(`\bGo (\d+\.\d+(?:\.\d+)?) or later\b`).FindAllSubmatch(readme, -1)
	if len(named) == 0 {
		t.Fatalf("README.md does not say which Go `make test` needs (\"Go %s or later\", from %s)", want, rel)
	}
	for _, m := range named {
		if got := string(m[1]); got != want {
			t.Errorf("README.md says \"Go %s or later\"; the modules need Go %s (%s)", got, want, rel)
		}
	}
}

// versionLess compares dotted Go versions numerically (1.26 < 1.26.7).
func versionLess(a, b string) bool {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(as) || i < len(bs); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

func TestVersionLess(t *testing.T) {
	for _, c := range []struct {
		a, b string
		less bool
	}{
		{"1.26", "1.26.7", true}, {"1.26.7", "1.26.10", true}, {"1.25.0", "1.26.0", true},
		{"1.26.7", "1.26.7", false}, {"1.27", "1.26.9", false},
	} {
		if got := versionLess(c.a, c.b); got != c.less {
			t.Errorf("versionLess(%s, %s) = %v, want %v", c.a, c.b, got, c.less)
		}
	}
}

// The words of relayd's guarantees that a newcomer cannot know are
// explained in README.md where they are first used: each has an entry
// ("- **word**") in the same section as its first use, or in an earlier one.
func TestREADMEExplainsItsWords(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(RepoRootT(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	words := []struct{ name, use, def string }{
		{"410", `\b410\b`, `^- \*\*410\*\*`},
		{"relist", `(?i)\brelist`, `^- \*\*relist\*\*`},
		{"epoch", `(?i)\bepoch`, `^- \*\*epoch\*\*`},
		{"final state unknown", `(?i)\bfinal[ -]state[ -]unknown\b`, `^- \*\*final state unknown\*\*`},
	}
	section, inCode := 0, false
	firstUse := map[string]int{} // section of the first use
	defined := map[string]int{}  // section of the entry
	for i, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		if strings.HasPrefix(line, "## ") {
			section++
		}
		for _, w := range words {
			if _, ok := defined[w.name]; !ok && regexp.MustCompile(w.def).MatchString(line) {
				defined[w.name] = section
			}
			if _, ok := firstUse[w.name]; !ok && regexp.MustCompile(w.use).MatchString(line) {
				firstUse[w.name] = section
				t.Logf("%q first used on line %d", w.name, i+1)
			}
		}
	}
	for _, w := range words {
		d, ok := defined[w.name]
		switch {
		case !ok:
			t.Errorf("README.md uses %q without an entry explaining it (a list item starting with **%s**)", w.name, w.name)
		case d > firstUse[w.name]:
			t.Errorf("README.md explains %q in a later section than its first use: explain it where it is first used", w.name)
		}
	}
}
