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

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/checker"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/ext"
	"github.com/google/cel-go/interpreter"
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
	// DefaultMaxVisits stops one evaluation once the lazy value has
	// visited that many JSON members and array elements (each scanned past
	// or read counts; the benchmark's pod filter visits 19): Match returns
	// an error. It bounds nested loops over an object's lists far longer
	// than assumed (two nested loops over 256 entries visit 65,792) at
	// about 40 ms of a loaded 2-core machine's time. cel-go's own runtime cost
	// limit (cel.CostLimit) is not used: its tracking takes time quadratic
	// in a list's length (3.7 s for one exists() over 50,000 strings, in
	// cel-go v0.29.2 and v0.31.0), so it cannot bound anything.
	DefaultMaxVisits = 100_000
)

// Options tunes Compile; the zero value takes the defaults.
type Options struct {
	// MaxEstimatedCost overrides DefaultMaxEstimatedCost.
	MaxEstimatedCost uint64
	// MaxVisits overrides DefaultMaxVisits.
	MaxVisits int
}

// Filter is a compiled filter, safe for concurrent use.
type Filter struct {
	expr      string
	prg       cel.Program
	estimated checker.CostEstimate
	maxVisits int
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
	if opts.MaxVisits == 0 {
		opts.MaxVisits = DefaultMaxVisits
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
	prg, err := env.Program(ast, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		return nil, err
	}
	return &Filter{expr: expr, prg: prg, estimated: est, maxVisits: opts.MaxVisits}, nil
}

// String is the expression.
func (f *Filter) String() string { return f.expr }

// EstimatedCost is the checker's estimate (see AssumedSize).
func (f *Filter) EstimatedCost() (lo, hi uint64) { return f.estimated.Min, f.estimated.Max }

// Match evaluates the filter on raw, the JSON bytes of one object. Only
// the members the expression reaches are read (and checked: the rest of
// raw is not validated). An error (a missing field read without has(), a
// type mismatch, the runtime limit, raw not a JSON object) is
// returned as is; the caller decides what it means.
func (f *Filter) Match(raw []byte) (bool, error) {
	i := skipWS(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return false, errors.New("the object is not a JSON object")
	}
	end := len(raw)
	for end > i && isSpace(raw[end-1]) {
		end--
	}
	b := &budget{left: f.maxVisits}
	ok, err := f.eval(&jsonMap{span: span{data: raw[i:end], b: b}, root: true, mem: make([]member, 0, 8)})
	if b.exceeded {
		return false, fmt.Errorf("evaluation stopped after visiting %d JSON members and elements (the runtime limit)", f.maxVisits)
	}
	return ok, err
}

// matchValue evaluates the filter on an already decoded object (the
// baseline of the benchmarks and the reference of the tests).
func (f *Filter) matchValue(obj any) (bool, error) {
	return f.eval(types.DefaultTypeAdapter.NativeToValue(obj))
}

func (f *Filter) eval(obj ref.Val) (bool, error) {
	out, _, err := f.prg.Eval(activation{obj})
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("the expression yielded %s, not a bool", out.Type().TypeName())
	}
	return bool(b), nil
}

// activation binds object without a map per evaluation.
type activation struct{ object ref.Val }

func (a activation) ResolveName(name string) (any, bool) {
	if name == "object" {
		return a.object, true
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
