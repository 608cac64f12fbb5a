package filter

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/pkg/event"
)

// noClock leaves the wall-clock backstop out of a test: what stops an
// evaluation is the work budget alone, which does not depend on the
// machine's load.
const noClock = time.Hour

func compileNoClock(t testing.TB, expr string) *Filter {
	t.Helper()
	f, err := Compile(expr, Options{MaxEvalTime: noClock})
	if err != nil {
		t.Fatalf("Compile(%q): %v", expr, err)
	}
	return f
}

// bigString is {"s": n bytes of c}.
func bigString(n int, c byte) []byte {
	return []byte(`{"s":"` + strings.Repeat(string(c), n) + `"}`)
}

// bigList is {"l": [1,1,...]} of about n bytes.
func bigList(n int) []byte {
	return []byte(`{"l":[1` + strings.Repeat(",1", n/2) + `]}`)
}

// podTemplate is a PodTemplate of n containers of about 1 KB each, none
// with a securityContext.
func podTemplate(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"kind":"PodTemplate","metadata":{"name":"t"},"template":{"metadata":{"labels":{"app":"x"}},"spec":{"containers":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"c%d","image":"registry.example.com/app:%d","env":[`, i, i)
		for j := range 20 {
			if j > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"name":"VAR_%d","value":"value-%d-%s"}`, j, j, strings.Repeat("x", 20))
		}
		b.WriteString(`]}`)
	}
	b.WriteString(`]}}}`)
	return []byte(b.String())
}

// TestWorkBound: what an estimated-cheap expression does on an object far
// larger than assumed is charged by the bytes and elements it touches, and
// stops with the budget's error; what is linear in the object stays
// within the budget.
func TestWorkBound(t *testing.T) {
	const mb = 1 << 20
	budgetErr := fmt.Sprintf("evaluation stopped: its work exceeds the runtime limit of %d units", DefaultMaxWork)
	for _, tc := range []struct {
		name, expr string
		raw        []byte
		want       bool   // when err is ""
		err        string // "": no error
		maxWork    int64  // at most this much work (linear in the object's bytes)
	}{
		{"the containers' securityContext, the template's looked up again in each", `object.template.spec.containers.all(c, has(c.securityContext) || has(object.template.spec.securityContext))`,
			podTemplate(1000), false, "", 16 * 1_200_000},
		{"a missing key of the template's spec, looked up in each", `object.template.spec.containers.all(c, c.name.startsWith('c') && !has(object.template.spec.nope))`,
			podTemplate(1000), true, "", 16 * 1_200_000},
		{"split('') on 2.5 MB", `object.s.split('').size() > 0`, bigString(5*mb/2, 'a'), false, budgetErr, DefaultMaxWork},
		{"regex.extractAll on 2.5 MB", `regex.extractAll(object.s, 'a').size() > 0`, bigString(5*mb/2, 'a'), false, budgetErr, DefaultMaxWork},
		{"replace('', s) on 2.5 MB", `object.s.replace('', object.s).size() > 0`, bigString(5*mb/2, 'a'), false, budgetErr, DefaultMaxWork},
		{"== on a 2.5 MB list", `object.l == object.l`, bigList(5 * mb / 2), false, budgetErr, DefaultMaxWork},
		{"sets.contains on a 2.5 MB list", `sets.contains(object.l, object.l)`, bigList(5 * mb / 2), false, budgetErr, DefaultMaxWork},
		{"distinct() on a 2.5 MB list", `object.l.distinct().size() > 0`, bigList(5 * mb / 2), false, budgetErr, DefaultMaxWork},
		{"a loop over a 2.5 MB list", `object.l.exists(a, a == 2)`, bigList(5 * mb / 2), false, budgetErr, DefaultMaxWork},
		{"a key absent from 20 MB of nested lists", `has(object.y)`, []byte(`{"a":[` + strings.Repeat(`[],`, 7*mb) + `[]],"z":1}`), false, budgetErr, DefaultMaxWork},
		{"nested loops over the keys of a map of 100,000", `object.m.exists(k, object.m.exists(j, false))`, worstObject(2, 100_000, "k"), false, budgetErr, DefaultMaxWork},
		{"isQuantity('1e-100000000')", `isQuantity(object.s)`, []byte(`{"s":"1e-100000000"}`), false, "", 10_000},
		{"quantity('1e-900000000')", `quantity(object.s).sign() == 1`, []byte(`{"s":"1e-900000000"}`), false, "its exponent is not within ±100", 10_000},
		{"isQuantity of 1 MB of 9s", `isQuantity(object.s)`, bigString(mb, '9'), false, "", 8 * mb},
		{"quantity('1e100')", `quantity(object.s).sign() == 1`, []byte(`{"s":"1e100"}`), true, "", 10_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := Compile(tc.expr, Options{MaxEvalTime: noClock})
			if err != nil {
				t.Fatal(err)
			}
			for _, valid := range []bool{false, true} {
				got, spent, err := f.match(tc.raw, valid)
				switch {
				case tc.err == "" && (err != nil || got != tc.want):
					t.Errorf("valid %v: %v, %v; want %v", valid, got, err, tc.want)
				case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
					t.Errorf("valid %v: error %v, want %q", valid, err, tc.err)
				}
				// A call is refused before it runs: the overshoot is
				// what the refused charge asked for, not work done.
				if tc.err != budgetErr && spent > tc.maxWork {
					t.Errorf("valid %v: work %d, want at most %d", valid, spent, tc.maxWork)
				}
			}
		})
	}
}

// TestEvalTimeBackstop: with a budget too large to stop it, a long
// evaluation is interrupted by the wall clock.
func TestEvalTimeBackstop(t *testing.T) {
	f, err := Compile(`object.l.exists(a, object.l.exists(b, a != b && false))`, Options{MaxEstimatedCost: 1 << 62, MaxWork: 1 << 50, MaxEvalTime: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := f.Match(bigList(1 << 20)); err == nil || err.Error() != "evaluation interrupted: it ran past its time limit" {
		t.Fatalf("Match: %v, %v; want the interruption", ok, err)
	}
}

// TestSkipContainer: the container skip ends where pkg/event's
// validating one does, escapes at every position of strings on both sides
// of the in-line part's 32 bytes.
func TestSkipContainer(t *testing.T) {
	for n := range 80 {
		for _, esc := range []string{`\"`, `\\`, `\u0022`, `\\\"`} {
			for at := 0; at <= n; at += 7 {
				str := strings.Repeat("a", at) + esc + strings.Repeat("b", n-at)
				data := []byte(`{"k":["` + str + `",{"x":"` + str + `]}"}],"z":"` + esc + `"}`)
				want, err := event.SkipValue(data, 0)
				if err != nil {
					t.Fatalf("%s: %v", data, err)
				}
				b := &budget{left: 1 << 40, limit: 1 << 40, valid: true}
				got, err := skipContainer(b, data, 0, len(data))
				if err != nil || got != want {
					t.Fatalf("%s: skipContainer %d, %v; want %d", data, got, err, want)
				}
			}
		}
	}
}

// TestParsedMembersNotSkipped: on the watch's path (MatchParsed) the
// object's own members are those the parse found, so the work does not
// grow with the members before the one looked up (1 MB here), as it does
// on the validated path without them; and a loop over a list of maps
// that stops at an element reads no element after it (1 MB).
func TestParsedMembersNotSkipped(t *testing.T) {
	const mb = 1 << 20
	big := `"` + strings.Repeat("x", mb) + `"`
	raw := []byte(`{"metadata":{"name":"m"},"a":1,"big":` + big + `,"spec":{"containers":[{"image":"r/x"},{"image":"r/y","pad":` + big + `}]},"z":true}`)
	obj, err := event.ParseObject(raw)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		expr    string
		skipped bool // the validated path without the parse's members skips 1 MB
	}{
		{`object.a == 1 && object.z`, true},
		{`object.spec.containers.exists(c, c.image == 'r/x')`, false},
	} {
		f := compileNoClock(t, tc.expr)
		ok, spent, err := f.eval(raw, true, &obj)
		if !ok || err != nil {
			t.Fatalf("%s: %v, %v", tc.expr, ok, err)
		}
		if spent > 10_000 {
			t.Errorf("%s on the parse's members: %d units of work, want at most 10,000", tc.expr, spent)
		}
		if _, without, _ := f.match(raw, true); tc.skipped && without < mb {
			t.Errorf("%s validated, without the parse's members: %d units, expected the skip (test premise)", tc.expr, without)
		}
	}
}
