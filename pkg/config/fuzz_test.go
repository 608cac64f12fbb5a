package config

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

// FuzzParse checks that Parse never panics and always returns either a
// valid Config or a *ValidationError with well-formed problems, and that the
// diagnostic walk agrees with the yaml package's strict decoder: whenever
// the walk accepts a document, KnownFields(true) decoding accepts it too and
// yields the same values.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.yaml")
	seeds = append(seeds, "../../config.example.yaml")
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("a: &a {<<: *a}\n"))
	f.Add([]byte("sources: [&s {name: a, <<: [*s]}]\n"))
	f.Add([]byte("nats: {<<: [{url: x}, {url: y, name: z}], stream: &st {name: K}}\nx: *st\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, "f.yaml")
		if err == nil {
			if cfg == nil {
				t.Fatal("nil Config without error")
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Parse accepted a config that Validate rejects: %v", err)
			}
		} else {
			if cfg != nil {
				t.Fatal("Config returned with an error")
			}
			var ve *ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) == 0 {
				t.Fatalf("error %T %q is not a non-empty *ValidationError", err, err)
			}
			for _, p := range ve.Problems {
				if p.Message == "" || p.Source != "f.yaml" || p.Line < 0 {
					t.Fatalf("malformed problem %#v", p)
				}
			}
		}

		walked, w, problems := decodeDocument(data)
		if problems != nil || len(w.problems) > 0 {
			return
		}
		var strict Config
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&strict); err != nil {
			if strings.Contains(err.Error(), "excessive aliasing") {
				return
			}
			t.Fatalf("walk accepted the document but the strict decoder did not: %v", err)
		}
		if !reflect.DeepEqual(walked, strict) {
			t.Fatalf("walk and strict decoder disagree:\nwalk:   %#v\nstrict: %#v", walked, strict)
		}
	})
}
