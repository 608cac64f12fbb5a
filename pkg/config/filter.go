package config

import (
	"errors"
	"slices"
	"strings"
	"unicode/utf8"

	yaml "go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/pkg/filter"
)

// FilterOnError says what a filter's evaluation error means for the object
// (Source.FilterOnError).
type FilterOnError string

// The values of Source.FilterOnError; empty means include.
const (
	// FilterOnErrorInclude treats the object as in scope (fail open).
	FilterOnErrorInclude FilterOnError = "include"
	// FilterOnErrorExclude treats the object as out of scope.
	FilterOnErrorExclude FilterOnError = "exclude"
)

// filterOnErrors are the valid values of Source.FilterOnError.
var filterOnErrors = []FilterOnError{FilterOnErrorInclude, FilterOnErrorExclude}

// JSONSchema describes a FilterOnError: one of filterOnErrors.
func (FilterOnError) JSONSchema() *JSONSchema { return enumSchema(filterOnErrors) }

// exprPos is a 1-based line and column inside a filter expression.
type exprPos struct{ line, col int }

// filter compiles the filter of source p (pkg/filter), reporting each
// compile issue at its place in the expression and an over-cost
// expression.
func (v *validator) filter(p string, s *Source) {
	fp := p + ".filter"
	if s.FilterOnError != "" && !slices.Contains(filterOnErrors, s.FilterOnError) {
		v.add(p+".filterOnError", "%q is not a valid value (must be %s)", s.FilterOnError, orList(filterOnErrors))
	} else if s.FilterOnError != "" && s.Filter == "" {
		v.add(p+".filterOnError", "has no effect without filter")
	}
	if s.Filter == "" {
		return
	}
	_, err := filter.Compile(s.Filter, filter.Options{})
	var ce *filter.CompileError
	var cost *filter.CostError
	switch {
	case errors.As(err, &ce):
		for _, is := range ce.Issues {
			msg := strings.TrimSuffix(is.Message, " (in container '')")
			v.problems = append(v.problems, Problem{Path: fp, Message: "invalid expression at " + is.Position() + ": " + msg,
				in: &exprPos{line: is.Line, col: is.Column}})
		}
	case errors.As(err, &cost):
		v.add(fp, "refused: %v", cost)
	case err != nil:
		v.add(fp, "%v", err)
	}
}

// placeExpr maps the position in of the expression at path to the file:
// the line and column of that character when the expression's line up to
// it appears verbatim in the file (the first line of a plain or quoted
// scalar, a line of a literal block scalar "|"); else the line only (the
// expression's line in a literal block, the value's first line otherwise)
// with column 0. A Config built in Go has no file: 0, 0.
func (o *origin) placeExpr(path string, in exprPos) (line, col int) {
	n := o.scalars[path]
	if n == nil {
		return 0, 0
	}
	exprLines := strings.Split(n.Value, "\n")
	if in.line < 1 || in.line > len(exprLines) {
		return n.Line, 0
	}
	if last := len(exprLines); in.line == last && last > 1 && exprLines[last-1] == "" {
		// The end of an expression ending in a newline (a block
		// scalar): the end of its last line.
		in = exprPos{line: last - 1, col: utf8.RuneCountInString(exprLines[last-2]) + 1}
	}
	fileLine, start := n.Line, 0
	switch n.Style {
	case 0:
		if in.line == 1 {
			start = n.Column
		}
	case yaml.SingleQuotedStyle, yaml.DoubleQuotedStyle:
		if in.line == 1 {
			start = n.Column + 1
		}
	case yaml.LiteralStyle:
		// The block's indentation is its first non-blank line's.
		fileLine = n.Line + in.line
		for l := n.Line + 1; l <= fileLine; l++ {
			if t := o.fileLine(l); strings.TrimSpace(t) != "" {
				start = len(t) - len(strings.TrimLeft(t, " ")) + 1
				break
			}
		}
	}
	if start == 0 {
		return fileLine, 0
	}
	text := o.fileLine(fileLine)
	// Columns count characters, in the file as in the expression.
	// What precedes the position must be in the file verbatim (no escape
	// in a quoted scalar, no folding).
	rest, ok := dropRunes(text, start-1)
	before := []rune(exprLines[in.line-1])
	before = before[:min(len(before), max(in.col-1, 0))]
	if !ok || !strings.HasPrefix(rest, string(before)) {
		return fileLine, 0
	}
	return fileLine, start + in.col - 1
}

// fileLine is the 1-based line n of the file, "" past its end.
func (o *origin) fileLine(n int) string {
	lines := strings.Split(string(o.text), "\n")
	if n < 1 || n > len(lines) {
		return ""
	}
	return strings.TrimSuffix(lines[n-1], "\r")
}

// dropRunes is s without its first n characters.
func dropRunes(s string, n int) (string, bool) {
	for ; n > 0; n-- {
		if s == "" {
			return "", false
		}
		_, size := utf8.DecodeRuneInString(s)
		s = s[size:]
	}
	return s, true
}
