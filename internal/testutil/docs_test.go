package testutil

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A figure in README.md or docs/ holds at the commit it was measured at,
// not "now": code moves on and "now" silently becomes wrong. A paragraph,
// list item or table row that states a measured figure and speaks of the
// present ("now", "currently", "today", "at the current code") must name
// the commit it was measured at, itself or in its section's heading.
var (
	// figure: a number with a unit of something measured.
	figureRE = regexp.MustCompile(`(?:^|[^\pL\d_.])\d(?:[\d,.]*\d)?\s?(?:×|ms\b|µs\b|ns\b|s\b|min\b|B\b|KB\b|MB\b|MiB\b|GiB\b|%|/s\b|\s(?:runs|events|changes|faults|objects|writes)\b)`)
	// present: words that date a figure to the reader's moment.
	presentRE = regexp.MustCompile(`(?i)\bnow\b|\bcurrently\b|\btoday\b|at the current code|as it is now|at present`)
	// commitRE: an abbreviated commit hash (hex with a digit and a letter).
	commitRE   = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
	numberedRE = regexp.MustCompile(`^\d+\. `)
)

// namesCommit reports whether s contains something that reads as a commit
// hash (seven or more hex digits, at least one a letter and one a digit).
func namesCommit(s string) bool {
	for _, m := range commitRE.FindAllString(s, -1) {
		if strings.ContainsAny(m, "0123456789") && strings.ContainsAny(m, "abcdef") {
			return true
		}
	}
	return false
}

// docBlock is a paragraph, list item or table row of a Markdown file, with
// the heading of its section.
type docBlock struct {
	line    int
	heading string
	text    string
}

// docBlocks splits Markdown into blocks: blank lines end a paragraph, a
// list item or a table row starts a new block, fenced code is skipped.
func docBlocks(md string) []docBlock {
	var (
		out     []docBlock
		cur     *docBlock
		heading string
		fenced  bool
	)
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	for i, l := range strings.Split(md, "\n") {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "```"):
			flush()
			fenced = !fenced
			continue
		case fenced:
			continue
		case t == "":
			flush()
			continue
		case strings.HasPrefix(t, "#"):
			flush()
			heading = t
			continue
		case strings.HasPrefix(t, "|"), strings.HasPrefix(t, "- "), strings.HasPrefix(t, "* "), numberedRE.MatchString(t):
			flush()
		}
		if cur == nil {
			cur = &docBlock{line: i + 1, heading: heading}
		}
		cur.text += " " + t
	}
	flush()
	return out
}

// datedFigures returns the blocks of md that state a figure in the present
// tense without naming a commit.
func datedFigures(md string) []docBlock {
	var bad []docBlock
	for _, b := range docBlocks(md) {
		if figureRE.MatchString(b.text) && presentRE.MatchString(b.text) && !namesCommit(b.text) && !namesCommit(b.heading) {
			bad = append(bad, b)
		}
	}
	return bad
}

func TestDocFiguresNameTheirCommit(t *testing.T) {
	root := RepoRootT(t)
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	if len(files) < 5 {
		t.Fatalf("found only %d Markdown files under %s", len(files), root)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, bad := range datedFigures(string(b)) {
			t.Errorf("%s:%d states a figure %q \"%s\" without the commit it was measured at (say at which commit, or re-measure and say so): %s",
				rel, bad.line, strings.TrimLeft(figureRE.FindString(bad.text), " ("), presentRE.FindString(bad.text), excerpt(bad.text))
		}
	}
}

func excerpt(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

func TestDatedFiguresAreFound(t *testing.T) {
	for _, c := range []struct {
		md   string
		want int
	}{
		{"Measured at the current code: 35 runs in 20 min.", 1},
		{"relayd now does 8.9× the events.", 1},
		{"relayd now does 8.9× the events at commit c912501.", 0},
		{"## Re-run at commit c912501\n\nrelayd now does 8.9× the events.", 0},
		{"relayd now starts from the checkpoint.", 0}, // no figure
		{"| latency | 0.43 ms | today |", 1},
		{"```\nnow 5 ms\n```", 0}, // code
		{"- first item, 3 runs\n- now, no figure", 0},
		{"- first item\n- now 3 runs", 1},
		{"It took 12 s, and deadbeef is not a commit: now.", 1}, // hex without a digit
	} {
		if got := len(datedFigures(c.md)); got != c.want {
			t.Errorf("%q: %d blocks flagged, want %d", c.md, got, c.want)
		}
	}
}
