package config

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strings"

	yaml "go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Size is a number of bytes, written in YAML as an integer (67108864) or
// as a Kubernetes quantity string: "64Mi", "1Gi", "1.5Ki", "500M", "1e6".
// A quantity must be a whole number of bytes and not negative; a setting
// that allows -1 (nats.stream.maxBytes) takes it as an integer. Ranges
// are checked per setting by Validate. Convert with int64(s) or s.Int64().
type Size int64

// Int64 returns s as an int64.
func (s Size) Int64() int64 { return int64(s) }

// String is s as the shortest exact binary quantity ("64Mi"), or as a
// number of bytes.
func (s Size) String() string {
	if s > 0 {
		for i, unit := range []string{"Ei", "Pi", "Ti", "Gi", "Mi", "Ki"} {
			if m := int64(1) << (10 * (6 - i)); int64(s)%m == 0 {
				return fmt.Sprintf("%d%s", int64(s)/m, unit)
			}
		}
	}
	return fmt.Sprintf("%d", int64(s))
}

// sizeQuantity is the form of a quantity string Size accepts: a decimal
// number and an optional binary (Ki..Ei) or decimal (k, M..E) suffix, or
// an exponent. JSONSchema publishes it.
const sizeQuantity = `^([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[kMGTPE]|([eE][+-]?[0-9]+))?$`

var sizeQuantityRE = regexp.MustCompile(sizeQuantity)

// UnmarshalYAML parses an integer, or a string with
// resource.ParseQuantity. The error names the offending text; the decoder
// adds the key path and line.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("invalid size: expected a number of bytes or a quantity such as \"64Mi\", got %s", describeNode(n))
	}
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!int":
		var v int64
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("invalid size %s: %v", n.Value, err)
		}
		*s = Size(v)
		return nil
	}
	v, err := ParseSize(n.Value)
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// ParseSize parses a quantity string as Size.UnmarshalYAML does.
func ParseSize(text string) (Size, error) {
	bad := func(why string) error {
		return fmt.Errorf("invalid size %q: %s (use a number of bytes or a Kubernetes quantity such as \"64Mi\", \"1Gi\" or \"500M\")", text, why)
	}
	t := strings.TrimSpace(text)
	if !sizeQuantityRE.MatchString(t) {
		return 0, bad("not a quantity")
	}
	q, err := resource.ParseQuantity(t)
	if err != nil {
		return 0, bad("not a quantity")
	}
	d := q.AsDec()
	r := new(big.Rat).SetInt(d.UnscaledBig())
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(abs(int(d.Scale())))), nil)
	if d.Scale() > 0 {
		r.Quo(r, new(big.Rat).SetInt(pow))
	} else {
		r.Mul(r, new(big.Rat).SetInt(pow))
	}
	switch {
	case !r.IsInt():
		return 0, bad("not a whole number of bytes")
	case !r.Num().IsInt64() || r.Num().Int64() == math.MaxInt64: // ParseQuantity caps "9Ei" at MaxInt64
		return 0, bad("too large")
	}
	return Size(r.Num().Int64()), nil
}

func abs(n int) int {
	if n < 0 {
		return -n
	}
	return n
}

// MarshalYAML writes s as an integer.
func (s Size) MarshalYAML() (any, error) { return int64(s), nil }

// JSONSchema is the JSON Schema of a Size: an integer (-1 where the
// setting allows it), or a quantity string (pattern applies to strings
// only, minimum to numbers only).
func (Size) JSONSchema() *JSONSchema {
	minusOne := -1.0
	return &JSONSchema{
		Description: `Bytes: an integer, or a Kubernetes quantity such as "64Mi", "1Gi" or "500M".`,
		Type:        []string{"integer", "string"}, Pattern: sizeQuantity, Minimum: &minusOne,
	}
}
