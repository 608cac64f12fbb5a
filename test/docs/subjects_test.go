package docs

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/relayd/relayd/pkg/event"
)

const consuming = "docs/CONSUMING.md"

// subjectExample is a row of one of docs/CONSUMING.md's subject tables.
type subjectExample struct {
	line    int
	subject string
	prefix  string
	marker  bool // a control subject: a sync marker's or a heartbeat's
	// heartbeat: a heartbeat's subject (marker too).
	heartbeat bool
}

// tokensAfterPrefix counts the tokens of the subject after its prefix.
func (x subjectExample) tokensAfterPrefix() int {
	return len(strings.Split(strings.TrimPrefix(x.subject, x.prefix+"."), "."))
}

// cells reads the code-span value of every cell of row; a cell without one
// fails t.
func cells(t *testing.T, line int, row []string, n int) []string {
	t.Helper()
	if len(row) != n {
		t.Fatalf("%s:%d: %d cells, want %d", consuming, line, len(row), n)
	}
	out := make([]string, n)
	for i, c := range row {
		v, ok := cellValue(c)
		if !ok {
			t.Fatalf("%s:%d: cell %d (%q) has no code span", consuming, line, i+1, c)
		}
		out[i] = v
	}
	return out
}

// objectExamples checks every row of the object subject table against
// relayd's encoder (the subject it builds from the row's values) and
// event.ParseSubject (the values it takes the subject apart into).
func objectExamples(t *testing.T, f mdFile) []subjectExample {
	t.Helper()
	rows, lines := table(t, f, "subject", "prefix", "cluster", "group", "version", "resource", "namespace", "name", "type")
	var out []subjectExample
	for i, row := range rows {
		c := cells(t, lines[i], row, 9)
		subject, want := c[0], event.SubjectParts{
			Prefix: c[1], Cluster: c[2], Group: c[3], Version: c[4], Resource: c[5],
			Namespace: c[6], Name: c[7], Type: event.Type(c[8]),
		}
		got, err := event.ParseSubject(subject)
		if err != nil {
			t.Errorf("%s:%d: ParseSubject: %v", consuming, lines[i], err)
		} else if got != want {
			t.Errorf("%s:%d: ParseSubject(%q)\n got %+v\nwant %+v (the row)", consuming, lines[i], subject, got, want)
		}
		enc, err := event.NewEncoder(event.EncoderOptions{Prefix: want.Prefix, Cluster: want.Cluster, Source: "docs"})
		if err != nil {
			t.Errorf("%s:%d: %v", consuming, lines[i], err)
		} else if built := enc.Subject(event.Resource{Group: want.Group, Version: want.Version, Resource: want.Resource}, want.Namespace, want.Name, want.Type); built != subject {
			t.Errorf("%s:%d: relayd publishes the row's object on %q, not %q", consuming, lines[i], built, subject)
		}
		out = append(out, subjectExample{line: lines[i], subject: subject, prefix: want.Prefix})
	}
	return out
}

// markerExamples checks every row of the marker subject table against the
// encoder's control subjects, and that ParseSubject refuses them.
func markerExamples(t *testing.T, f mdFile) []subjectExample {
	t.Helper()
	rows, lines := table(t, f, "marker subject", "prefix", "cluster", "source", "phase")
	var out []subjectExample
	for i, row := range rows {
		c := cells(t, lines[i], row, 5)
		subject, prefix, phase := c[0], c[1], c[4]
		if phase != "started" && phase != "completed" {
			t.Errorf("%s:%d: phase %q, want started or completed", consuming, lines[i], phase)
		}
		enc, err := event.NewEncoder(event.EncoderOptions{Prefix: prefix, Cluster: c[2], Source: c[3]})
		if err != nil {
			t.Errorf("%s:%d: %v", consuming, lines[i], err)
		} else if built := enc.ControlSubject(phase == "completed"); built != subject {
			t.Errorf("%s:%d: relayd publishes the row's marker on %q, not %q", consuming, lines[i], built, subject)
		}
		if p, err := event.ParseSubject(subject); err == nil {
			t.Errorf("%s:%d: ParseSubject takes the marker subject %q for an object's: %+v", consuming, lines[i], subject, p)
		}
		out = append(out, subjectExample{line: lines[i], subject: subject, prefix: prefix, marker: true})
	}
	return out
}

// heartbeatExamples checks every row of the heartbeat subject table
// against the encoder's heartbeat subject and ParseControlSubject, and that
// ParseSubject refuses them as control subjects.
func heartbeatExamples(t *testing.T, f mdFile) []subjectExample {
	t.Helper()
	rows, lines := table(t, f, "heartbeat subject", "prefix", "cluster", "source")
	var out []subjectExample
	for i, row := range rows {
		c := cells(t, lines[i], row, 4)
		subject, prefix := c[0], c[1]
		enc, err := event.NewEncoder(event.EncoderOptions{Prefix: prefix, Cluster: c[2], Source: c[3]})
		if err != nil {
			t.Errorf("%s:%d: %v", consuming, lines[i], err)
		} else if built := enc.HeartbeatSubject(); built != subject {
			t.Errorf("%s:%d: relayd publishes the row's heartbeat on %q, not %q", consuming, lines[i], built, subject)
		}
		want := event.ControlParts{Prefix: prefix, Cluster: c[2], Source: c[3], Event: event.HeartbeatToken}
		if got, err := event.ParseControlSubject(subject); err != nil || got != want {
			t.Errorf("%s:%d: ParseControlSubject(%q) = %+v, %v; want %+v (the row)", consuming, lines[i], subject, got, err, want)
		}
		if _, err := event.ParseSubject(subject); !errors.Is(err, event.ErrControlSubject) {
			t.Errorf("%s:%d: ParseSubject(%q) = %v, want a control subject error", consuming, lines[i], subject, err)
		}
		out = append(out, subjectExample{line: lines[i], subject: subject, prefix: prefix, marker: true, heartbeat: true})
	}
	return out
}

var (
	// heartbeatCountRE finds the sentence that states the heartbeat
	// subjects' token count.
	heartbeatCountRE = regexp.MustCompile(`(?i)heartbeat subjects (\w+) tokens after the prefix`)
	// countRE finds the sentence that states the token counts.
	countRE = regexp.MustCompile(`(?i)after the prefix, object subjects have (\w+) tokens.*? marker subjects (\w+)`)
	numbers = map[string]int{"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
)

// heartbeatCount is the heartbeat subjects' token count the docs state.
func heartbeatCount(t *testing.T, f mdFile) int {
	t.Helper()
	m := heartbeatCountRE.FindStringSubmatch(strings.Join(strings.Fields(f.Text), " "))
	if m == nil {
		t.Fatalf("%s: no sentence %q", consuming, "heartbeat subjects N tokens after the prefix")
	}
	return number(t, m[1])
}

func number(t *testing.T, w string) int {
	t.Helper()
	if n, ok := numbers[strings.ToLower(w)]; ok {
		return n
	}
	n, err := strconv.Atoi(w)
	if err != nil {
		t.Fatalf("%s: %q is not a number", consuming, w)
	}
	return n
}

// TestSubjectExamples: docs/CONSUMING.md's example subjects are what relayd
// builds and ParseSubject takes apart, its stated token counts are those of
// the examples, and every filter of its filter table matches an example
// (one without '>' only examples of one kind).
func TestSubjectExamples(t *testing.T) {
	f := readMarkdown(t, consuming)
	objects, markers, beats := objectExamples(t, f), markerExamples(t, f), heartbeatExamples(t, f)

	flat := strings.Join(strings.Fields(f.Text), " ")
	m := countRE.FindStringSubmatch(flat)
	if m == nil {
		t.Fatalf("%s: no sentence %q", consuming, "After the prefix, object subjects have N tokens … marker subjects M")
	}
	for _, c := range []struct {
		what string
		n    int
		xs   []subjectExample
	}{{"object", number(t, m[1]), objects}, {"marker", number(t, m[2]), markers}, {"heartbeat", heartbeatCount(t, f), beats}} {
		for _, x := range c.xs {
			if got := x.tokensAfterPrefix(); got != c.n {
				t.Errorf("%s says %s subjects have %d tokens after the prefix; the example %q (line %d, prefix %q) has %d",
					consuming, c.what, c.n, x.subject, x.line, x.prefix, got)
			}
		}
	}

	rows, lines := table(t, f, "what", "filter subject")
	all := append(append(append([]subjectExample{}, objects...), markers...), beats...)
	for i, row := range rows {
		filter, ok := cellValue(row[1])
		if !ok {
			t.Fatalf("%s:%d: no filter subject in %q", consuming, lines[i], row[1])
		}
		kinds := map[bool]bool{}
		for _, x := range all {
			if subjectMatches(filter, x.subject) {
				kinds[x.marker] = true
			}
		}
		switch {
		case len(kinds) == 0:
			t.Errorf("%s:%d: the filter %q (%s) matches none of the example subjects", consuming, lines[i], filter, row[0])
		case len(kinds) == 2 && !strings.Contains(filter, ">"):
			t.Errorf("%s:%d: the filter %q has no '>' but matches object and marker subjects", consuming, lines[i], filter)
		}
	}
}

// subjectMatches is NATS subject matching: '*' is one token, a final '>'
// one or more.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, ft := range f {
		if ft == ">" {
			return i == len(f)-1 && len(s) > i
		}
		if i >= len(s) || (ft != "*" && ft != s[i]) {
			return false
		}
	}
	return len(f) == len(s)
}

func TestSubjectMatches(t *testing.T) {
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"a.>", "a.b.c", true},
		{"a.>", "a", false},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.b.c.d", false},
		{"a.*", "a", false},
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
	} {
		if got := subjectMatches(c.filter, c.subject); got != c.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", c.filter, c.subject, got, c.want)
		}
	}
}

// templateRE matches a subject template of the docs, e.g.
// <prefix>.<cluster>.<group|core>.….<added|modified|deleted>.
var templateRE = regexp.MustCompile("<prefix>\\.<cluster>\\.[^\\s`;,)]+")

// TestSubjectTemplates: every subject template in README.md or docs/*.md
// (a filter ending in ".>" aside) has as many tokens after <prefix> as the
// example subjects of its kind in docs/CONSUMING.md: marker templates are
// those with _relayd.
func TestSubjectTemplates(t *testing.T) {
	f := readMarkdown(t, consuming)
	want := map[bool]int{}
	for _, x := range append(objectExamples(t, f), markerExamples(t, f)...) {
		want[x.marker] = x.tokensAfterPrefix()
	}
	beats := heartbeatExamples(t, f)
	if len(beats) == 0 {
		t.Fatalf("%s: no heartbeat subject example", consuming)
	}
	seen := map[bool]int{}
	for _, md := range markdownFiles(t) {
		for _, loc := range templateRE.FindAllStringIndex(md.Text, -1) {
			tpl := md.Text[loc[0]:loc[1]]
			if strings.HasSuffix(tpl, ".>") {
				continue
			}
			marker := strings.Contains(tpl, "."+event.ControlToken+".")
			seen[marker]++
			n := want[marker]
			if marker && strings.HasSuffix(tpl, "."+event.HeartbeatToken) {
				n = beats[0].tokensAfterPrefix()
			}
			if got := len(strings.Split(strings.TrimPrefix(tpl, "<prefix>."), ".")); got != n {
				t.Errorf("%s:%d: the template %s has %d tokens after <prefix>; relayd's subjects of that kind (the examples of %s) have %d",
					md.Rel, lineOf(md.Text, loc[0]), tpl, got, consuming, n)
			}
		}
	}
	if seen[false] == 0 || seen[true] == 0 {
		t.Fatalf("found %d object and %d marker subject templates in the docs: the scan is broken", seen[false], seen[true])
	}
}
