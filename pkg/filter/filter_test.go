package filter

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/relayd/relayd/pkg/event"
)

func mustCompile(t testing.TB, expr string) *Filter {
	t.Helper()
	f, err := Compile(expr, Options{})
	if err != nil {
		t.Fatalf("Compile(%q): %v", expr, err)
	}
	return f
}

func readPod(t testing.TB) []byte {
	t.Helper()
	raw, err := os.ReadFile("../event/testdata/pod.json")
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// The three-clause filter of the benchmark: a label, a status field, a
// container image regex.
const podFilter = `object.metadata.labels['app.kubernetes.io/name'] == 'checkout-api' && object.status.phase == 'Running' && object.spec.containers.exists(c, c.image.matches('^registry\\.example\\.com/shop/'))`

func TestMatchPod(t *testing.T) {
	raw := readPod(t)
	for _, tc := range []struct {
		expr string
		want bool
	}{
		{podFilter, true},
		{`object.status.phase == 'Failed'`, false},
		{`has(object.status.phase)`, true},
		{`has(object.status.nope)`, false},
		{`has(object.metadata.annotations) && 'prometheus.io/port' in object.metadata.annotations`, true},
		{`object.spec.containers.exists(c, c.image.matches(':2\\.14\\.1$'))`, true},
		{`object.spec.containers.all(c, c.image.startsWith('docker.io/'))`, false},
		{`size(object.spec.containers) >= 1 && object.spec.containers[0].name != ''`, true},
		{`object.metadata.name.matches('^checkout-api-[a-z0-9]+-[a-z0-9]+$')`, true},
		{`object.spec.containers.map(c, c.name).exists(n, n == 'app')`, false},
		{`object.kind in ['Pod', 'Deployment']`, true},
		{`object.metadata.labels.exists(k, k.startsWith('app.kubernetes.io/'))`, true},
		{`int(object.metadata.resourceVersion) > 1000`, true},
		{`object.?status.?nope.orValue('x') == 'x'`, true},
	} {
		f := mustCompile(t, tc.expr)
		got, err := f.Match(raw)
		if err != nil {
			t.Errorf("%s: %v", tc.expr, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s = %v, want %v", tc.expr, got, tc.want)
		}
		ref, err := decodeJSON(raw)
		if err != nil {
			t.Fatal(err)
		}
		if r, err := f.matchValue(ref); err != nil || r != got {
			t.Errorf("%s: decoded map gives %v, %v; lazy value %v", tc.expr, r, err, got)
		}
	}
}

func TestMatchErrors(t *testing.T) {
	raw := readPod(t)
	for _, tc := range []struct{ expr, want string }{
		{`object.status.nope == 'x'`, "no such key: nope"},
		{`object.spec.containers[99].name == 'x'`, "index out of bounds: 99"},
		{`object.metadata.name > 3`, "no such overload"},
		{`object.metadata.name`, "the expression yielded string, not a bool"},
	} {
		_, err := mustCompile(t, tc.expr).Match(raw)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.expr, err, tc.want)
		}
	}
	f := mustCompile(t, `object.kind == 'Pod'`)
	for _, in := range []string{``, `[]`, `"x"`, ` 1`} {
		if _, err := f.Match([]byte(in)); err == nil || err.Error() != "the object is not a JSON object" {
			t.Errorf("Match(%q): %v", in, err)
		}
	}
	if _, err := f.Match([]byte(`{"kind":"Po`)); err == nil || !strings.Contains(err.Error(), "truncated JSON") {
		t.Errorf("truncated: %v", err)
	}
}

// TestNumbers: an integer literal is an int, anything else a double, and
// the two compare as numbers.
func TestNumbers(t *testing.T) {
	raw := []byte(`{"a":3,"b":3.0,"c":1e2,"d":-0,"e":92233720368547758070}`)
	for expr, want := range map[string]bool{
		`type(object.a) == int`:                  true,
		`type(object.b) == double`:               true,
		`type(object.c) == double`:               true,
		`object.a == object.b`:                   true,
		`object.a + 1 == 4`:                      true,
		`object.a > 2.5`:                         true,
		`object.d == 0 && type(object.d) == int`: true,
		`type(object.e) == double`:               true,
	} {
		got, err := mustCompile(t, expr).Match(raw)
		if err != nil || got != want {
			t.Errorf("%s = %v, %v; want %v", expr, got, err, want)
		}
	}
}

func TestCompileErrorColumns(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{`object.kind == 'Pod' && foo(object)`, `column 28: undeclared reference to 'foo' (in container '')`},
		{`object.kind == `, `column 16: Syntax error: mismatched input '<EOF>' expecting`},
		{"object.kind == 'Pod' &&\n  object.spec.replicas + 'x' > 1", `line 2, column 30: found no matching overload for '_>_' applied to '(string, int)'`},
		{`object.metadata.name.size()`, `column 1: the expression yields int, not a bool`},
		{`size(object) + 1`, `column 1: the expression yields int, not a bool`},
	} {
		_, err := Compile(tc.expr, Options{})
		var ce *CompileError
		if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("Compile(%q): %v, want a CompileError starting %q", tc.expr, err, tc.want)
		}
	}
}

func TestCostLimits(t *testing.T) {
	// Three nested loops over the object's lists: 256^3 iterations.
	nested := `object.spec.containers.exists(c, c.ports.exists(p, object.spec.volumes.exists(v, v.name == c.name)))`
	_, err := Compile(nested, Options{})
	var ce *CostError
	if !errors.As(err, &ce) || ce.Limit != DefaultMaxEstimatedCost {
		t.Fatalf("Compile(nested): %v, want a CostError at the default limit", err)
	}
	if want := "estimated cost "; !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "exceeds the limit 1000000") {
		t.Errorf("error text %q", err)
	}
	f := mustCompile(t, podFilter)
	if _, hi := f.EstimatedCost(); hi > DefaultMaxEstimatedCost/10 {
		t.Errorf("the pod filter's estimate %d is not far below the limit", hi)
	}
	two := mustCompile(t, `object.spec.containers.exists(c, c.ports.exists(p, p.containerPort == 80))`)
	if _, hi := two.EstimatedCost(); hi > DefaultMaxEstimatedCost {
		t.Errorf("two nested loops estimated at %d", hi)
	}
	// The runtime limit stops an evaluation that the estimate let
	// through: a list far longer than assumed, 1,500² visits.
	var b strings.Builder
	b.WriteString(`{"items":[`)
	for i := range 1500 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"item-` + strconv.Itoa(i) + `"`)
	}
	b.WriteString(`]}`)
	loop, err := Compile(`object.items.exists(a, object.items.exists(b, a + b == 'x'))`, Options{MaxEstimatedCost: 1 << 62, MaxEvalTime: noClock})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := loop.Match([]byte(b.String())); err == nil || err.Error() != "evaluation stopped: its work exceeds the runtime limit of 20000000 units" {
		t.Errorf("runtime limit: %v, %v", ok, err)
	}
}

// TestLazyEqualsDecoded is the property test: for random objects and a set
// of expressions, the lazy value gives what evaluating on the decoded map
// gives, result and error alike.
func TestLazyEqualsDecoded(t *testing.T) {
	exprs := []string{
		`object.a == 1`, `has(object.a)`, `has(object.b.c)`, `object.b.c == 'x'`,
		`object.l.exists(e, e == 2)`, `object.l.all(e, type(e) == int)`, `size(object.l) > 1`,
		`2 in object.l`, `'c' in object.b`, `object.b == {'c': 'x'}`, `object.l == [1, 2]`,
		`size(object) == 3`, `object.exists(k, k.startsWith('a'))`, `object.s.matches('^[a-c]+$')`,
		`object.l.filter(e, type(e) == int).size() == 1`, `(object.l + [1]).size() > 1`,
		`object.b.c.size() > 1`, `object.l[0] == object.a`, `object.n == null`, `object.d > 0.5`,
		`object.b.exists_one(k, object.b[k] == true)`, `string(object.a) == '1'`, `object.s < 'b'`,
		`object.?b.?c.orValue('') == 'x'`, `object.l.distinct().size() == size(object.l)`,
		`sets.contains(object.l, [1])`, `object.s.lowerAscii() == object.s`, `dyn(object.b) != dyn(object.l)`,
		`has(object.ab) && object.ab != null`, `object['é'] == 1 || has(object.b.ab)`, `object.s.endsWith('\\')`,
		// The object's own keys: metadata found without skipping it, the
		// others looked up from the end (MatchParsed's path).
		`has(object.metadata) && has(object.metadata.a) && has(object.s)`, `has(object.metadata) && object.metadata == object.b`,
		`has(object.metadata) && size(object.metadata) > 0 && object.a == 1`, `object.exists(k, k == 'metadata') || has(object.c)`,
		`has(object.kind) && has(object.metadata) && has(object.l) && size(object) > 2`, `has(object.s) && has(object.metadata) && has(object.zz)`,
	}
	filters := make([]*Filter, len(exprs))
	for i, e := range exprs {
		filters[i] = mustCompile(t, e)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	parsed := 0
	defer func() {
		if parsed < 3000 {
			t.Errorf("only %d objects parsed for MatchParsed", parsed)
		}
	}()
	for n := range 3000 {
		raw := randomObject(rng, 0)
		ref, err := decodeJSON(raw)
		if err != nil {
			t.Fatalf("object %d %s: %v", n, raw, err)
		}
		for i, f := range filters {
			want, werr := f.matchValue(ref)
			// Match, and the validated path of MatchParsed.
			for _, valid := range []bool{false, true} {
				got, _, gerr := f.match(raw, valid)
				if got != want || (gerr == nil) != (werr == nil) || (gerr != nil && goType.ReplaceAllString(gerr.Error(), "T") != goType.ReplaceAllString(werr.Error(), "T")) {
					t.Fatalf("%s on %s (valid %v): lazy %v, %v; decoded %v, %v", exprs[i], raw, valid, got, gerr, want, werr)
				}
			}
		}
		// MatchParsed on the members the parse found: the object with
		// a metadata member, and with members before it (past
		// event.MaxTopMembers, the evaluation scans on from the parse's
		// last).
		for _, pad := range []int{0, 3, 6, 9} {
			praw := withMetadata(raw, pad)
			obj, err := event.ParseObject(praw)
			if err != nil {
				continue
			}
			parsed++
			pref, err := decodeJSON(praw)
			if err != nil {
				t.Fatal(err)
			}
			for i, f := range filters {
				want, werr := f.matchValue(pref)
				got, gerr := f.MatchParsed(&obj)
				if got != want || (gerr == nil) != (werr == nil) || (gerr != nil && goType.ReplaceAllString(gerr.Error(), "T") != goType.ReplaceAllString(werr.Error(), "T")) {
					t.Fatalf("%s on %s (parsed): lazy %v, %v; decoded %v, %v", exprs[i], praw, got, gerr, want, werr)
				}
			}
		}
	}
}

// withMetadata is the JSON object raw with pad members p0, p1, ... first
// and a metadata member unless raw has one (then raw may not parse).
func withMetadata(raw []byte, pad int) []byte {
	var b strings.Builder
	b.WriteString("{")
	for k := range pad {
		fmt.Fprintf(&b, `"p%d":%d,`, k, k)
	}
	inner := strings.TrimSpace(string(raw[1 : len(raw)-1]))
	if !strings.Contains(inner, `"metadata"`) {
		b.WriteString(`"metadata":{"name":"m"}`)
		if inner != "" {
			b.WriteString(",")
		}
	}
	b.WriteString(inner)
	b.WriteString("}")
	return []byte(b.String())
}

// goType matches the Go type names in cel-go's errors (*types.baseList
// where the lazy value is *filter.jsonList).
var goType = regexp.MustCompile(`\*[a-z]+\.[A-Za-z]+`)

var keys = []string{"a", "b", "c", "l", "s", "n", "d", "a\\u0062", "\\u00e9", "metadata", "kind"}

// randomObject writes a random JSON object over a few keys (so that the
// expressions meet them often), with whitespace and escapes.
func randomObject(rng *rand.Rand, depth int) []byte {
	var b strings.Builder
	b.WriteString("{")
	seen := map[string]bool{}
	for range rng.IntN(5) {
		k := keys[rng.IntN(len(keys))]
		if seen[k] || (k == "a\\u0062" && seen["ab"]) {
			continue
		}
		seen[k] = true
		if len(seen) > 1 {
			b.WriteString(pick(rng, ",", " , ", ",\n"))
		}
		fmt.Fprintf(&b, `"%s"%s`, k, pick(rng, ":", " : "))
		b.WriteString(randomValue(rng, depth+1))
	}
	b.WriteString(pick(rng, "}", " }"))
	return []byte(b.String())
}

func randomValue(rng *rand.Rand, depth int) string {
	n := 9
	if depth > 3 {
		n = 6
	}
	switch rng.IntN(n) {
	case 0:
		return strconv.Itoa(rng.IntN(5) - 1)
	case 1:
		return pick(rng, "0.5", "1.0", "2e0", "-1.25", "0.0", "1E-2")
	case 2:
		return pick(rng, `"x"`, `"abc"`, `"é\u00e9"`, `"a\"b"`, `""`, `"B"`, `"c\\"`, `"\\\"]}"`)
	case 3:
		return pick(rng, "true", "false")
	case 4:
		return "null"
	case 5:
		return strconv.FormatInt(rng.Int64(), 10)
	case 6, 7:
		var b strings.Builder
		b.WriteString("[")
		for i := range rng.IntN(4) {
			if i > 0 {
				b.WriteString(pick(rng, ",", ", "))
			}
			b.WriteString(randomValue(rng, depth+1))
		}
		b.WriteString("]")
		return b.String()
	default:
		return string(randomObject(rng, depth))
	}
}

func pick(rng *rand.Rand, s ...string) string { return s[rng.IntN(len(s))] }

// Malformed JSON inside what the expression reads is an error; inside
// what it skips it is not seen (relayd's parser validates objects first).
func TestMalformedInput(t *testing.T) {
	for _, tc := range []struct{ raw, expr, want string }{
		{`{"l":[1,}`, `object.l.exists(e, e == 2)`, "invalid"},
		{`{"l":[1 x]}`, `object.l.exists(e, e == 2)`, "invalid"},
		{`{"a":"\x"}`, `object.a == 'x'`, "invalid JSON"},
		{`{"a":nul}`, `object.a == null`, "invalid JSON"},
		{`{"a":1,"b"}`, `object.b == 1`, "invalid JSON"},
	} {
		_, err := mustCompile(t, tc.expr).Match([]byte(tc.raw))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s on %s: %v, want an error containing %q", tc.expr, tc.raw, err, tc.want)
		}
	}
	if ok, err := mustCompile(t, `object.a == 1`).Match([]byte(`{"a":1,"b":[1 2 x]}`)); !ok || err != nil {
		t.Errorf("a malformed member the expression does not reach: %v, %v", ok, err)
	}
}

// A Filter is used by every watch of a source at once.
func TestMatchConcurrently(t *testing.T) {
	raw := readPod(t)
	f := mustCompile(t, podFilter)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for range 200 {
				if ok, err := f.Match(raw); !ok || err != nil {
					errs <- fmt.Errorf("Match: %v, %v", ok, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
