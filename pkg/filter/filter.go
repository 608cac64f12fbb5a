// Package filter compiles a source's filter, a CEL expression over the
// variable object, and evaluates it on an object's JSON bytes without
// decoding them into maps (a lazy CEL value, value.go). What the
// expression may use, the cost limits and how JSON maps to CEL values are
// documented in docs/CONFIGURATION.md ("filter").
package filter

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/functions"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"

	"github.com/relayd/relayd/pkg/event"
)

// The cost limits. CEL costs are abstract units (about one per node
// evaluated, plus a tenth of a unit per byte a string function reads and
// more for regular expressions), the units of Kubernetes' validation
// rules.
const (
	// DefaultMaxEstimatedCost refuses an expression whose worst case,
	// estimated by cel-go's checker with every list, map and string of the
	// object assumed to hold at most AssumedSize entries or bytes, exceeds
	// it. It is Kubernetes' per-expression limit for validation rules: the
	// benchmark's pod filter (a label, the phase, an image regex over the
	// containers) is estimated at 54,539, two nested loops over the
	// object's lists at 394,755 (ports of containers), three nested loops
	// are refused.
	DefaultMaxEstimatedCost = 1_000_000
	// AssumedSize is the size the estimate gives every list, map and
	// string of the object: a DNS subdomain name (253 bytes) fits, and so
	// do the containers, ports and conditions of any usual object. It is
	// an assumption, not a bound: the runtime limit is the bound.
	AssumedSize = 256
	// DefaultMaxWork stops one evaluation once its work exceeds that many
	// units (budget.go: about a nanosecond each on the test machine; the
	// lazy value charges every byte it reads or skips and every member and
	// element it visits, each function call the size of its arguments, or
	// of its result where that is larger): Match returns an error. The
	// benchmark's pod filter spends about 16,000; an evaluation stopped at
	// the limit took at most 18 ms of CPU on the loaded 2-core test
	// machine (docs/PERFORMANCE.md, "Filters (CEL)"). cel-go's own runtime cost
	// limit (cel.CostLimit) is not used: its tracking takes time quadratic
	// in a list's length (3.7 s for one exists() over 50,000 strings, in
	// cel-go v0.29.2 and v0.31.0), so it cannot bound anything.
	DefaultMaxWork = 20_000_000
	// DefaultMaxEvalTime is the wall-clock backstop: an evaluation still
	// running after it is stopped and Match returns an error. The budget
	// reads the clock every clockEvery units it is charged, and every
	// loop is charged per iteration, so no loop outlives it. (cel-go's own
	// interrupt check, prg.ContextEval with a deadline, cost 8
	// allocations and a timer per evaluation and checks only
	// comprehensions: what it would interrupt is charged here anyway.)
	// The work budget stops every known case long before it (at most
	// about 20 ms of CPU). The backstop is set well above that, and above
	// the 100 ms period of the kernel's CPU quota, so that a pod whose CPU
	// limit throttles it, or a loaded node, does not turn an ordinary
	// evaluation into an error (and, through filterOnError, into a scope
	// change that depends on the machine's load instead of the object).
	DefaultMaxEvalTime = 250 * time.Millisecond
)

// Options tunes Compile; the zero value takes the defaults.
type Options struct {
	// MaxEstimatedCost overrides DefaultMaxEstimatedCost.
	MaxEstimatedCost uint64
	// MaxWork overrides DefaultMaxWork.
	MaxWork int64
	// MaxEvalTime overrides DefaultMaxEvalTime.
	MaxEvalTime time.Duration
}

// Filter is a compiled filter, safe for concurrent use.
type Filter struct {
	expr      string
	prg       cel.Program
	estimated checker.CostEstimate
	maxWork   int64
	maxTime   time.Duration
	states    *sync.Pool // of *evalState
}

// Issue is one problem in an expression, at a 1-based line and column
// (in characters) inside it.
type Issue struct {
	Line, Column int
	Message      string
}

// CompileError lists the problems of an expression that does not compile.
type CompileError struct {
	Issues []Issue
}

// Error is "line L, column C: message" for each issue ("column C" when
// the expression is one line), joined by "; ".
func (e *CompileError) Error() string {
	parts := make([]string, len(e.Issues))
	for i, is := range e.Issues {
		parts[i] = is.Position() + ": " + is.Message
	}
	return strings.Join(parts, "; ")
}

// Position is "column C", or "line L, column C" past the first line.
func (is Issue) Position() string {
	if is.Line > 1 {
		return "line " + strconv.Itoa(is.Line) + ", column " + strconv.Itoa(is.Column)
	}
	return "column " + strconv.Itoa(is.Column)
}

// CostError refuses an expression whose estimated cost exceeds the limit.
type CostError struct {
	Estimated, Limit uint64
}

func (e *CostError) Error() string {
	return fmt.Sprintf("estimated cost %d exceeds the limit %d (every list, map and string of the object assumed to hold %d entries or bytes)", e.Estimated, e.Limit, AssumedSize)
}

// newEnv is the CEL environment of filters: the variable object, the
// standard library (with matches() for RE2 regular expressions), cel-go's
// string, list, set and regex extensions and optional values (the ones
// Kubernetes includes too), Kubernetes' quantities (quantity.go), and
// heterogeneous numeric comparisons (1 < 1.5), as in Kubernetes.
func newEnv() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("object", cel.MapType(cel.StringType, cel.DynType)),
		cel.CrossTypeNumericComparisons(true),
		cel.OptionalTypes(),
		ext.Strings(ext.StringsVersion(2)),
		ext.Lists(),
		ext.Sets(),
		ext.Regex(),
		quantityLib(),
	)
}

// Compile parses and checks expr, which must yield a bool, and refuses it
// when its estimated cost exceeds the limit. The error is a *CompileError
// or a *CostError.
func Compile(expr string, opts Options) (*Filter, error) {
	if opts.MaxEstimatedCost == 0 {
		opts.MaxEstimatedCost = DefaultMaxEstimatedCost
	}
	if opts.MaxWork == 0 {
		opts.MaxWork = DefaultMaxWork
	}
	if opts.MaxEvalTime == 0 {
		opts.MaxEvalTime = DefaultMaxEvalTime
	}
	env, err := newEnv()
	if err != nil {
		return nil, err
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		ce := &CompileError{}
		for _, e := range iss.Errors() {
			ce.Issues = append(ce.Issues, Issue{Line: e.Location.Line(), Column: e.Location.Column() + 1, Message: e.Message})
		}
		return nil, ce
	}
	if t := ast.OutputType(); !t.IsExactType(types.BoolType) && !t.IsExactType(types.DynType) {
		return nil, &CompileError{Issues: []Issue{{Line: 1, Column: 1, Message: "the expression yields " + t.String() + ", not a bool"}}}
	}
	est, err := env.EstimateCost(ast, sizeEstimator{})
	if err != nil {
		return nil, err
	}
	if est.Max > opts.MaxEstimatedCost {
		return nil, &CostError{Estimated: est.Max, Limit: opts.MaxEstimatedCost}
	}
	overloads, err := bindings(env)
	if err != nil {
		return nil, err
	}
	prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize), cel.CustomDecoratorV2(meter(overloads, iterRanges(ast))))
	if err != nil {
		return nil, err
	}
	return &Filter{expr: expr, prg: prg, estimated: est, maxWork: opts.MaxWork, maxTime: opts.MaxEvalTime, states: &sync.Pool{}}, nil
}

// String is the expression.
func (f *Filter) String() string { return f.expr }

// EstimatedCost is the checker's estimate (see AssumedSize).
func (f *Filter) EstimatedCost() (lo, hi uint64) { return f.estimated.Min, f.estimated.Max }

// Match evaluates the filter on raw, the JSON bytes of one object. Only
// the members the expression reaches are read (and checked: the rest of
// raw is not validated). An error (a missing field read without has(), a
// type mismatch, the runtime limits, raw not a JSON object) is returned as
// is; the caller decides what it means.
func (f *Filter) Match(raw []byte) (bool, error) {
	ok, _, err := f.match(raw, false)
	return ok, err
}

// MatchParsed is Match on an object that pkg/event's parse (ParseObject,
// ParseWatchEvent and their Shaped variants) produced: its Raw was
// validated in full by that parse, so the evaluation validates nothing
// again and skips what it does not read without checking it.
func (f *Filter) MatchParsed(obj *event.Object) (bool, error) {
	ok, _, err := f.eval(obj.Raw, true, obj)
	return ok, err
}

// match evaluates the filter on raw (validated when valid) and returns the
// work spent too.
func (f *Filter) match(raw []byte, valid bool) (bool, int64, error) {
	return f.eval(raw, valid, nil)
}

// eval is match, on the members of the object that the parse found when
// obj (the parse's object of raw) is not nil.
func (f *Filter) eval(raw []byte, valid bool, obj *event.Object) (bool, int64, error) {
	i := skipWS(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return false, 0, errors.New("the object is not a JSON object")
	}
	end := len(raw)
	for end > i && isSpace(raw[end-1]) {
		end--
	}
	st, _ := f.states.Get().(*evalState)
	if st == nil {
		st = new(evalState)
	}
	defer f.release(st)
	b := &st.b
	b.init(f.maxWork, f.maxTime, valid)
	b.maps, b.lists = st.maps[:], st.lists[:]
	root := &st.root
	*root = jsonMap{span: span{data: raw[i:end], ok: valid, b: b}, root: true, mem: st.mem[:0], tail: st.tail[:0]}
	if obj != nil {
		if err := root.fromParse(obj, i); err != nil {
			return false, b.spent(), err
		}
	}
	st.act = activation{root, b}
	out, _, err := f.prg.Eval(&st.act)
	if b.exceeded {
		return false, b.spent(), errors.New(b.errText())
	}
	ok, err := result(out, err)
	return ok, b.spent(), err
}

// evalState is what one evaluation needs up front: the budget, the
// object, its first members and the first maps and lists it reaches.
// The filter's evaluations reuse them (Filter.states): nothing of an
// evaluation outlives it (its result is a bool or an error).
type evalState struct {
	b     budget
	act   activation
	root  jsonMap
	mem   [8]member
	tail  [4]member
	maps  [8]jsonMap
	lists [4]jsonList
}

// release clears st (dropping what it references) for the next
// evaluation.
func (f *Filter) release(st *evalState) {
	*st = evalState{}
	f.states.Put(st)
}

// matchValue evaluates the filter on an already decoded object (the
// baseline of the benchmarks and the reference of the tests).
func (f *Filter) matchValue(obj any) (bool, error) {
	out, _, err := f.prg.Eval(activation{object: types.DefaultTypeAdapter.NativeToValue(obj)})
	return result(out, err)
}

func result(out ref.Val, err error) (bool, error) {
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("the expression yielded %s, not a bool", out.Type().TypeName())
	}
	return bool(b), nil
}

// bindings are env's function implementations by overload id and by
// function name (the dynamic dispatch of a function with several
// overloads), as cel-go's planner finds them.
func bindings(env *cel.Env) (map[string]*functions.Overload, error) {
	out := map[string]*functions.Overload{}
	for _, fn := range env.Functions() {
		ovs, err := fn.Bindings()
		if err != nil {
			return nil, err
		}
		for _, o := range ovs {
			out[o.Operator] = o
		}
	}
	return out, nil
}

// activation binds object, and the budget (budgetVar), without a map per
// evaluation.
type activation struct {
	object ref.Val
	b      *budget
}

func (a activation) ResolveName(name string) (any, bool) {
	switch {
	case name == "object":
		return a.object, true
	case name == budgetVar && a.b != nil:
		return a.b, true
	}
	return nil, false
}

func (activation) Parent() interpreter.Activation { return nil }

// sizeEstimator gives every list, map and string whose size cel-go cannot
// compute from the expression itself (those of the object, and results such
// as type()) AssumedSize entries or bytes.
type sizeEstimator struct{}

func (sizeEstimator) EstimateSize(checker.AstNode) *checker.SizeEstimate {
	return &checker.SizeEstimate{Min: 0, Max: AssumedSize}
}

func (sizeEstimator) EstimateCallCost(string, string, *checker.AstNode, []checker.AstNode) *checker.CallEstimate {
	return nil
}
