package filter

import (
	"context"
	"fmt"
	"strings"

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
	// costByte is charged per byte scanned, skipped or decoded.
	costByte = 1
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
	costRegexByte = 4
	// costQuantity is charged per quantity operation (arbitrary precision
	// decimals).
	costQuantity = 512
)

// budget is the runtime limit of one evaluation: how many more units of
// work it may do. Spending past it cancels the evaluation's context, which
// interrupts every comprehension (cel-go checks it every
// interruptCheckFrequency iterations), and every later charge fails.
type budget struct {
	left     int64
	limit    int64
	exceeded bool
	cancel   context.CancelFunc
	// valid says the whole object was validated before the evaluation
	// (MatchParsed): no span is validated again.
	valid bool
}

// charge spends n units; false once the budget is spent.
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
		if b.cancel != nil {
			b.cancel()
		}
		return false
	}
	return true
}

// spent is the work done so far.
func (b *budget) spent() int64 { return b.limit - b.left }

// interruptCheckFrequency is how many comprehension iterations cel-go
// runs between two checks of the evaluation's context.
const interruptCheckFrequency = 16

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
		return int64(len(v))
	case types.Bytes:
		return int64(len(v))
	case *jsonMap:
		return int64(len(v.data))
	case *jsonList:
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

// costs are the charges of the functions whose work is not the size of
// their arguments; every other call is charged costCall plus the sizes of
// its arguments (sumSizes).
var costs = map[string]callCost{
	// Results of up to one element per byte.
	"split": func(a []ref.Val) int64 { return sumSizes(a) + strLen(a, 0)*costElem },
	"regex.extractAll": func(a []ref.Val) int64 {
		return strLen(a, 0)*(costRegexByte+costElem) + strLen(a, 1)*costElem
	},
	"regex.extract": func(a []ref.Val) int64 { return strLen(a, 0)*costRegexByte + strLen(a, 1)*costElem },
	"matches":       func(a []ref.Val) int64 { return strLen(a, 0)*costRegexByte + strLen(a, 1)*costElem },
	// A replacement per byte at most: the result is bounded by
	// len(s) + (len(s)+1) * len(new).
	"replace": func(a []ref.Val) int64 {
		s, old, repl := strLen(a, 0), strLen(a, 1), strLen(a, 2)
		return s + (s/max(old, 1)+1)*repl
	},
	"regex.replace": func(a []ref.Val) int64 {
		s, pat, repl := strLen(a, 0), strLen(a, 1), strLen(a, 2)
		return s*costRegexByte + pat*costElem + (s+1)*repl
	},
	"indexOf":     productCost,
	"lastIndexOf": productCost,
	"strings.quote": func(a []ref.Val) int64 {
		return strLen(a, 0) * 6
	},
	// Quadratic in the lists.
	"sets.contains":   setsCost,
	"sets.intersects": setsCost,
	"sets.equivalent": func(a []ref.Val) int64 { return 2 * setsCost(a) },
	"distinct": func(a []ref.Val) int64 {
		n := count(a[0])
		return n * n * costVisit
	},
	"sort":                  sortCost,
	"@sortByAssociatedKeys": sortCost,
	"lists.range": func(a []ref.Val) int64 {
		if n, ok := a[0].(types.Int); ok && n > 0 {
			return int64(n) * costElem
		}
		return 0
	},
}

// productCost charges a substring search by the product of the lengths
// (cel-go's search over non-ASCII strings compares at every rune).
func productCost(a []ref.Val) int64 {
	s, sub := strLen(a, 0), strLen(a, 1)
	return s + s*max(sub, 1)/8
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

// meterCalls is the decorator that puts every strict function call behind
// a charge: the call's arguments are evaluated, its cost is charged to the
// evaluation's budget, and only then is the function run. A call the
// budget refuses yields an error. overloads are the environment's function
// implementations, by overload id and by function name, as the planner
// resolves them.
func meterCalls(overloads map[string]*functions.Overload) interpreter.InterpretableDecoratorV2 {
	return func(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
		call, ok := i.(interpreter.InterpretableCall)
		if !ok {
			return i, nil
		}
		fn, ov := call.Function(), call.OverloadID()
		m := &meteredCall{id: call.ID(), fn: fn, ov: ov, args: call.Args(), cost: costs[fn]}
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
				return i, nil
			}
			m.impl = impl
		}
		if strings.HasPrefix(fn, "quantity") || isQuantityFunc[fn] {
			m.base = costQuantity
		}
		if m.cost == nil {
			m.cost = sumSizes
		}
		return m, nil
	}
}

var isQuantityFunc = map[string]bool{
	"isQuantity": true, "isGreaterThan": true, "isLessThan": true, "compareTo": true, "add": true,
	"sub": true, "asInteger": true, "isInteger": true, "asApproximateFloat": true, "sign": true,
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
	var buf [3]ref.Val
	vals := buf[:0]
	for _, a := range c.args {
		v := a.Exec(frame)
		if types.IsUnknownOrError(v) {
			return v
		}
		vals = append(vals, v)
	}
	if b := budgetOf(frame); b != nil && !b.charge(costCall+c.base+c.cost(vals)) {
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
		out[i] = &meteredArg{InterpretableV2: a, first: i == 0, fn: c.fn, cost: c.cost}
	}
	return out
}

// meteredArg charges a call's argument by itself: what remains of the
// charge of a call that cel-go rebuilt around the arguments (the regular
// expression compiled once, matches(s, constant)). The first argument
// carries the call's own charge.
type meteredArg struct {
	interpreter.InterpretableV2
	first bool
	fn    string
	cost  callCost
}

func (a *meteredArg) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	v := a.InterpretableV2.Exec(frame)
	if types.IsUnknownOrError(v) {
		return v
	}
	n := valSize(v)
	if a.first {
		n = costCall + a.cost([]ref.Val{v})
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
	return fmt.Sprintf("evaluation stopped: its work exceeds the runtime limit of %d units", b.limit)
}

// err is the error value of an evaluation over budget.
func (b *budget) err() ref.Val { return types.NewErr("%s", b.errText()) }
