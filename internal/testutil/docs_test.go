package testutil

import (
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
	commitRE = regexp.MustCompile(`\b[0-9a-f]{7,40}\b`)
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

// datedFigures returns the blocks of md that state a figure in the present
// tense without naming a commit.
func datedFigures(md string) []MarkdownBlock {
	var bad []MarkdownBlock
	for _, b := range MarkdownBlocks(md) {
		if figureRE.MatchString(b.Text) && presentRE.MatchString(b.Text) && !namesCommit(b.Text) && !namesCommit(b.Heading) {
			bad = append(bad, b)
		}
	}
	return bad
}

func TestDocFiguresNameTheirCommit(t *testing.T) {
	for _, f := range MarkdownFiles(t) {
		for _, bad := range datedFigures(f.Text) {
			t.Errorf("%s:%d states a figure %q \"%s\" without the commit it was measured at (say at which commit, or re-measure and say so): %s",
				f.Rel, bad.Line, strings.TrimLeft(figureRE.FindString(bad.Text), " ("), presentRE.FindString(bad.Text), excerpt(bad.Text))
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
