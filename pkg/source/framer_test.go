package source

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"testing/iotest"
)

func readFrames(t *testing.T, r io.Reader) ([]string, error) {
	t.Helper()
	f := newFrameReader(r, DefaultMaxObjectBytes)
	var out []string
	for {
		b, err := f.Next()
		if err != nil {
			return out, err
		}
		out = append(out, string(b))
	}
}

func TestFrameReaderSplitsLikeJSONDecoder(t *testing.T) {
	big := `{"type":"ADDED","object":{"data":{"k":"` + strings.Repeat(`x\"}{][`, 40000) + `"}}}`
	frames := []string{
		`{"type":"ADDED","object":{"metadata":{"name":"a\"}","resourceVersion":"1"}}}`,
		`{"type":"MODIFIED","object":{"s":"\\","t":"\\\\\"","a":[{"b":[]},"]"]}}`,
		`{}`,
		big,
		`{"type":"DELETED","object":{"u":"\u00e9 ü {"}}`,
	}
	stream := " \n" + frames[0] + "\n" + frames[1] + frames[2] + "\r\n\t" + frames[3] + "\n" + frames[4] + "\n\n"
	// The reference: encoding/json's decoder, as the watcher used before.
	var want []string
	dec := json.NewDecoder(strings.NewReader(stream))
	for {
		var m json.RawMessage
		if err := dec.Decode(&m); err != nil {
			break
		}
		want = append(want, string(m))
	}
	for name, r := range map[string]io.Reader{
		"whole":    strings.NewReader(stream),
		"one byte": iotest.OneByteReader(strings.NewReader(stream)),
		"half":     iotest.HalfReader(strings.NewReader(stream)),
	} {
		got, err := readFrames(t, r)
		if err != io.EOF {
			t.Fatalf("%s: err %v, want io.EOF", name, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d frames, want %d", name, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] || got[i] != frames[i] {
				t.Errorf("%s: frame %d = %.80q…, want %.80q…", name, i, got[i], want[i])
			}
		}
	}
}

func TestFrameReaderErrors(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		frames       int
		err          error
		msg          string
	}{
		{"empty", "", 0, io.EOF, ""},
		{"truncated", `{"type":"ADDED"}` + "\n" + `{"type":"MODIFIED","object":{"metadata":{"name":"b","resourceVer`, 1, io.ErrUnexpectedEOF, ""},
		{"truncated in a string", `{"a":"\"`, 0, io.ErrUnexpectedEOF, ""},
		{"non-JSON", "<html>502 Bad Gateway</html>\n", 0, nil, "invalid character '<' looking for beginning of value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readFrames(t, iotest.HalfReader(strings.NewReader(tc.stream)))
			if len(got) != tc.frames {
				t.Errorf("%d frames before the error, want %d", len(got), tc.frames)
			}
			if tc.err != nil && !errors.Is(err, tc.err) {
				t.Errorf("err %v, want %v", err, tc.err)
			}
			if tc.msg != "" && (err == nil || err.Error() != tc.msg) {
				t.Errorf("err %v, want %q", err, tc.msg)
			}
		})
	}
	// A read error is returned after the frames read before it.
	boom := errors.New("connection reset")
	r := io.MultiReader(strings.NewReader(`{"a":1}`+"\n"), iotest.ErrReader(boom))
	got, err := readFrames(t, r)
	if len(got) != 1 || !errors.Is(err, boom) {
		t.Errorf("frames %q, err %v; want one frame, then %v", got, err, boom)
	}
}

// TestFrameReaderNextLineLikeNext: NextLine returns the frames and errors
// of Next, whatever the lines hold (two frames on a line, a frame over
// several lines, blank lines and \r\n, a line that is not JSON, a frame
// without a newline), and takes the lines that are one valid frame
// without Next's scan.
func TestFrameReaderNextLineLikeNext(t *testing.T) {
	a := `{"type":"ADDED","object":{"metadata":{"name":"a\"}\n","resourceVersion":"1"}}}`
	b := `{"type":"MODIFIED","object":{"s":"\\","a":[{"b":[]},"]"]}}`
	for _, tc := range []struct {
		stream string
		lines  int // frames taken as lines by a validator (json.Valid), read whole
	}{
		{" \n" + a + "\n" + b + "\r\n\t" + a + "\n\n" + b, 3},                             // the last has no newline: Next
		{a + b + "\n" + a + "\n", 2},                                                      // two frames on a line
		{"{\n \"type\": \"ADDED\",\n \"object\": {}\n}\n" + a + "\n", 1},                  // pretty-printed
		{a + "\n" + a + "\n" + a + " x\n" + b + "\n", 2},                                  // garbage after a frame
		{a + "\n" + a + "\n" + `{"type":"ADDED","object":{"name":"b`, 2},                  // truncated
		{a + "\n" + a + "\n<html>502</html>\n", 2},                                        // not JSON
		{a + "\n" + a + "\n" + `{"k":"` + strings.Repeat("x", 2000) + `"}` + "\n" + a, 2}, // a line over the limit
	} {
		stream := tc.stream
		for name, valid := range map[string]func([]byte) bool{
			"json.Valid": json.Valid,
			"never":      func([]byte) bool { return false },
		} {
			for _, half := range []bool{false, true} {
				reader := func() io.Reader {
					if half {
						return iotest.HalfReader(strings.NewReader(stream))
					}
					return strings.NewReader(stream)
				}
				want, wantErr := readFramesLimit(newFrameReader(reader(), 1024))
				got, fast, err := readLines(newFrameReader(reader(), 1024), valid)
				if strings.Join(got, "|") != strings.Join(want, "|") || fmt.Sprint(err) != fmt.Sprint(wantErr) {
					t.Errorf("%s, half %v, %.60q…: NextLine gave %q, %v; Next %q, %v", name, half, stream, got, err, want, wantErr)
				}
				if name == "never" && fast != 0 || name == "json.Valid" && !half && fast != tc.lines {
					t.Errorf("%s, half %v, %.60q…: %d frames taken as lines", name, half, stream, fast)
				}
			}
		}
	}
}

// A frame complete without a newline after it (a server other than the
// apiserver) is returned without reading more of the stream, which may
// not come before the next change: whole, or split over two reads.
func TestFrameReaderNextLineDoesNotWaitForANewline(t *testing.T) {
	for _, tc := range []struct {
		chunks []string
		frames int
	}{
		{[]string{`{"type":"ADDED","object":{}}`}, 1},
		{[]string{`{"type":"ADDED",`, `"object":{}}`}, 1},
		{[]string{`{"type":"ADDED","object":{}}` + "\n", `{"type":"BOOKMARK","object":{}}`}, 2},
	} {
		r := &tripwire{chunks: tc.chunks}
		f := newFrameReader(r, 1024)
		for range tc.frames {
			if _, _, err := f.NextLine(json.Valid); err != nil {
				t.Fatalf("%q: %v", tc.chunks, err)
			}
		}
		if r.tripped {
			t.Errorf("%q: NextLine read past the complete frame in %q", tc.chunks, r.last)
		}
	}
}

// tripwire returns its chunks one Read each, then trips: a read after the
// last chunk, which a stream that has not ended would block.
type tripwire struct {
	chunks  []string
	last    string
	tripped bool
}

func (r *tripwire) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		r.tripped = true
		return 0, io.EOF
	}
	r.last = r.chunks[0]
	n := copy(p, r.chunks[0])
	r.chunks = r.chunks[1:]
	return n, nil
}

// readLines reads f with NextLine until an error, and counts the frames it
// took as lines.
func readLines(f *frameReader, valid func([]byte) bool) (frames []string, lines int, err error) {
	for {
		fr, parsed, err := f.NextLine(valid)
		if err != nil {
			return frames, lines, err
		}
		if parsed {
			lines++
		}
		frames = append(frames, string(fr))
	}
}

// benchStream is 64 watch frames of the realistic pod of pkg/event's
// benchmarks (~8 KB, managedFields included).
func benchStream(b *testing.B) string {
	pod, err := os.ReadFile("../event/testdata/pod.json")
	if err != nil {
		b.Fatal(err)
	}
	var c bytes.Buffer
	if err := json.Compact(&c, pod); err != nil {
		b.Fatal(err)
	}
	return strings.Repeat(`{"type":"MODIFIED","object":`+c.String()+"}\n", 64)
}

func BenchmarkFrameReader(b *testing.B) {
	stream := benchStream(b)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		f := newFrameReader(strings.NewReader(stream), DefaultMaxObjectBytes)
		for {
			if _, err := f.Next(); err != nil {
				break
			}
		}
	}
}

// BenchmarkJSONDecoderFrames is what the watcher did before frameReader.
func BenchmarkJSONDecoderFrames(b *testing.B) {
	stream := benchStream(b)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		dec := json.NewDecoder(strings.NewReader(stream))
		var m json.RawMessage
		for {
			m = m[:0]
			if err := dec.Decode(&m); err != nil {
				break
			}
		}
	}
}

// BenchmarkWatchFrames is the watcher's per-frame work before the handler:
// split the stream into frames and parse each (event.ParseWatchEvent), as
// Watcher.watch does.
func BenchmarkWatchFrames(b *testing.B) {
	stream := benchStream(b)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		f := newFrameReader(strings.NewReader(stream), DefaultMaxObjectBytes)
		var p parsedFrame
		valid := func(line []byte) bool { return p.parse(line, nil) }
		for {
			frame, parsed, err := f.NextLine(valid)
			if err != nil {
				break
			}
			if !parsed && !p.parse(frame, nil) {
				b.Fatal(p.err)
			}
		}
	}
}
