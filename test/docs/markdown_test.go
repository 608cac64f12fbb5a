package docs

import (
	"regexp"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testutil"
)

// mdFile is a Markdown file of the repository: README.md or docs/*.md.
type mdFile = testutil.MarkdownFile

func markdownFiles(t *testing.T) []mdFile { return testutil.MarkdownFiles(t) }

func readMarkdown(t *testing.T, rel string) mdFile { return testutil.ReadMarkdown(t, rel) }

// span is an inline code span (`…`) of a Markdown file, outside fenced
// code blocks, with its line.
type span struct {
	line int
	text string
}

var spanRE = regexp.MustCompile("`([^`\n]+)`")

// codeSpans returns the inline code spans of md. A span does not cross a
// line break here; the few that do in the docs hold no name these tests
// look for.
func codeSpans(md string) []span {
	var out []span
	fenced := false
	for i, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range spanRE.FindAllStringSubmatch(l, -1) {
			out = append(out, span{line: i + 1, text: m[1]})
		}
	}
	return out
}

// lineOf returns the 1-based line of byte offset off in s.
func lineOf(s string, off int) int { return strings.Count(s[:off], "\n") + 1 }

// table returns the body rows (cells trimmed) of the first Markdown table
// of md whose header row, cells trimmed, starts with the given cells, and
// the line of each row. It fails t if there is none.
func table(t *testing.T, f mdFile, header ...string) (rows [][]string, lines []int) {
	t.Helper()
	in := false
	for i, l := range strings.Split(f.Text, "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") {
			if in {
				break
			}
			continue
		}
		cells := splitRow(l)
		if !in {
			if len(cells) >= len(header) && equalPrefix(cells, header) {
				in = true
			}
			continue
		}
		if strings.HasPrefix(l, "|---") {
			continue
		}
		rows = append(rows, cells)
		lines = append(lines, i+1)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no table with header %q (or no rows in it)", f.Rel, "| "+strings.Join(header, " | ")+" |")
	}
	return rows, lines
}

func splitRow(l string) []string {
	cells := strings.Split(strings.Trim(l, "|"), "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

func equalPrefix(cells, header []string) bool {
	for i, h := range header {
		if cells[i] != h {
			return false
		}
	}
	return true
}

// cellValue is the value a table cell states: the text of its first code
// span, with `""` for the empty string (followed by a remark, e.g.
// `""` (core)). ok is false when the cell has no code span.
func cellValue(cell string) (v string, ok bool) {
	m := spanRE.FindStringSubmatch(cell)
	if m == nil {
		return "", false
	}
	if m[1] == `""` {
		return "", true
	}
	return m[1], true
}
