package filter

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/ast"
	"github.com/google/cel-go/common/functions"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	"github.com/google/cel-go/interpreter"
)

// The work budget of one evaluation (docs/CONFIGURATION.md, "filter"). It
// is counted in units of about a nanosecond of this package's work: the
// lazy value charges the bytes it reads or skips and the members and
// elements it visits, and every function call is charged by the size of
// its arguments (and of its result, where that can be larger) before it
// runs. Calibrated with BenchmarkWorstCase (docs/PERFORMANCE.md, "Filters
// (CEL)").
const (
	// costByte is charged per byte scanned or decoded.
	costByte = 1
	// costSkipByte is charged per byte of a container skipped.
	costSkipByte = 2
	// costVisit is charged per JSON member or array element visited.
	costVisit = 128
	// costDecode is charged per byte materialized with encoding/json
	// (equality with a map or list, conversions).
	costDecode = 24
	// costCall is charged per function call, besides its arguments.
	costCall = 32
	// costElem is charged per element of a list argument or result of a
	// function (split, extractAll, sets, sort...).
	costElem = 48
	// costRegexByte is charged per byte a regular expression reads.
	costRegexByte = 12
	// costStrByte is charged per byte of a string argument of a call
	// (copied, converted or compared).
	costStrByte = 3
	// costRuneByte is charged per byte of a string that a function
	// converts to runes first (cel-go's charAt, indexOf, lastIndexOf,
	// lowerAscii, upperAscii, substring, reverse).
	costRuneByte = 12
	// costQuantity is charged per quantity operation (arbitrary precision
	// decimals).
	costQuantity = 512
)

// budget is the runtime limit of one evaluation: how many more units of
// work it may do, and until when. Once spent (or past the deadline, which
// it checks every clockEvery units), every later charge fails: a refused
// call yields an error, and every comprehension ends at its next
// iteration (each iteration is charged: jsonList's and jsonMap's own
// iterators, meteredRange around any other range).
type budget struct {
	left     int64
	limit    int64
	exceeded bool
	// valid says the whole object was validated before the evaluation
	// (MatchParsed): no span is validated again.
	valid bool
	// The wall-clock backstop: the clock is read when left drops below
	// clockAt.
	deadline time.Time
	clockAt  int64
	timedOut bool
	// The first maps and lists an evaluation reaches come from its
	// evalState, not one allocation each.
	maps  []jsonMap
	lists []jsonList
}

// newMap is a zero jsonMap for the evaluation.
func (b *budget) newMap() *jsonMap {
	if b == nil || len(b.maps) == 0 {
		return &jsonMap{}
	}
	m := &b.maps[0]
	b.maps = b.maps[1:]
	return m
}

// newList is a zero jsonList for the evaluation.
func (b *budget) newList() *jsonList {
	if b == nil || len(b.lists) == 0 {
		return &jsonList{}
	}
	l := &b.lists[0]
	b.lists = b.lists[1:]
	return l
}

// clockEvery is how many units of work pass between two readings of the
// clock (about 50 µs of work: the backstop's resolution).
const clockEvery = 1 << 16

// init starts the budget of an evaluation.
func (b *budget) init(limit int64, d time.Duration, valid bool) {
	*b = budget{left: limit, limit: limit, valid: valid, deadline: time.Now().Add(d), clockAt: limit - clockEvery}
}

// charge spends n units; false once the budget is spent or the deadline
// passed.
func (b *budget) charge(n int64) bool {
	if b == nil {
		return true
	}
	if b.exceeded {
		return false
	}
	b.left -= n
	if b.left < 0 {
		b.exceeded = true
		return false
	}
	if b.left < b.clockAt {
		b.clockAt = b.left - clockEvery
		if time.Now().After(b.deadline) {
			b.exceeded, b.timedOut = true, true
			return false
		}
	}
	return true
}

// spent is the work done so far.
func (b *budget) spent() int64 { return b.limit - b.left }

// budgetVar is the hidden activation variable that holds the evaluation's
// budget ('@' cannot start an identifier of an expression).
const budgetVar = "@relayd.budget"

// budgetOf finds the budget of the evaluation running in act (nil when
// there is none: matchValue).
func budgetOf(act interpreter.Activation) *budget {
	v, ok := act.ResolveName(budgetVar)
	if !ok {
		return nil
	}
	b, _ := v.(*budget)
	return b
}

// callCost is the charge of a call to function with argument values
// args, before it runs.
type callCost func(args []ref.Val) int64

// valSize is a value's size in units: bytes for strings and the lazy
// values (their JSON), elements for cel-go's own lists and maps.
func valSize(v ref.Val) int64 {
	switch v := v.(type) {
	case types.String:
		return int64(len(v)) * costStrByte
	case types.Bytes:
		return int64(len(v)) * costStrByte
	case *jsonMap:
		v.trim()
		return int64(len(v.data))
	case *jsonList:
		v.trim()
		return int64(len(v.data))
	case traits.Sizer:
		if n, ok := v.Size().(types.Int); ok {
			return int64(n) * costElem
		}
	}
	return 0
}

// count is a list's number of elements (0 for anything else).
func count(v ref.Val) int64 {
	if l, ok := v.(traits.Lister); ok {
		if n, ok := l.Size().(types.Int); ok {
			return int64(n)
		}
	}
	return 0
}

func sumSizes(args []ref.Val) int64 {
	var n int64
	for _, a := range args {
		n += valSize(a)
	}
	return n
}

func strLen(args []ref.Val, i int) int64 {
	if i < len(args) {
		if s, ok := args[i].(types.String); ok {
			return int64(len(s))
		}
	}
	return 0
}

// costOf is the charge of the functions whose work is not the size of
// their arguments (nil for the others: costCall plus the sizes of the
// arguments, sumSizes).
func costOf(fn string) callCost {
	switch fn {
	case "split":
		// Results of up to one element per byte.
		return func(a []ref.Val) int64 { return sumSizes(a) + strLen(a, 0)*costElem }
	case "regex.extractAll":
		return func(a []ref.Val) int64 { return strLen(a, 0)*(costRegexByte+costElem) + strLen(a, 1)*costElem }
	case "regex.extract", "matches":
		return func(a []ref.Val) int64 { return strLen(a, 0)*costRegexByte + strLen(a, 1)*costElem }
	case "replace":
		// A replacement per byte at most: the result is bounded by
		// len(s) + (len(s)/len(old)+1) * len(new).
		return func(a []ref.Val) int64 {
			s, old, repl := strLen(a, 0), strLen(a, 1), strLen(a, 2)
			return s + (s/max(old, 1)+1)*repl
		}
	case "regex.replace":
		return func(a []ref.Val) int64 {
			s, pat, repl := strLen(a, 0), strLen(a, 1), strLen(a, 2)
			return s*costRegexByte + pat*costElem + (s+1)*repl
		}
	case "indexOf", "lastIndexOf":
		return productCost
	case "charAt", "lowerAscii", "upperAscii", "substring", "reverse":
		return func(a []ref.Val) int64 { return sumSizes(a) + strLen(a, 0)*costRuneByte }
	case "strings.quote":
		return func(a []ref.Val) int64 { return strLen(a, 0) * 6 }
	case "sets.contains", "sets.intersects":
		// Quadratic in the lists.
		return setsCost
	case "sets.equivalent":
		return func(a []ref.Val) int64 { return 2 * setsCost(a) }
	case "distinct":
		return func(a []ref.Val) int64 {
			n := count(a[0])
			return n * n * costVisit
		}
	case "sort", "@sortByAssociatedKeys":
		return sortCost
	case "lists.range":
		return func(a []ref.Val) int64 {
			if n, ok := a[0].(types.Int); ok && n > 0 {
				return int64(n) * costElem
			}
			return 0
		}
	}
	return nil
}

// productCost charges a substring search by the product of the lengths
// (cel-go's search over non-ASCII strings compares at every rune).
func productCost(a []ref.Val) int64 {
	s, sub := strLen(a, 0), strLen(a, 1)
	return s*costRuneByte + s*max(sub, 1)/8
}

func setsCost(a []ref.Val) int64 {
	if len(a) != 2 {
		return 0
	}
	return (count(a[0])*count(a[1]) + count(a[0]) + count(a[1])) * costVisit
}

func sortCost(a []ref.Val) int64 {
	n := count(a[0])
	lg := int64(1)
	for m := n; m > 1; m >>= 1 {
		lg++
	}
	return n * lg * costElem
}

// iterRanges are the ids of the ranges of the expression's comprehensions.
func iterRanges(a *cel.Ast) map[int64]bool {
	ids := map[int64]bool{}
	ast.PostOrderVisit(a.NativeRep().Expr(), ast.NewExprVisitor(func(e ast.Expr) {
		if e.Kind() == ast.ComprehensionKind {
			ids[e.AsComprehension().IterRange().ID()] = true
		}
	}))
	return ids
}

// meter is the decorator that charges the work of an evaluation that the
// lazy value does not see. Every strict function call is put behind a
// charge (meteredCall): its arguments are evaluated, its cost is charged,
// and only then does the function run; a call the budget refuses yields an
// error. Every comprehension range (ranges, by id) is charged per
// iteration (meteredRange), so that no loop outlives the budget.
// overloads are the environment's function implementations, by overload id
// and by function name, as cel-go's planner resolves them.
func meter(overloads map[string]*functions.Overload, ranges map[int64]bool) interpreter.InterpretableDecoratorV2 {
	return func(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
		i = meterCall(overloads, i)
		if ranges[i.ID()] {
			return &meteredRange{InterpretableV2: i}, nil
		}
		return i, nil
	}
}

func meterCall(overloads map[string]*functions.Overload, i interpreter.InterpretableV2) interpreter.InterpretableV2 {
	call, ok := i.(interpreter.InterpretableCall)
	if !ok {
		return i
	}
	fn, ov := call.Function(), call.OverloadID()
	m := &meteredCall{id: call.ID(), fn: fn, ov: ov, args: call.Args(), cost: costOf(fn)}
	switch fn {
	case "_==_":
		m.eq = 1
	case "_!=_":
		m.eq = 2
	default:
		var impl *functions.Overload
		if ov != "" {
			impl = overloads[ov]
		}
		if impl == nil {
			impl = overloads[fn]
		}
		if impl == nil || impl.NonStrict || impl.Async != nil {
			return i
		}
		m.impl = impl
	}
	if strings.HasPrefix(ov, "quantity") || strings.HasPrefix(ov, "string_to_quantity") || ov == "is_quantity_string" {
		m.base = costQuantity
	}
	return m
}

// meteredRange is a comprehension's range whose iterations are charged
// (jsonList and jsonMap charge their own).
type meteredRange struct {
	interpreter.InterpretableV2
}

func (r *meteredRange) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	v := r.InterpretableV2.Exec(frame)
	switch v.(type) {
	case *jsonList, *jsonMap:
		return v
	}
	it, ok := v.(traits.Iterable)
	b := budgetOf(frame)
	if !ok || b == nil {
		return v
	}
	return &chargedRange{Val: v, it: it, b: b}
}

func (r *meteredRange) Eval(act interpreter.Activation) ref.Val {
	return r.Exec(interpreter.AsFrame(act))
}

// chargedRange is a range value whose iterator charges each iteration.
type chargedRange struct {
	ref.Val
	it traits.Iterable
	b  *budget
}

func (r *chargedRange) Iterator() traits.Iterator {
	return &chargedIter{Iterator: r.it.Iterator(), b: r.b}
}

type chargedIter struct {
	traits.Iterator
	b *budget
}

func (it *chargedIter) HasNext() ref.Val {
	if !it.b.charge(costVisit) {
		return types.False
	}
	return it.Iterator.HasNext()
}

// meteredCall is a strict function call charged before it runs.
type meteredCall struct {
	id   int64
	fn   string
	ov   string
	args []interpreter.InterpretableV2
	impl *functions.Overload
	eq   int // 1: ==, 2: !=
	base int64
	cost callCost
}

func (c *meteredCall) ID() int64 { return c.id }
func (c *meteredCall) Eval(act interpreter.Activation) ref.Val {
	return c.Exec(interpreter.AsFrame(act))
}

func (c *meteredCall) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	if c.cost != nil || len(c.args) == 0 || len(c.args) > 2 {
		return c.execSlice(frame)
	}
	// One or two arguments charged by their sizes: no slice.
	var v0, v1 ref.Val
	v0 = c.args[0].Exec(frame)
	if types.IsUnknownOrError(v0) {
		return v0
	}
	n := costCall + c.base + valSize(v0)
	if len(c.args) == 2 {
		v1 = c.args[1].Exec(frame)
		if types.IsUnknownOrError(v1) {
			return v1
		}
		n += valSize(v1)
	}
	if b := budgetOf(frame); b != nil && !b.charge(n) {
		return types.NewErrWithNodeID(c.id, "%s", b.errText())
	}
	switch c.eq {
	case 1:
		return types.Equal(v0, v1)
	case 2:
		return types.Bool(types.Equal(v0, v1) != types.True)
	}
	impl := c.impl
	if impl.OperandTrait == 0 || v0.Type().HasTrait(impl.OperandTrait) {
		switch {
		case v1 == nil && impl.Unary != nil:
			return types.LabelErrNode(c.id, impl.Unary(v0))
		case v1 != nil && impl.Binary != nil:
			return types.LabelErrNode(c.id, impl.Binary(v0, v1))
		}
	}
	if v1 == nil {
		return types.LabelErrNode(c.id, c.invoke([]ref.Val{v0}))
	}
	return types.LabelErrNode(c.id, c.invoke([]ref.Val{v0, v1}))
}

// execSlice is Exec for the calls of other arities or with a cost of
// their own.
func (c *meteredCall) execSlice(frame *interpreter.ExecutionFrame) ref.Val {
	vals := make([]ref.Val, 0, len(c.args))
	for _, a := range c.args {
		v := a.Exec(frame)
		if types.IsUnknownOrError(v) {
			return v
		}
		vals = append(vals, v)
	}
	cost := c.cost
	if cost == nil {
		cost = sumSizes
	}
	if b := budgetOf(frame); b != nil && !b.charge(costCall+c.base+cost(vals)) {
		return types.NewErrWithNodeID(c.id, "%s", b.errText())
	}
	switch c.eq {
	case 1:
		return types.Equal(vals[0], vals[1])
	case 2:
		return types.Bool(types.Equal(vals[0], vals[1]) != types.True)
	}
	return types.LabelErrNode(c.id, c.invoke(vals))
}

// invoke runs the implementation as the planner's call nodes do: the
// unary, binary or general form by arity, when the first argument has
// the overload's operand trait, else the receiver's own method.
func (c *meteredCall) invoke(vals []ref.Val) ref.Val {
	impl := c.impl
	traitOK := impl.OperandTrait == 0 || (len(vals) > 0 && vals[0].Type().HasTrait(impl.OperandTrait))
	switch {
	case len(vals) == 0 && impl.Function != nil:
		return impl.Function()
	case !traitOK:
	case len(vals) == 1 && impl.Unary != nil:
		return impl.Unary(vals[0])
	case len(vals) == 2 && impl.Binary != nil:
		return impl.Binary(vals[0], vals[1])
	case impl.Function != nil:
		return impl.Function(vals...)
	}
	if len(vals) > 0 && vals[0].Type().HasTrait(traits.ReceiverType) {
		return vals[0].(traits.Receiver).Receive(c.fn, c.ov, vals[1:])
	}
	return types.NewErr("no such overload: %s", c.fn)
}

// Function, OverloadID and Args make a meteredCall an InterpretableCall, so
// that cel-go's later decorators (the regular expressions compiled once)
// still apply; Args then are the metered arguments (meteredArg).
func (c *meteredCall) Function() string   { return c.fn }
func (c *meteredCall) OverloadID() string { return c.ov }
func (c *meteredCall) Args() []interpreter.InterpretableV2 {
	out := make([]interpreter.InterpretableV2, len(c.args))
	for i, a := range c.args {
		if _, isConst := a.(interpreter.InterpretableConst); isConst {
			out[i] = a
			continue
		}
		out[i] = &meteredArg{InterpretableV2: a, first: i == 0, regex: c.fn == "matches"}
	}
	return out
}

// meteredArg charges a call's argument by itself: what remains of the
// charge of a call that cel-go rebuilt around the arguments (the regular
// expression compiled once, matches(s, constant); x in a constant list,
// looked up in a set). The first argument carries the call's own charge
// (as a regular expression's input for matches).
type meteredArg struct {
	interpreter.InterpretableV2
	first bool
	regex bool // the call is a regular expression's (matches)
}

func (a *meteredArg) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	v := a.InterpretableV2.Exec(frame)
	if types.IsUnknownOrError(v) {
		return v
	}
	n := valSize(v)
	switch {
	case a.first && a.regex:
		n = costCall + n*costRegexByte
	case a.first:
		n += costCall
	}
	if b := budgetOf(frame); b != nil && !b.charge(n) {
		return types.NewErr("%s", b.errText())
	}
	return v
}

func (a *meteredArg) Eval(act interpreter.Activation) ref.Val {
	return a.Exec(interpreter.AsFrame(act))
}

// errText is the error of an evaluation over budget.
func (b *budget) errText() string {
	if b.timedOut {
		return "evaluation interrupted: it ran past its time limit"
	}
	return fmt.Sprintf("evaluation stopped: its work exceeds the runtime limit of %d units", b.limit)
}

// err is the error value of an evaluation over budget.
func (b *budget) err() ref.Val { return types.NewErr("%s", b.errText()) }
