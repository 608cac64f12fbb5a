package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testutil"
)

// mdFile is a Markdown file of the repository: README.md or docs/*.md.
type mdFile struct {
	rel  string // path relative to the repository root
	text string
}

// markdownFiles reads README.md and docs/*.md.
func markdownFiles(t *testing.T) []mdFile {
	t.Helper()
	root := testutil.RepoRootT(t)
	paths, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	paths = append(paths, filepath.Join(root, "README.md"))
	if len(paths) < 5 {
		t.Fatalf("found only %d Markdown files under %s", len(paths), root)
	}
	var out []mdFile
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, mdFile{rel: rel, text: string(b)})
	}
	return out
}

// readMarkdown reads one of them by its path relative to the root.
func readMarkdown(t *testing.T, rel string) mdFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.RepoRootT(t), rel))
	if err != nil {
		t.Fatal(err)
	}
	return mdFile{rel: rel, text: string(b)}
}

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
	for i, l := range strings.Split(f.text, "\n") {
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
		t.Fatalf("%s: no table with header %q (or no rows in it)", f.rel, "| "+strings.Join(header, " | ")+" |")
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

// block is a paragraph, list item or table row of a Markdown file (fenced
// code skipped), with its first line.
type block struct {
	line int
	text string
}

var listItemRE = regexp.MustCompile(`^(?:[-*]|\d+\.) `)

func blocks(md string) []block {
	var (
		out    []block
		cur    *block
		fenced bool
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
		case t == "" || strings.HasPrefix(t, "#"):
			flush()
			continue
		case strings.HasPrefix(t, "|"), listItemRE.MatchString(t):
			flush()
		}
		if cur == nil {
			cur = &block{line: i + 1}
		}
		cur.text += " " + t
	}
	flush()
	return out
}
