package filter

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"

	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"

	"github.com/relayd/relayd/pkg/event"
)

// The lazy CEL value over an object's JSON bytes (docs/CONFIGURATION.md,
// "filter"). A jsonMap or jsonList holds the bytes of one JSON object or
// array and decodes a member only when the expression reaches it: selecting
// object.status.phase skips the other members of the object and of status
// with the scanner (pkg/event), and decodes only the phase string.
//
// JSON values become CEL values as follows: a string is a string, true and
// false are bools, null is null, an object is a map with string keys, an
// array is a list, and a number written without a fraction or exponent
// that fits in 64 bits is an int, any other number a double (so
// object.spec.replicas is an int, as it is in Kubernetes' typed CEL).
// Duplicate keys are not expected in the apiserver's JSON: the first
// occurrence is the one Find returns, except for a key of the object
// itself other than apiVersion, kind and metadata when the object was
// validated (MatchParsed), looked up from the end: the last.

// span is the bytes of one JSON value, validated when ok is true, and the
// budget of the evaluation reading it (budget.go).
type span struct {
	data []byte
	ok   bool
	b    *budget
	// open: data runs on past the value to the end of the object (a
	// member of the object found without skipping it, jsonMap.find); the
	// readers stop at the value's closing bracket, trim finds it for the
	// others.
	open bool
}

// trim cuts an open span at the end of its value.
func (s *span) trim() {
	if !s.open {
		return
	}
	if end, err := skipMember(s.b, s.data, 0); err == nil {
		s.data, s.open = s.data[:end], false
	}
}

var errBudget = errors.New("budget exceeded")

// check validates the whole span once; members returned by the scanner
// are valid already.
func (s *span) check() error {
	if s.ok || s.b.valid {
		s.ok = true
		return nil
	}
	if !s.b.charge(int64(len(s.data)) * costByte) {
		return errBudget
	}
	end, err := event.SkipValue(s.data, 0)
	if err != nil {
		return err
	}
	if skipWS(s.data, end) != len(s.data) {
		return fmt.Errorf("invalid JSON at offset %d: data after the value", end)
	}
	s.ok = true
	return nil
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func skipWS(data []byte, i int) int {
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	return i
}

// valueAt converts the JSON value data[i:end] to a CEL value. checked says
// the span was validated (always, below MatchParsed); if not (a member
// skipped by skipMember), a scalar is validated here, and a list or map
// when it is scanned. A string is charged its bytes.
func valueAt(b *budget, data []byte, i, end int, checked bool) ref.Val {
	checked = checked || b.valid
	switch data[i] {
	case '{':
		m := b.newMap()
		m.span = span{data: data[i:end], ok: checked, b: b}
		return m
	case '[':
		l := b.newList()
		l.span = span{data: data[i:end], ok: checked, b: b}
		return l
	}
	if !checked {
		if !b.charge(int64(end - i)) {
			return b.err()
		}
		if e, err := event.SkipValue(data[:end], i); err != nil || e != end {
			return types.NewErr("invalid JSON at offset %d", i)
		}
	}
	switch data[i] {
	case '"':
		if !b.charge(int64(end-i) * costByte) {
			return b.err()
		}
		return types.String(unquote(data[i:end]))
	case 't':
		return types.True
	case 'f':
		return types.False
	case 'n':
		return types.NullValue
	}
	return number(data[i:end])
}

// skipMember returns the end of the JSON value starting at data[i] without
// validating it: strings are skipped with bytes.IndexByte (vectorized),
// containers by counting brackets outside strings, scalars up to the next
// delimiter. Skipping the members an expression does not reach this way
// is about twice as fast as validating them; what is read is validated
// (valueAt, and the scans of maps and lists). The bytes skipped are
// charged to b, and a container is not read past what b has left.
func skipMember(b *budget, data []byte, i int) (int, error) {
	if i >= len(data) {
		return 0, fmt.Errorf("truncated JSON at offset %d", len(data))
	}
	start := i
	switch data[i] {
	case '"':
		end, err := skipString(data, i)
		if err == nil && !b.charge(int64(end-start)*costByte) {
			return 0, errBudget
		}
		return end, err
	case '{', '[':
		stop := len(data)
		if b != nil && int64(stop-i)*costSkipByte > b.left {
			stop = i + int(max(b.left, 0)/costSkipByte)
		}
		return skipContainer(b, data, start, stop)
	}
	j := i
	for j < len(data) && !isDelim(data[j]) {
		j++
	}
	if j == i {
		return 0, fmt.Errorf("invalid JSON at offset %d: expected a value", i)
	}
	return j, nil
}

// skipContainer is skipMember of the container at data[start], read no
// further than stop and charged costSkipByte per byte: brackets are
// counted outside strings, and strings skipped with bytes.IndexByte (an
// in-line loop over a string's first bytes was slower on the pod of
// BenchmarkFilterPod: 7.3 µs against 5.3 µs).
func skipContainer(b *budget, data []byte, start, stop int) (int, error) {
	depth := 0
	for i := start; i < stop; {
		switch data[i] {
		case '"':
			end, err := skipString(data, i)
			if err != nil {
				return 0, err
			}
			i = end
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth--; depth == 0 {
				if !b.charge(int64(i+1-start) * costSkipByte) {
					return 0, errBudget
				}
				return i + 1, nil
			}
		}
		i++
	}
	if stop < len(data) {
		b.charge(max(b.left, 0) + 1) // what is left would not reach the end
		return 0, errBudget
	}
	return 0, fmt.Errorf("truncated JSON at offset %d", len(data))
}

// skipElement is skipMember below a validated span, else the validating
// event.SkipValue (charged its bytes).
func (s *span) skipElement(i int) (int, error) {
	if s.ok || s.b.valid {
		return skipMember(s.b, s.data, i)
	}
	end, err := event.SkipValue(s.data, i)
	if err == nil && !s.b.charge(int64(end-i)*costByte) {
		return 0, errBudget
	}
	return end, err
}

func isDelim(c byte) bool { return c == ',' || c == '}' || c == ']' || isSpace(c) }

// skipString returns the offset past the string starting at data[i] == '"'.
func skipString(data []byte, i int) (int, error) {
	start := i + 1
	for i = start; ; {
		k := bytes.IndexByte(data[i:], '"')
		if k < 0 {
			return 0, fmt.Errorf("truncated JSON at offset %d", len(data))
		}
		j := i + k
		n := 0
		for p := j - 1; p >= start && data[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return j + 1, nil
		}
		i = j + 1
	}
}

// unquote decodes the validated JSON string s (with its quotes).
func unquote(s []byte) string {
	in := s[1 : len(s)-1]
	for _, c := range in {
		if c == '\\' || c >= 0x80 {
			return string(event.AppendUnquoted(make([]byte, 0, len(in)), in))
		}
	}
	return string(in)
}

// number is an int for an integer literal that fits in int64, else a
// double.
func number(s []byte) ref.Val {
	integral := true
	for _, c := range s {
		if c == '.' || c == 'e' || c == 'E' {
			integral = false
			break
		}
	}
	if integral {
		if n, err := strconv.ParseInt(string(s), 10, 64); err == nil {
			return types.Int(n)
		}
	}
	f, err := strconv.ParseFloat(string(s), 64)
	if err != nil {
		// Out of range: encoding/json refuses it too.
		return types.NewErr("number %s: %v", s, err)
	}
	return types.Double(f)
}

// keyEquals reports whether the JSON string data[i:end] (validated, plain
// when plain) decodes to key.
func keyEquals(data []byte, i, end int, plain bool, key string) bool {
	raw := data[i+1 : end-1]
	if plain {
		return string(raw) == key
	}
	return unquote(data[i:end]) == key
}

// elements calls f with the span [v, vend) of each element of the array
// (validated up to the elements visited, each charged); f returns false to
// stop.
func (s *span) elements(f func(v, vend int) bool) error {
	data := s.data
	i := skipWS(data, 1)
	if i < len(data) && data[i] == ']' {
		return nil
	}
	for i < len(data) {
		if !s.b.charge(costVisit) {
			return errBudget
		}
		vend, err := s.skipElement(i)
		if err != nil {
			return err
		}
		if !f(i, vend) {
			return nil
		}
		i = skipWS(data, vend)
		if i < len(data) && data[i] == ',' {
			i = skipWS(data, i+1)
			continue
		}
		if i < len(data) && data[i] == ']' {
			return nil
		}
		return fmt.Errorf("invalid JSON at offset %d: expected ',' or ']'", i)
	}
	return fmt.Errorf("truncated JSON at offset %d", len(data))
}

// materialize decodes the whole span into a CEL value of cel-go's own
// types, for the operations that need all of it anyway (equality,
// conversion, list concatenation), charged costDecode per byte first.
func (s *span) materialize() ref.Val {
	s.trim()
	if !s.b.charge(int64(len(s.data)) * costDecode) {
		return s.b.err()
	}
	if err := s.check(); err != nil {
		return types.WrapErr(err)
	}
	v, err := decodeJSON(s.data)
	if err != nil {
		return types.WrapErr(err)
	}
	return types.DefaultTypeAdapter.NativeToValue(v)
}

// decodeJSON decodes data with encoding/json, numbers as valueAt reads
// them: the reference the lazy value is tested against, and the decoder of
// materialize.
func decodeJSON(data []byte) (any, error) {
	var v any
	if err := unmarshalNumbers(data, &v); err != nil {
		return nil, err
	}
	return convertNumbers(v)
}

func convertNumbers(v any) (any, error) {
	var err error
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if x[k], err = convertNumbers(e); err != nil {
				return nil, err
			}
		}
	case []any:
		for i, e := range x {
			if x[i], err = convertNumbers(e); err != nil {
				return nil, err
			}
		}
	case json.Number:
		switch n := number([]byte(x)).(type) {
		case types.Int:
			return int64(n), nil
		case types.Double:
			return float64(n), nil
		case *types.Err:
			return nil, n
		}
	}
	return v, nil
}

// jsonMap is a JSON object as a CEL map. A map looked up more than once
// (the object itself always) remembers the members it has scanned and the
// values it has decoded, so that the next lookup resumes where the last
// stopped and finds what it already read without reading it again
// (object.spec.template inside a loop over the containers reads the
// template once per evaluation); past indexAfter members it indexes their
// keys. A map looked up once scans from its start and allocates nothing.
// Values a map decodes are cached in it (member.val), so a map reached
// again through its parent is the same jsonMap, with its scan.
type jsonMap struct {
	span
	root   bool
	looked bool // looked up once: the next lookup records the members
	mem    []member
	next   int  // where the next member of mem starts; 0: not started
	done   bool // every member is in mem
	index  map[string]int
	// The object itself, validated (MatchParsed), looks the keys that
	// follow metadata up from its end (findBack): tail holds the members
	// read that way, last first, tailAt the key offset of the earliest.
	tail     []member
	tailAt   int
	tailDone bool // no member is left between mem and tail
}

// indexAfter is the number of members past which a map that has recorded
// all of them indexes their keys.
const indexAfter = 16

// member is the key span [k, kend) and the value span [v, vend) of a
// member; plain when the key decodes to itself; val the value, once
// decoded.
type member struct {
	k, kend, v, vend int
	plain            bool
	val              ref.Val
}

var _ traits.Mapper = (*jsonMap)(nil)

// first is the offset of the first member, or -1 for an empty object.
func (m *jsonMap) first() int {
	if i := skipWS(m.data, 1); i >= len(m.data) || m.data[i] != '}' {
		return i
	}
	return -1
}

// fromParse fills the object's mem (m is the root, m.data its bytes from
// offset at in obj.Raw) with the members obj's parse found: the
// evaluation then skips none of them to find another. Each is charged as
// a member visited. Past event.MaxTopMembers the scan goes on from the
// next member's key, as after a forward scan of the first ones.
func (m *jsonMap) fromParse(obj *event.Object, at int) error {
	n, next := obj.TopMembers()
	data := m.data
	if n == 0 || n > cap(m.mem) {
		return nil
	}
	mem := m.mem[:0]
	for j := range n {
		k, vend := obj.TopMember(j)
		k, vend = k-at, vend-at
		if k <= 0 || vend > len(data) || k >= vend || data[k] != '"' {
			return nil // not the parse of these bytes: scan them instead
		}
		e, err := m.scanHead(k)
		if err != nil {
			return err
		}
		e.vend = vend
		mem = append(mem, e)
	}
	m.mem = mem
	if next == 0 {
		m.next, m.done = -1, true
	} else if next -= at; next > 0 && next < len(data) && data[next] == '"' {
		m.next = next
	} else {
		m.mem, m.next = m.mem[:0], 0
	}
	return nil
}

// scan reads the member at i; next is the offset of the following one, or
// -1 after the last.
func (m *jsonMap) scan(i int) (e member, next int, err error) {
	if e, err = m.scanHead(i); err != nil {
		return e, 0, err
	}
	next, err = m.scanTail(&e)
	return e, next, err
}

// scanHead reads the key at i and where its value starts (e.vend -1).
func (m *jsonMap) scanHead(i int) (e member, err error) {
	data := m.data
	if !m.b.charge(costVisit) {
		return e, errBudget
	}
	if i >= len(data) || data[i] != '"' {
		return e, fmt.Errorf("invalid JSON at offset %d: expected an object key", i)
	}
	kend, plain, err := event.ScanString(data, i)
	if err != nil {
		return e, err
	}
	if !m.b.charge(int64(kend-i) * costByte) {
		return e, errBudget
	}
	v := skipWS(data, kend)
	if v >= len(data) || data[v] != ':' {
		return e, fmt.Errorf("invalid JSON at offset %d: expected ':'", v)
	}
	return member{k: i, kend: kend, v: skipWS(data, v+1), vend: -1, plain: plain}, nil
}

// scanTail skips e's value (setting e.vend) and returns the offset of the
// next member's key, or -1 after the last.
func (m *jsonMap) scanTail(e *member) (next int, err error) {
	data := m.data
	vend, err := skipMember(m.b, data, e.v)
	if err != nil {
		return 0, err
	}
	e.vend = vend
	i := skipWS(data, vend)
	switch {
	case i < len(data) && data[i] == ',':
		return skipWS(data, i+1), nil
	case i < len(data) && data[i] == '}':
		return -1, nil
	}
	return 0, fmt.Errorf("invalid JSON at offset %d: expected ',' or '}'", i)
}

func isContainer(c byte) bool { return c == '{' || c == '[' }

// openValue is the value of member e, a map or list of a validated
// object, found without skipping it: its span reads on to the end of m
// (an open span), and e.val keeps it.
func (m *jsonMap) openValue(e *member) ref.Val {
	v := valueAt(m.b, m.data, e.v, len(m.data)-1, true)
	switch x := v.(type) {
	case *jsonMap:
		x.open = true
	case *jsonList:
		x.open = true
	}
	e.val = v
	return v
}

// openNext is m.next while the last member of mem was found without
// skipping its value (find): its end, and so the next member, unknown.
const openNext = -2

// resolveOpen skips the value of the open member (the last of mem) when
// the forward scan goes on past it.
func (m *jsonMap) resolveOpen() error {
	if m.next != openNext {
		return nil
	}
	next, err := m.scanTail(&m.mem[len(m.mem)-1])
	if err != nil {
		return err
	}
	m.next = next
	if next < 0 {
		m.done = true
	}
	return nil
}

// recording reports whether this pass records the members (the root, or
// a map looked up before), and marks the map as looked up.
func (m *jsonMap) recording() bool {
	rec := m.root || m.looked
	m.looked = true
	return rec
}

// each calls f with the index in mem of each member (or -1 and the member
// when not recording) until f returns false: from mem, then scanning.
func (m *jsonMap) each(f func(j int, e *member) bool) error {
	if !m.recording() {
		for i := m.first(); i >= 0; {
			e, next, err := m.scan(i)
			if err != nil {
				return err
			}
			if !f(-1, &e) {
				return nil
			}
			i = next
		}
		return nil
	}
	for j := range m.mem {
		if !f(j, &m.mem[j]) {
			return nil
		}
	}
	if err := m.resolveOpen(); err != nil {
		return err
	}
	i := m.next
	if i == 0 {
		i = m.first()
	}
	for !m.done && i >= 0 {
		if m.reachedTail(i) {
			for j := len(m.mem) - len(m.tail); j < len(m.mem); j++ {
				if !f(j, &m.mem[j]) {
					return nil
				}
			}
			break
		}
		e, next, err := m.scan(i)
		if err != nil {
			return err
		}
		m.mem = append(m.mem, e)
		m.next = next
		i = next
		if !f(len(m.mem)-1, &m.mem[len(m.mem)-1]) {
			return nil
		}
	}
	m.done = true
	return nil
}

// reachedTail reports whether the forward scan, at the key at i, has
// reached the members findBack read; it then appends them to mem (in
// their order) and the map is done: f still has to see them (each).
func (m *jsonMap) reachedTail(i int) bool {
	if len(m.tail) == 0 || i < m.tailAt {
		return false
	}
	for j := len(m.tail) - 1; j >= 0; j-- {
		m.mem = append(m.mem, m.tail[j])
	}
	m.done = true
	return true
}

// value decodes member e (at j in mem, or -1), once.
func (m *jsonMap) value(j int, e *member) ref.Val {
	if j < 0 {
		return valueAt(m.b, m.data, e.v, e.vend, false)
	}
	if e.val == nil {
		e.val = valueAt(m.b, m.data, e.v, e.vend, false)
	}
	return e.val
}

// key is the decoded key of e.
func (m *jsonMap) key(e *member) string {
	if e.plain {
		return string(m.data[e.k+1 : e.kend-1])
	}
	return unquote(m.data[e.k:e.kend])
}

// Find looks key up; a key that is not a string is looked up in the
// materialized map, for cel-go's own answer.
func (m *jsonMap) Find(key ref.Val) (ref.Val, bool) {
	k, ok := key.(types.String)
	if !ok {
		if full, ok := m.materialize().(traits.Mapper); ok {
			return full.Find(key)
		}
		return m.materialize(), false
	}
	if m.index == nil && len(m.mem) > indexAfter && m.looked {
		// Looked up again past indexAfter members: record the rest and
		// index them all (every later lookup is one map access).
		if err := m.each(func(int, *member) bool { return true }); err != nil {
			return types.WrapErr(err), false
		}
		m.buildIndex()
	}
	if m.index != nil {
		j, ok := m.index[string(k)]
		if !ok {
			return nil, false
		}
		return m.value(j, &m.mem[j]), true
	}
	v, err := m.find(string(k))
	if err != nil {
		return types.WrapErr(err), false
	}
	return v, v != nil
}

// find is each (written out: no closure, nothing escapes) looking for key.
func (m *jsonMap) find(key string) (ref.Val, error) {
	if !m.recording() {
		return m.findOnce(key)
	}
	// At most indexAfter members here (Find indexes past that).
	if !m.b.charge(int64(len(m.mem)) * costByte * 4) {
		return nil, errBudget
	}
	if m.root && m.b.valid && key != "metadata" && key != "apiVersion" && key != "kind" {
		return m.findLast(key)
	}
	for j := range m.mem {
		if e := &m.mem[j]; keyEquals(m.data, e.k, e.kend, e.plain, key) {
			return m.value(j, e), nil
		}
	}
	if err := m.resolveOpen(); err != nil {
		return nil, err
	}
	i := m.next
	if i == 0 {
		i = m.first()
	}
	for !m.done && i >= 0 {
		if m.reachedTail(i) {
			for j := len(m.mem) - len(m.tail); j < len(m.mem); j++ {
				if e := &m.mem[j]; keyEquals(m.data, e.k, e.kend, e.plain, key) {
					return m.value(j, e), nil
				}
			}
			return nil, nil
		}
		e, err := m.scanHead(i)
		if err != nil {
			return nil, err
		}
		found := keyEquals(m.data, e.k, e.kend, e.plain, key)
		if found && m.b.valid && isContainer(m.data[e.v]) {
			v := m.openValue(&e)
			m.mem = append(m.mem, e)
			m.next = openNext
			return v, nil
		}
		next, err := m.scanTail(&e)
		if err != nil {
			return nil, err
		}
		m.mem = append(m.mem, e)
		m.next = next
		i = next
		if found {
			j := len(m.mem) - 1
			return m.value(j, &m.mem[j]), nil
		}
	}
	m.done = true
	return nil, nil
}

// findOnce scans for key without recording the members passed: a map
// looked up once.
func (m *jsonMap) findOnce(key string) (ref.Val, error) {
	for i := m.first(); i >= 0; {
		e, err := m.scanHead(i)
		if err != nil {
			return nil, err
		}
		found := keyEquals(m.data, e.k, e.kend, e.plain, key)
		if found && m.b.valid && isContainer(m.data[e.v]) {
			return m.openValue(&e), nil
		}
		next, err := m.scanTail(&e)
		if err != nil {
			return nil, err
		}
		if found {
			return valueAt(m.b, m.data, e.v, e.vend, false), nil
		}
		i = next
	}
	return nil, nil
}

// findLast finds the last occurrence of key in the root object (validated):
// from the end, then back through mem.
func (m *jsonMap) findLast(key string) (ref.Val, error) {
	if !m.done {
		if v, err := m.findBack(key); v != nil || err != nil {
			return v, err
		}
	}
	for j := len(m.mem) - 1; j >= 0; j-- {
		if e := &m.mem[j]; keyEquals(m.data, e.k, e.kend, e.plain, key) {
			return m.value(j, e), nil
		}
	}
	return nil, nil
}

// findBack looks key up from the end of the object (validated): what
// follows metadata in a Kubernetes object (spec, status, data) is nearer
// its end, and metadata (with its managedFields) the largest member to
// skip. The members read join tail; once the scan meets the members mem
// holds, every member is known.
func (m *jsonMap) findBack(key string) (ref.Val, error) {
	for j := range m.tail {
		if e := &m.tail[j]; keyEquals(m.data, e.k, e.kend, e.plain, key) {
			return m.tailValue(j), nil
		}
	}
	for !m.tailDone {
		e, ok, err := m.scanBack()
		if err != nil {
			return nil, err
		}
		if !ok {
			m.tailDone = true
			break
		}
		m.tail = append(m.tail, e)
		m.tailAt = e.k
		if keyEquals(m.data, e.k, e.kend, e.plain, key) {
			return m.tailValue(len(m.tail) - 1), nil
		}
	}
	// Every member is in mem or tail, and key in neither.
	return nil, nil
}

func (m *jsonMap) tailValue(j int) ref.Val {
	e := &m.tail[j]
	if e.val == nil {
		e.val = valueAt(m.b, m.data, e.v, e.vend, true)
	}
	return e.val
}

// scanBack reads the member before tailAt (the last one at first); ok
// false when there is none left that mem does not hold.
func (m *jsonMap) scanBack() (e member, ok bool, err error) {
	data := m.data
	var j int
	if len(m.tail) == 0 {
		j = skipWSBack(data, len(data)-2) // before the closing brace
	} else {
		j = skipWSBack(data, m.tailAt-1)
		if j < 0 || data[j] != ',' {
			return e, false, nil // the first member
		}
		j = skipWSBack(data, j-1)
	}
	if j < 0 || data[j] == '{' {
		return e, false, nil // empty
	}
	if m.done || m.next > 0 && j < m.next {
		return e, false, nil // mem holds it
	}
	if m.next == openNext && j < m.mem[len(m.mem)-1].v {
		return e, false, nil // the open member's value ends here or later
	}
	if !m.b.charge(costVisit) {
		return e, false, errBudget
	}
	lo := 0
	if left := m.b.left / costSkipByte; int64(j) > left {
		lo = j - int(left)
	}
	v, err := skipBack(data, j, lo)
	if err != nil {
		m.b.charge(max(m.b.left, 0) + 1)
		return e, false, err
	}
	if !m.b.charge(int64(j+1-v) * costSkipByte) {
		return e, false, errBudget
	}
	c := skipWSBack(data, v-1)
	q := skipWSBack(data, c-1)
	if c < 0 || data[c] != ':' || q < 0 || data[q] != '"' {
		return e, false, fmt.Errorf("invalid JSON at offset %d: expected a key and ':'", v)
	}
	k := stringStartBack(data, q)
	kend, plain, err := event.ScanString(data, k)
	if err != nil || kend != q+1 {
		return e, false, fmt.Errorf("invalid JSON at offset %d: expected an object key", k)
	}
	if m.next == openNext {
		if last := &m.mem[len(m.mem)-1]; k <= last.k {
			// The open member: now its end is known.
			last.vend = j + 1
			m.next = m.tailAt
			if len(m.tail) == 0 {
				m.next, m.done = -1, true
			}
			return e, false, nil
		}
	}
	return member{k: k, kend: kend, v: v, vend: j + 1, plain: plain}, true, nil
}

func skipWSBack(data []byte, i int) int {
	for i >= 0 && isSpace(data[i]) {
		i--
	}
	return i
}

// stringStartBack is the offset of the opening quote of the string whose
// closing quote is data[q], in valid JSON: the nearest quote before it
// that an even number of backslashes precedes (inside a string every
// quote is escaped).
func stringStartBack(data []byte, q int) int {
	p := q
	for {
		p = bytes.LastIndexByte(data[:p], '"')
		if p < 0 {
			return 0
		}
		n := 0
		for b := p - 1; b >= 0 && data[b] == '\\'; b-- {
			n++
		}
		if n%2 == 0 {
			return p
		}
	}
}

// skipBack is the offset where the value ending at data[j] (valid JSON)
// starts; not read below lo (errBudget).
func skipBack(data []byte, j, lo int) (int, error) {
	switch data[j] {
	case '"':
		return stringStartBack(data, j), nil
	case '}', ']':
		depth := 0
		for i := j; i >= lo; i-- {
			switch data[i] {
			case '"':
				i = stringStartBack(data, i)
			case '}', ']':
				depth++
			case '{', '[':
				if depth--; depth == 0 {
					return i, nil
				}
			}
		}
		return 0, errBudget
	}
	i := j
	for i > 0 && !isDelim(data[i-1]) && data[i-1] != ':' {
		i--
	}
	return i, nil
}

// buildIndex indexes the keys of a map whose members are all recorded
// (the first of duplicate keys wins, as in Find).
func (m *jsonMap) buildIndex() {
	if !m.b.charge(int64(len(m.mem)) * costVisit) {
		m.index = map[string]int{}
		return
	}
	m.index = make(map[string]int, len(m.mem))
	for j := range m.mem {
		k := m.key(&m.mem[j])
		if _, dup := m.index[k]; !dup {
			m.index[k] = j
		}
	}
}

func (m *jsonMap) Get(key ref.Val) ref.Val {
	v, found := m.Find(key)
	if !found {
		return types.ValOrErr(v, "no such key: %v", key)
	}
	return v
}

func (m *jsonMap) Contains(key ref.Val) ref.Val {
	v, found := m.Find(key)
	if !found && v != nil && types.IsError(v) {
		return v
	}
	return types.Bool(found)
}

func (m *jsonMap) Size() ref.Val {
	if err := m.check(); err != nil {
		return types.WrapErr(err)
	}
	if m.done {
		return types.Int(len(m.mem))
	}
	n := 0
	if err := m.each(func(int, *member) bool { n++; return true }); err != nil {
		return types.WrapErr(err)
	}
	return types.Int(n)
}

func (m *jsonMap) IsZeroValue() bool { return m.Size() == types.Int(0) }

// Iterator iterates over the keys; over none when the evaluation is over
// budget (Match reports it).
func (m *jsonMap) Iterator() traits.Iterator {
	if err := m.check(); err != nil {
		return &sliceIter{vals: []ref.Val{types.WrapErr(err)}}
	}
	var keys []ref.Val
	err := m.each(func(_ int, e *member) bool {
		if !m.b.charge(int64(e.kend-e.k) * costByte) {
			return false
		}
		keys = append(keys, types.String(m.key(e)))
		return true
	})
	if err != nil || m.b.exceeded {
		keys = nil
	}
	return &sliceIter{vals: keys, b: m.b}
}

func (m *jsonMap) Equal(other ref.Val) ref.Val { return m.materialize().Equal(other) }
func (m *jsonMap) Type() ref.Type              { return types.MapType }
func (m *jsonMap) Value() any                  { return m.materialize().Value() }
func (m *jsonMap) ConvertToType(t ref.Type) ref.Val {
	if t == types.MapType {
		return m
	}
	return m.materialize().ConvertToType(t)
}
func (m *jsonMap) ConvertToNative(t reflect.Type) (any, error) {
	return m.materialize().ConvertToNative(t)
}

// jsonList is a JSON array as a CEL list. Indexing or sizing it records
// the spans of its elements once (offs: start and end of each), so that
// object.l[i] for many i reads the list once.
type jsonList struct {
	span
	offs    []int
	indexed bool
	vals    []ref.Val // decoded elements, by index (nil: not yet)
}

var _ traits.Lister = (*jsonList)(nil)

// record records the element spans once.
func (l *jsonList) record() error {
	if l.indexed {
		return nil
	}
	if err := l.check(); err != nil {
		return err
	}
	var offs []int
	if err := l.elements(func(v, vend int) bool { offs = append(offs, v, vend); return true }); err != nil {
		return err
	}
	l.offs, l.indexed = offs, true
	l.vals = make([]ref.Val, len(offs)/2)
	return nil
}

func (l *jsonList) Get(index ref.Val) ref.Val {
	i, err := types.IndexOrError(index)
	if err != nil {
		return types.WrapErr(err)
	}
	if err := l.record(); err != nil {
		return types.WrapErr(err)
	}
	if i < 0 || i >= len(l.vals) {
		return types.NewErr("index out of range: %d", i)
	}
	if l.vals[i] == nil {
		l.vals[i] = valueAt(l.b, l.data, l.offs[2*i], l.offs[2*i+1], true)
	}
	return l.vals[i]
}

func (l *jsonList) Size() ref.Val {
	if err := l.record(); err != nil {
		return types.WrapErr(err)
	}
	return types.Int(len(l.vals))
}

func (l *jsonList) IsZeroValue() bool { return l.Size() == types.Int(0) }

func (l *jsonList) Contains(elem ref.Val) ref.Val {
	if err := l.check(); err != nil {
		return types.WrapErr(err)
	}
	found := false
	err := l.elements(func(v, vend int) bool {
		if elem.Equal(valueAt(l.b, l.data, v, vend, true)) == types.True {
			found = true
			return false
		}
		return true
	})
	if err != nil {
		return types.WrapErr(err)
	}
	return types.Bool(found)
}

// Iterator validates each element as it reaches it (listIter.Next), not
// the whole list first: a loop that stops early reads no further.
func (l *jsonList) Iterator() traits.Iterator {
	return &listIter{l: l, i: skipWS(l.data, 1)}
}

func (l *jsonList) Add(other ref.Val) ref.Val {
	full, ok := l.materialize().(traits.Lister)
	if !ok {
		return l.materialize()
	}
	if o, ok := other.(*jsonList); ok {
		other = o.materialize()
	}
	return full.Add(other)
}

func (l *jsonList) Equal(other ref.Val) ref.Val { return l.materialize().Equal(other) }
func (l *jsonList) Type() ref.Type              { return types.ListType }
func (l *jsonList) Value() any                  { return l.materialize().Value() }
func (l *jsonList) ConvertToType(t ref.Type) ref.Val {
	if t == types.ListType {
		return l
	}
	return l.materialize().ConvertToType(t)
}
func (l *jsonList) ConvertToNative(t reflect.Type) (any, error) {
	return l.materialize().ConvertToNative(t)
}

// listIter walks an array, decoding one element per Next; each element
// is charged.
type listIter struct {
	iterBase
	l *jsonList
	i int
	// open is the element Next returned last when it is a map or list
	// of a validated list, returned without skipping it (an open span,
	// as jsonMap.openValue): the next element starts after it, found
	// only when the loop goes on (exists stops at the first match
	// without reading past it).
	open ref.Val
}

// HasNext ends the loop early when the budget is spent (Match then
// returns an error, whatever the loop yielded).
func (it *listIter) HasNext() ref.Val {
	if it.open != nil && !it.settle() {
		return types.False
	}
	data := it.l.data
	return types.Bool(it.i < len(data) && data[it.i] != ']' && it.l.b.charge(costVisit))
}

// settle moves it.i past the open element: its end is known when its
// span was cut (trim), else it is skipped. false when that fails (only on
// the budget: the list was validated).
func (it *listIter) settle() bool {
	data := it.l.data
	var span *span
	switch x := it.open.(type) {
	case *jsonMap:
		span = &x.span
	case *jsonList:
		span = &x.span
	}
	it.open = nil
	end := it.i + len(span.data)
	if span.open {
		var err error
		if end, err = it.l.skipElement(it.i); err != nil {
			it.i = len(data)
			it.l.b.charge(max(it.l.b.left, 0) + 1) // the evaluation fails on it
			return false
		}
	}
	it.next(end)
	return true
}

// next moves it.i to the element after the one ending at end.
func (it *listIter) next(end int) {
	data := it.l.data
	it.i = skipWS(data, end)
	if it.i < len(data) && data[it.i] == ',' {
		it.i = skipWS(data, it.i+1)
	}
}

func (it *listIter) Next() ref.Val {
	data := it.l.data
	if (it.l.ok || it.l.b.valid) && isContainer(data[it.i]) {
		v := valueAt(it.l.b, data, it.i, len(data)-1, true)
		switch x := v.(type) {
		case *jsonMap:
			x.open = true
		case *jsonList:
			x.open = true
		}
		it.open = v
		return v
	}
	end, err := it.l.skipElement(it.i)
	if err != nil {
		it.i = len(data) // the loop ends on the error
		return types.WrapErr(err)
	}
	v := valueAt(it.l.b, data, it.i, end, true)
	it.next(end)
	return v
}

// sliceIter iterates over decoded values (a map's keys), each iteration
// charged to b: a map's keys are collected from its recorded members
// without reading them again, so a loop over them inside another loop
// costs its iterations only.
type sliceIter struct {
	iterBase
	vals []ref.Val
	b    *budget
}

func (it *sliceIter) HasNext() ref.Val {
	return types.Bool(len(it.vals) > 0 && it.b.charge(costVisit))
}

func (it *sliceIter) Next() ref.Val {
	v := it.vals[0]
	it.vals = it.vals[1:]
	return v
}

// iterBase is the ref.Val part of an iterator, as cel-go's own.
type iterBase struct{}

func (iterBase) ConvertToNative(reflect.Type) (any, error) {
	return nil, fmt.Errorf("type conversion on iterators not supported")
}
func (iterBase) ConvertToType(ref.Type) ref.Val { return types.NewErr("no such overload") }
func (iterBase) Equal(ref.Val) ref.Val          { return types.NewErr("no such overload") }
func (iterBase) Type() ref.Type                 { return types.IteratorType }
func (iterBase) Value() any                     { return nil }
