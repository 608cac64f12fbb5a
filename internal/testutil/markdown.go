package testutil

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// MarkdownFile is one of the repository's Markdown documents: README.md or
// docs/*.md.
type MarkdownFile struct {
	Rel  string // path relative to the repository root
	Text string
}

// MarkdownFiles reads README.md and docs/*.md: the documents that say what
// relayd promises, which the documentation tests read.
func MarkdownFiles(tb testing.TB) []MarkdownFile {
	tb.Helper()
	root := RepoRootT(tb)
	paths, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		tb.Fatal(err)
	}
	paths = append(paths, filepath.Join(root, "README.md"))
	if len(paths) < 5 {
		tb.Fatalf("found only %d Markdown files under %s", len(paths), root)
	}
	out := make([]MarkdownFile, 0, len(paths))
	for _, p := range paths {
		rel, _ := filepath.Rel(root, p)
		out = append(out, ReadMarkdown(tb, rel))
	}
	return out
}

// ReadMarkdown reads one document by its path relative to the root.
func ReadMarkdown(tb testing.TB, rel string) MarkdownFile {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(RepoRootT(tb), rel))
	if err != nil {
		tb.Fatal(err)
	}
	return MarkdownFile{Rel: rel, Text: string(b)}
}

// MarkdownBlock is a paragraph, list item or table row of a Markdown
// document, with its first line and the heading of its section. Text is its
// lines trimmed and joined, each after a space.
type MarkdownBlock struct {
	Line    int
	Heading string
	Text    string
}

var listItemRE = regexp.MustCompile(`^(?:[-*]|\d+\.) `)

// MarkdownBlocks splits Markdown into blocks: a blank line or a heading
// ends one, a list item or a table row starts a new one, fenced code is
// skipped.
func MarkdownBlocks(md string) []MarkdownBlock {
	var (
		out     []MarkdownBlock
		cur     *MarkdownBlock
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
		case strings.HasPrefix(t, "|"), listItemRE.MatchString(t):
			flush()
		}
		if cur == nil {
			cur = &MarkdownBlock{Line: i + 1, Heading: heading}
		}
		cur.Text += " " + t
	}
	flush()
	return out
}
