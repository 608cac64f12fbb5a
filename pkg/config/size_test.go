package config

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

func TestSize(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want int64
		str  string
		err  string
	}{
		{in: "67108864", want: 64 << 20, str: "64Mi"},
		{in: "64Mi", want: 64 << 20, str: "64Mi"},
		{in: "'1Gi'", want: 1 << 30, str: "1Gi"},
		{in: "1.5Ki", want: 1536, str: "1536"},
		{in: "500M", want: 500_000_000, str: "500000000"},
		{in: "1e6", want: 1_000_000, str: "1000000"},
		{in: "1k", want: 1000, str: "1000"},
		{in: "-1", want: -1, str: "-1"},
		{in: "0x100000", want: 1 << 20, str: "1Mi"},
		{in: "64MB", err: `invalid size "64MB": not a quantity (use a number of bytes or a Kubernetes quantity such as "64Mi", "1Gi" or "500M")`},
		{in: "0.5", err: `invalid size "0.5": not a whole number of bytes (use a number of bytes or a Kubernetes quantity such as "64Mi", "1Gi" or "500M")`},
		{in: "1000m", err: `invalid size "1000m": not a quantity (use a number of bytes or a Kubernetes quantity such as "64Mi", "1Gi" or "500M")`},
		{in: "'-1Mi'", err: `invalid size "-1Mi": not a quantity (use a number of bytes or a Kubernetes quantity such as "64Mi", "1Gi" or "500M")`},
		{in: "9Ei", err: `invalid size "9Ei": too large (use a number of bytes or a Kubernetes quantity such as "64Mi", "1Gi" or "500M")`},
		{in: "1.5", err: `invalid size "1.5": not a whole number of bytes (use a number of bytes or a Kubernetes quantity such as "64Mi", "1Gi" or "500M")`},
		{in: "[1]", err: `invalid size: expected a number of bytes or a quantity such as "64Mi", got a list`},
	} {
		var s Size
		err := yaml.Unmarshal([]byte(tt.in), &s)
		if tt.err != "" {
			if err == nil || err.Error() != tt.err {
				t.Errorf("%q: err = %v, want %s", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || s.Int64() != tt.want || s.String() != tt.str {
			t.Errorf("%q: got %d (%q), %v; want %d (%q)", tt.in, s.Int64(), s.String(), err, tt.want, tt.str)
		}
		out, err := yaml.Marshal(s)
		if err != nil || strings.TrimSpace(string(out)) != fmt.Sprint(tt.want) {
			t.Errorf("%q: Marshal = %q, %v", tt.in, out, err)
		}
	}
}

// Every size setting takes a quantity; a bad one is reported with its key
// path and line, as any bad value is.
func TestSizeSettings(t *testing.T) {
	doc := `cluster: dev
sources: [{name: cms, apiVersion: v1, kind: ConfigMap}]
nats:
  url: nats://nats:4222
  maxInFlightBytes: 1Gi
  maxInFlightBytesPerWatch: 64Mi
  stream: {name: K8S, maxBytes: 10Gi}
watch: {maxObjectBytes: 32Mi}
`
	cfg, err := Parse([]byte(doc), "x")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.MaxInFlightBytes != 1<<30 || cfg.NATS.MaxInFlightBytesPerWatch != 64<<20 || cfg.NATS.Stream.MaxBytes != 10<<30 || cfg.Watch.MaxObjectBytes != 32<<20 {
		t.Errorf("got %d %d %d %d", cfg.NATS.MaxInFlightBytes, cfg.NATS.MaxInFlightBytesPerWatch, cfg.NATS.Stream.MaxBytes, cfg.Watch.MaxObjectBytes)
	}
	bad := strings.Replace(doc, "maxObjectBytes: 32Mi", "maxObjectBytes: 32MB", 1)
	bad = strings.Replace(bad, "maxInFlightBytesPerWatch: 64Mi", "maxInFlightBytesPerWatch: 512Ki", 1)
	_, err = Parse([]byte(bad), "x")
	want := `x:8: watch.maxObjectBytes: invalid size "32MB": not a quantity (use a number of bytes or a Kubernetes quantity such as "64Mi", "1Gi" or "500M")` + "\n" +
		`x:6: nats.maxInFlightBytesPerWatch: must be between 1048576 (1Mi) and 1099511627776 (1Ti), got 524288 (512Ki)`
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

// The pattern of Size's JSON Schema accepts what the decoder accepts, and
// refuses what it refuses (Duration's: TestSchemaFormatsAreValidates's
// duration cases).
func TestSizePatternAgreesWithTheDecoder(t *testing.T) {
	sizeRE := regexp.MustCompile(Size(0).JSONSchema().Pattern)
	for _, s := range []string{"64Mi", "1Gi", "1.5Ki", "500M", "1e6", "1k", "10", ".5Ki", "64MB", "0.5", "1000m", "-1Mi", "1 Gi", "Mi", "1.5", "1E3", "2Ti"} {
		_, err := ParseSize(s)
		// The pattern cannot know about whole bytes or overflow.
		decodable := err == nil || strings.Contains(err.Error(), "whole number") || strings.Contains(err.Error(), "too large")
		if sizeRE.MatchString(s) != decodable {
			t.Errorf("size %q: pattern matches %v, ParseSize: %v", s, sizeRE.MatchString(s), err)
		}
	}
}
