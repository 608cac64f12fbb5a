package config

import (
	"fmt"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in YAML with Go syntax ("500ms",
// "30s", "5m", "1h30m"). A bare number is rejected (it has no unit), except
// 0. Convert with time.Duration(d) or d.Duration().
type Duration time.Duration

// Duration returns d as a time.Duration.
func (d Duration) Duration() time.Duration { return time.Duration(d) }

// String formats d like time.Duration.String without trailing zero units:
// "5m" rather than "5m0s", "1h" rather than "1h0m0s".
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// UnmarshalYAML parses a scalar with time.ParseDuration. The error names
// the offending text, e.g. `invalid duration "5 minutes"`; the decoder adds
// the key path and line.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("invalid duration: expected a string such as \"30s\", got %s", describeNode(n))
	}
	if n.ShortTag() == "!!null" {
		return nil
	}
	v, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil {
		return fmt.Errorf("invalid duration %q (use Go syntax such as \"30s\", \"5m\" or \"1h30m\")", n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes d as its String form.
func (d Duration) MarshalYAML() (any, error) {
	return d.String(), nil
}
