package testutil

import (
	"strings"
	"testing"
)

// DocSamples returns the fenced blocks of a Markdown document that follow a
// line "<!-- <tag>: <name> -->", by name: the text between the two fence
// lines, each line with its newline. Tests compare them with the files
// they show, so that a document cannot drift from them.
func DocSamples(tb testing.TB, doc, tag string) map[string]string {
	tb.Helper()
	lines := strings.SplitAfter(doc, "\n")
	out := map[string]string{}
	for i := 0; i < len(lines); i++ {
		name, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "<!-- "+tag+": ")
		if !ok {
			continue
		}
		name = strings.TrimSpace(strings.TrimSuffix(name, "-->"))
		if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```") {
			tb.Fatalf("line %d: <!-- %s: %s --> is not followed by a fenced block", i+1, tag, name)
		}
		var b strings.Builder
		j := i + 2
		for ; j < len(lines) && strings.TrimRight(lines[j], "\n") != "```"; j++ {
			b.WriteString(lines[j])
		}
		if j == len(lines) {
			tb.Fatalf("line %d: the sample %s has no closing fence", i+2, name)
		}
		if _, dup := out[name]; dup {
			tb.Errorf("line %d: a second sample of %s", i+1, name)
		}
		out[name] = b.String()
		i = j
	}
	return out
}
