package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Load reads the configuration file at path, parses and validates it like
// Parse, and then fills environment-dependent defaults with
// ResolveDefaults(os.Getenv, os.ReadFile). Problems with the file are
// returned as a *ValidationError; a file that cannot be read returns the
// error from os.ReadFile.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg, err := Parse(data, path)
	if err != nil {
		return nil, err
	}
	if err := cfg.ResolveDefaults(os.Getenv, os.ReadFile); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Parse decodes one YAML document strictly, applies defaults and validates
// the result. source names the data in problems (usually the file path).
// Parse does not consult the environment, so checkpoint.namespace stays
// empty unless set; see ResolveDefaults.
//
// Every problem found is returned at once in a *ValidationError: syntax
// errors, unknown and duplicate keys and values of the wrong type (all
// found in one pass over the document), then every validation problem
// except those that merely follow from a value that could not be decoded.
func Parse(data []byte, source string) (*Config, error) {
	// One decode: the walk (decode.go) is the decoder. FuzzParse checks
	// that whatever it accepts, the yaml package's strict decoder accepts
	// too, with the same values.
	cfg, w, problems := decodeDocument(data)
	if problems != nil {
		return nil, withSource(problems, source)
	}
	cfg.origin = &origin{source: source, lines: w.lines, scalars: w.scalars, text: data}
	cfg.ApplyDefaults()
	problems = w.problems
	for _, p := range cfg.problems() {
		if !w.causedBy(p.Path) {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return nil, withSource(problems, source)
	}
	return &cfg, nil
}

// decodeDocument parses data into a node tree and walks it into a Config.
// problems is non-nil when the document could not be walked at all (syntax
// error, empty file, several documents); the walker's own problems are in
// w.problems.
func decodeDocument(data []byte) (cfg Config, w *walker, problems []Problem) {
	w = newWalker()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return cfg, w, []Problem{{Message: "empty configuration file"}}
		}
		return cfg, w, yamlProblems(err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return cfg, w, yamlProblems(err)
	default:
		return cfg, w, []Problem{{Line: extra.Line, Message: "a second YAML document starts here; the file must hold exactly one"}}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || isNull(doc.Content[0]) {
		return cfg, w, []Problem{{Message: "empty configuration file"}}
	}
	w.walk(doc.Content[0], reflect.ValueOf(&cfg).Elem(), "")
	return cfg, w, nil
}

// causedBy reports whether a validation problem at path follows from a
// value at or above path that could not be decoded.
func (w *walker) causedBy(path string) bool {
	for _, f := range w.failed {
		if f == "" || path == f || strings.HasPrefix(path, f+".") || strings.HasPrefix(path, f+"[") {
			return true
		}
	}
	return false
}

// yamlProblems turns an error of the yaml package into problems, moving
// its "line N:" into Problem.Line.
func yamlProblems(err error) []Problem {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		ps := make([]Problem, 0, len(te.Errors))
		for _, e := range te.Errors {
			ps = append(ps, lineProblem(e, ""))
		}
		return ps
	}
	// yaml.v3 gives a syntax error as text only ("yaml: line N: …",
	// fmt.Errorf; TypeError's items are strings too): its "yaml: " prefix
	// and "line N:" are read from the text, as no type carries them.
	return []Problem{lineProblem(strings.TrimPrefix(err.Error(), "yaml: "), "invalid YAML: ")}
}

func lineProblem(msg, prefix string) Problem {
	var p Problem
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, after, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				p.Line, msg = n, after
			}
		}
	}
	p.Message = prefix + msg
	return p
}

func withSource(ps []Problem, source string) *ValidationError {
	for i := range ps {
		ps[i].Source = source
	}
	return &ValidationError{Problems: ps}
}

// CheckFiles parses and validates each file (without consulting the
// environment, see Parse) and reports to w, for `relayd check-config`:
//
//	Checking config.yaml
//	  SUCCESS
//	  WARNING: config.yaml:9: nats.allowPlaintextCredentials: "nats://nats:4222" is not TLS, …
//	Checking bad.yaml
//	  FAILED:
//	    bad.yaml:3: nats.url: required
//	    bad.yaml: sources: at least one source is required
//
// It returns false if any file failed (the command then exits 1).
func CheckFiles(w io.Writer, paths ...string) bool {
	return Check(w, nil, paths...)
}

// StdinName is the path that names standard input in Check, and the
// source its problems name.
const StdinName = "-"

// Check is CheckFiles where the path "-" (StdinName) reads the config from
// stdin (`relayd check-config -c -`); its problems name it "<stdin>".
func Check(w io.Writer, stdin io.Reader, paths ...string) bool {
	ok := true
	for _, path := range paths {
		cfg, err := checkFile(path, stdin)
		if path == StdinName {
			path = stdinSource
		}
		fmt.Fprintf(w, "Checking %s\n", path)
		if err == nil {
			fmt.Fprintln(w, "  SUCCESS")
			for _, p := range cfg.Warnings() {
				fmt.Fprintf(w, "  WARNING: %s\n", p.Error())
			}
			continue
		}
		ok = false
		fmt.Fprintln(w, "  FAILED:")
		for _, l := range ProblemLines(err) {
			fmt.Fprintf(w, "    %s\n", l)
		}
	}
	return ok
}

// ProblemLines is err as lines: one per problem of a *ValidationError
// ("source:line: path: message"), else the lines of its message.
func ProblemLines(err error) []string {
	var ve *ValidationError
	if errors.As(err, &ve) {
		lines := make([]string, 0, len(ve.Problems))
		for _, p := range ve.Problems {
			lines = append(lines, p.Error())
		}
		return lines
	}
	return strings.Split(err.Error(), "\n")
}

const stdinSource = "<stdin>"

func checkFile(path string, stdin io.Reader) (*Config, error) {
	if path == StdinName {
		if stdin == nil {
			return nil, errors.New("no standard input to read the config from")
		}
		data, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("reading standard input: %w", err)
		}
		return Parse(data, stdinSource)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path)
}
