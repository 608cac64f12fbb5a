package observability

import (
	"bufio"
	"bytes"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"go.yaml.in/yaml/v3"
)

const (
	operationsFile  = "docs/OPERATIONS.md"
	runbooksSection = "## Alert runbooks"
	chartFile       = "deploy/helm/relayd/Chart.yaml"
)

// mdHeading is a heading of a Markdown file: its level, its text and the
// anchor GitHub gives it.
type mdHeading struct {
	level  int
	text   string
	anchor string
	body   string // the text up to the next heading
}

var (
	headingRe  = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	mdLinkRe   = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	alertRefRe = regexp.MustCompile(`\bRelayd[A-Z][A-Za-z]+\b`)
)

// githubAnchor is the anchor GitHub gives a heading: the text without link
// targets, lower-cased, with everything but letters, digits, '-', '_' and
// spaces removed and spaces turned into '-'. (A repeated heading gets -1,
// -2, ...; headings returns those.)
func githubAnchor(text string) string {
	text = mdLinkRe.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// headings lists the headings of a Markdown file outside fenced code
// blocks, with GitHub's anchors.
func headings(md []byte) []mdHeading {
	var out []mdHeading
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(md))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		m := headingRe.FindStringSubmatch(line)
		if fenced || m == nil {
			if len(out) > 0 {
				out[len(out)-1].body += line + "\n"
			}
			continue
		}
		a := githubAnchor(m[2])
		if n := seen[a]; n > 0 {
			seen[a]++
			a += "-" + strconv.Itoa(n)
		} else {
			seen[a] = 1
		}
		out = append(out, mdHeading{level: len(m[1]), text: m[2], anchor: a})
	}
	return out
}

// alertRules maps each alert of the rules to its annotations.
func alertRules(t *testing.T) map[string]map[string]any {
	t.Helper()
	var rf ruleGroups
	if err := yaml.Unmarshal(repoFile(t, rulesFile), &rf); err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, g := range rf.Groups {
		rules, _ := g["rules"].([]any)
		for _, r := range rules {
			rule := r.(map[string]any)
			if name, _ := rule["alert"].(string); name != "" {
				ann, _ := rule["annotations"].(map[string]any)
				out[name] = ann
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s has no alerts", rulesFile)
	}
	return out
}

// TestRunbooks: every alert links its runbook, a section of
// docs/OPERATIONS.md's "Alert runbooks" headed by the alert's name, under
// the repository's address (Chart.yaml's home); every section there is an
// alert's and says what it means, how to confirm it and what to do; and
// every alert the rules' annotations or the dashboard name exists.
func TestRunbooks(t *testing.T) {
	var chart struct {
		Home string `yaml:"home"`
	}
	if err := yaml.Unmarshal(repoFile(t, chartFile), &chart); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(chart.Home, "https://github.com/") {
		t.Fatalf("%s: home %q is not a GitHub repository", chartFile, chart.Home)
	}
	base := strings.TrimSuffix(chart.Home, "/") + "/blob/main/" + operationsFile + "#"

	alerts := alertRules(t)
	hs := headings(repoFile(t, operationsFile))
	anchors := map[string]mdHeading{}
	var sections []mdHeading // the ### headings of the runbooks section
	in := false
	for _, h := range hs {
		anchors[h.anchor] = h
		if h.level <= 2 {
			in = "## "+h.text == runbooksSection
			continue
		}
		if in && h.level == 3 {
			sections = append(sections, h)
		}
	}
	if len(sections) == 0 {
		t.Fatalf("%s: no %q section with ### sections", operationsFile, runbooksSection)
	}

	for name, ann := range alerts {
		u, _ := ann["runbook_url"].(string)
		anchor, ok := strings.CutPrefix(u, base)
		switch {
		case u == "":
			t.Errorf("alert %s has no runbook_url annotation", name)
		case !ok:
			t.Errorf("alert %s: runbook_url %q does not start with %q", name, u, base)
		default:
			h, found := anchors[anchor]
			switch {
			case !found:
				t.Errorf("alert %s: runbook_url %q: %s has no heading with anchor #%s", name, u, operationsFile, anchor)
			case !slices.ContainsFunc(sections, func(s mdHeading) bool { return s.anchor == anchor }):
				t.Errorf("alert %s: runbook_url %q points at %q, not a section of %q", name, u, h.text, runbooksSection)
			case h.text != name:
				t.Errorf("alert %s: runbook_url %q points at the runbook of %q", name, u, h.text)
			}
		}
	}
	for _, s := range sections {
		if _, ok := alerts[s.text]; !ok {
			t.Errorf("%s: runbook section %q is not an alert of %s", operationsFile, s.text, rulesFile)
		}
		for _, part := range []string{"**Means:**", "**Confirm:**", "**Do:**"} {
			if !strings.Contains(s.body, part) {
				t.Errorf("%s: runbook section %q has no %s", operationsFile, s.text, part)
			}
		}
	}

	// Alerts named in prose: the rules' annotations, the dashboard, and the
	// runbooks themselves.
	named := map[string][]string{}
	for name, ann := range alerts {
		for _, k := range []string{"summary", "description"} {
			s, _ := ann[k].(string)
			for _, ref := range alertRefRe.FindAllString(s, -1) {
				named[ref] = append(named[ref], "the "+k+" of "+name)
			}
		}
	}
	for _, ref := range alertRefRe.FindAllString(string(repoFile(t, dashboardFile)), -1) {
		named[ref] = append(named[ref], dashboardFile)
	}
	for _, s := range sections {
		for _, ref := range alertRefRe.FindAllString(s.body, -1) {
			named[ref] = append(named[ref], "runbook "+s.text)
		}
	}
	for ref, where := range named {
		if _, ok := alerts[ref]; !ok {
			t.Errorf("%s names alert %s, which %s does not have", strings.Join(slices.Compact(where), ", "), ref, rulesFile)
		}
	}
}

func TestGitHubAnchor(t *testing.T) {
	for in, want := range map[string]string{
		"RelaydSourceDown":                         "relaydsourcedown",
		"Alert runbooks":                           "alert-runbooks",
		"What to look at when":                     "what-to-look-at-when",
		"The stream: relayd never clobbers it":     "the-stream-relayd-never-clobbers-it",
		"How a gap is recovered: the object index": "how-a-gap-is-recovered-the-object-index",
		"A [linked](x.md) `code` heading":          "a-linked-code-heading",
	} {
		if got := githubAnchor(in); got != want {
			t.Errorf("githubAnchor(%q) = %q, want %q", in, got, want)
		}
	}
	hs := headings([]byte("# A\n\n## B\n\n```\n# not a heading\n```\n\n## B\n"))
	var got []string
	for _, h := range hs {
		got = append(got, h.anchor)
	}
	if want := []string{"a", "b", "b-1"}; !slices.Equal(got, want) {
		t.Errorf("anchors %v, want %v", got, want)
	}
}
