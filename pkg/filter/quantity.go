package filter

import (
	"fmt"
	"math"
	"reflect"
	"strconv"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Quantities, as Kubernetes' CEL quantity library has them (the same
// function names and meanings), over k8s.io/apimachinery's
// resource.Quantity:
//
//	quantity('500m'), isQuantity(s), q.isGreaterThan(r), q.isLessThan(r),
//	q.compareTo(r), q.add(r or int), q.sub(r or int), q.asInteger(),
//	q.isInteger(), q.asApproximateFloat(), q.sign(), q == r (by value).

// quantityType is the CEL type of a quantity.
var quantityType = cel.ObjectType("kubernetes.Quantity")

// quantityVal is a resource.Quantity as a CEL value.
type quantityVal struct{ q resource.Quantity }

func (v quantityVal) ConvertToNative(t reflect.Type) (any, error) {
	switch {
	case reflect.TypeOf(v.q).AssignableTo(t):
		return v.q, nil
	case reflect.TypeOf("").AssignableTo(t):
		return v.q.String(), nil
	}
	return nil, fmt.Errorf("type conversion error from 'Quantity' to '%v'", t)
}

func (v quantityVal) ConvertToType(t ref.Type) ref.Val {
	switch t {
	case quantityType:
		return v
	case types.TypeType:
		return quantityType
	case types.StringType:
		return types.String(v.q.String())
	}
	return types.NewErr("type conversion error from '%s' to '%s'", quantityType, t)
}

func (v quantityVal) Equal(other ref.Val) ref.Val {
	o, ok := other.(quantityVal)
	if !ok {
		return types.False
	}
	return types.Bool(v.q.Equal(o.q))
}

func (v quantityVal) Type() ref.Type { return quantityType }
func (v quantityVal) Value() any     { return v.q }

// quantityLib declares the functions.
func quantityLib() cel.EnvOption {
	q, str, i := quantityType, cel.StringType, cel.IntType
	member := func(name, id string, args []*cel.Type, out *cel.Type, f func(quantityVal, ref.Val) ref.Val) cel.EnvOption {
		return cel.Function(name, cel.MemberOverload(id, args, out, cel.BinaryBinding(func(a, b ref.Val) ref.Val {
			return f(a.(quantityVal), b)
		})))
	}
	unary := func(name, id string, out *cel.Type, f func(quantityVal) ref.Val) cel.EnvOption {
		return cel.Function(name, cel.MemberOverload(id, []*cel.Type{q}, out, cel.UnaryBinding(func(a ref.Val) ref.Val {
			return f(a.(quantityVal))
		})))
	}
	return cel.Lib(libOptions{
		cel.Types(q),
		cel.Function("quantity", cel.Overload("string_to_quantity", []*cel.Type{str}, q, cel.UnaryBinding(func(s ref.Val) ref.Val {
			v, err := parseQuantity(string(s.(types.String)))
			if err != nil {
				return types.WrapErr(err)
			}
			return quantityVal{v}
		}))),
		cel.Function("isQuantity", cel.Overload("is_quantity_string", []*cel.Type{str}, cel.BoolType, cel.UnaryBinding(func(s ref.Val) ref.Val {
			_, err := parseQuantity(string(s.(types.String)))
			return types.Bool(err == nil)
		}))),
		member("isGreaterThan", "quantity_is_greater_than", []*cel.Type{q, q}, cel.BoolType, func(a quantityVal, b ref.Val) ref.Val {
			return types.Bool(a.q.Cmp(b.(quantityVal).q) > 0)
		}),
		member("isLessThan", "quantity_is_less_than", []*cel.Type{q, q}, cel.BoolType, func(a quantityVal, b ref.Val) ref.Val {
			return types.Bool(a.q.Cmp(b.(quantityVal).q) < 0)
		}),
		member("compareTo", "quantity_compare_to", []*cel.Type{q, q}, i, func(a quantityVal, b ref.Val) ref.Val {
			return types.Int(a.q.Cmp(b.(quantityVal).q))
		}),
		cel.Function("add",
			cel.MemberOverload("quantity_add", []*cel.Type{q, q}, q, cel.BinaryBinding(func(a, b ref.Val) ref.Val { return addQ(a, b, 1) })),
			cel.MemberOverload("quantity_add_int", []*cel.Type{q, i}, q, cel.BinaryBinding(func(a, b ref.Val) ref.Val { return addQ(a, b, 1) }))),
		cel.Function("sub",
			cel.MemberOverload("quantity_sub", []*cel.Type{q, q}, q, cel.BinaryBinding(func(a, b ref.Val) ref.Val { return addQ(a, b, -1) })),
			cel.MemberOverload("quantity_sub_int", []*cel.Type{q, i}, q, cel.BinaryBinding(func(a, b ref.Val) ref.Val { return addQ(a, b, -1) }))),
		unary("asInteger", "quantity_get_int", i, func(a quantityVal) ref.Val {
			n, ok := a.q.AsInt64()
			if !ok {
				return types.NewErr("cannot convert quantity %s to an integer without loss of precision or overflow", a.q.String())
			}
			return types.Int(n)
		}),
		unary("isInteger", "quantity_is_integer", cel.BoolType, func(a quantityVal) ref.Val {
			_, ok := a.q.AsInt64()
			return types.Bool(ok)
		}),
		unary("asApproximateFloat", "quantity_get_float", cel.DoubleType, func(a quantityVal) ref.Val {
			return types.Double(a.q.AsApproximateFloat64())
		}),
		unary("sign", "quantity_sign", i, func(a quantityVal) ref.Val { return types.Int(a.q.Sign()) }),
	})
}

// The bounds of a quantity the functions parse: resource.ParseQuantity's
// work grows with the digits and with the exponent (1e-100000000 took
// 73 s and 349 MB), and no quantity Kubernetes writes comes near either.
const (
	maxQuantityBytes    = 64
	maxQuantityExponent = 100
)

// parseQuantity is resource.ParseQuantity of s, refused first when s is
// longer than maxQuantityBytes or its decimal exponent (1e3, 5E-2) exceeds
// maxQuantityExponent either way: quantity() then fails and isQuantity()
// is false, as for any other string that is not a quantity.
func parseQuantity(s string) (resource.Quantity, error) {
	if len(s) > maxQuantityBytes {
		return resource.Quantity{}, fmt.Errorf("quantity of %d bytes: a quantity has at most %d", len(s), maxQuantityBytes)
	}
	// The suffix follows the number: [+-]digits[.digits].
	i := 0
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	if suf := s[i:]; len(suf) > 1 && (suf[0] == 'e' || suf[0] == 'E') && suf != "Ei" {
		exp := suf[1:]
		if exp[0] == '+' || exp[0] == '-' {
			exp = exp[1:]
		}
		for len(exp) > 1 && exp[0] == '0' {
			exp = exp[1:]
		}
		if n, err := strconv.Atoi(exp); err != nil || n > maxQuantityExponent || len(exp) > 3 {
			return resource.Quantity{}, fmt.Errorf("quantity %s: its exponent is not within ±%d", s, maxQuantityExponent)
		}
	}
	return resource.ParseQuantity(s)
}

// addQ is a + sign*b, b a quantity or an int.
func addQ(a, b ref.Val, sign int64) ref.Val {
	sum := a.(quantityVal).q.DeepCopy()
	var d resource.Quantity
	switch b := b.(type) {
	case quantityVal:
		d = b.q.DeepCopy()
	case types.Int:
		if b == math.MinInt64 {
			return types.NewErr("quantity: integer overflow")
		}
		d = *resource.NewQuantity(int64(b), resource.DecimalSI)
	default:
		return types.MaybeNoSuchOverloadErr(b)
	}
	if sign < 0 {
		d.Neg()
	}
	sum.Add(d)
	return quantityVal{sum}
}

// libOptions is a cel.Library of fixed compile options.
type libOptions []cel.EnvOption

func (l libOptions) CompileOptions() []cel.EnvOption   { return l }
func (libOptions) ProgramOptions() []cel.ProgramOption { return nil }
