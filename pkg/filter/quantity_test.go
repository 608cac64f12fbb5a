package filter

import (
	"strings"
	"testing"
)

func TestQuantities(t *testing.T) {
	raw := []byte(`{"spec":{"containers":[{"resources":{"limits":{"cpu":"500m","memory":"1Gi"}}},{"resources":{"limits":{"cpu":"2"}}}]}}`)
	for expr, want := range map[string]bool{
		`object.spec.containers.exists(c, quantity(c.resources.limits.cpu).isGreaterThan(quantity('1')))`:                                          true,
		`object.spec.containers.all(c, quantity(c.resources.limits.cpu).isLessThan(quantity('4')))`:                                                true,
		`quantity(object.spec.containers[0].resources.limits.memory).asInteger() == 1073741824`:                                                    true,
		`quantity(object.spec.containers[0].resources.limits.cpu) == quantity('0.5')`:                                                              true,
		`quantity('500m').compareTo(quantity('1')) == -1`:                                                                                          true,
		`quantity('1').add(quantity('500m')).add(1) == quantity('2500m')`:                                                                          true,
		`quantity('1').sub(2).sign() == -1`:                                                                                                        true,
		`quantity('500m').isInteger()`:                                                                                                             false,
		`quantity('1.5').asApproximateFloat() == 1.5`:                                                                                              true,
		`isQuantity(object.spec.containers[0].resources.limits.cpu) && !isQuantity('five')`:                                                        true,
		`object.spec.containers.exists(c, has(c.resources.limits.memory) && quantity(c.resources.limits.memory).isGreaterThan(quantity('512Mi')))`: true,
	} {
		got, err := mustCompile(t, expr).Match(raw)
		if err != nil || got != want {
			t.Errorf("%s = %v, %v; want %v", expr, got, err, want)
		}
	}
	for expr, want := range map[string]string{
		`quantity('five').sign() == 1`:      "quantities must match the regular expression",
		`quantity('500m').asInteger() == 0`: "cannot convert quantity 500m to an integer",
	} {
		if _, err := mustCompile(t, expr).Match(raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one containing %q", expr, err, want)
		}
	}
	if _, err := Compile(`quantity(1) == quantity('1')`, Options{}); err == nil || !strings.Contains(err.Error(), "found no matching overload for 'quantity' applied to '(int)'") {
		t.Errorf("quantity(int): %v", err)
	}
}
