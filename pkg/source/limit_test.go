package source

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// endless is a stream that starts with prefix and then repeats fill
// forever, counting the bytes it gave out.
type endless struct {
	prefix string
	fill   byte
	read   int64
}

func (e *endless) Read(p []byte) (int, error) {
	n := copy(p, e.prefix)
	e.prefix = e.prefix[n:]
	for i := n; i < len(p); i++ {
		p[i] = e.fill
	}
	e.read += int64(len(p))
	return len(p), nil
}

// A frame that never ends, whether in a string, in nesting or in a
// number, ends the read with a *tooLargeError once one byte more than the
// limit is buffered: no more is read from the stream, and the buffer never
// grew past limit+1 bytes. Frames before it come through.
func TestFrameReaderStopsAnEndlessFrameAtItsLimit(t *testing.T) {
	const limit = 1<<20 + 17 // not a buffer size the doubling hits
	good := `{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}}`
	for name, e := range map[string]*endless{
		"string":  {prefix: good + "\n" + `{"type":"ADDED","object":{"data":{"k":"`, fill: 'x'},
		"nesting": {prefix: good + "\n" + `{"type":"ADDED","object":`, fill: '['},
		"number":  {prefix: good + "\n" + `{"type":"ADDED","object":{"n":`, fill: '7'},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFrameReader(e, limit)
			frame, err := f.Next()
			if err != nil || string(frame) != good {
				t.Fatalf("first frame %.80q, %v; want the good frame", frame, err)
			}
			frame, err = f.Next()
			var tooLarge *tooLargeError
			if !errors.As(err, &tooLarge) {
				t.Fatalf("Next = %d bytes, %v; want a *tooLargeError", len(frame), err)
			}
			if tooLarge.what != tooLargeFrame || tooLarge.read != limit+1 || tooLarge.max != limit {
				t.Errorf("error %+v, want a watch frame, %d bytes read, max %d", tooLarge, limit+1, limit)
			}
			want := "watch frame larger than watch.maxObjectBytes allows (1048593 bytes): stopped reading it after 1048594 bytes"
			if err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
			// The good frame, then limit+1 bytes of the endless one.
			if max := int64(len(good)+1) + limit + 1; e.read > max {
				t.Errorf("read %d bytes from the stream, want at most %d", e.read, max)
			}
			if cap(f.buf) > limit+1 {
				t.Errorf("buffer grew to %d bytes, want at most %d", cap(f.buf), limit+1)
			}
		})
	}
}

// Frames up to the limit come through, a whole frame one byte over it
// does not, wherever it sits in the buffer and however the stream is cut.
func TestFrameReaderLimitIsExact(t *testing.T) {
	frame := func(n int) string { // a frame of n bytes
		head := `{"type":"ADDED","object":{"k":"`
		return head + strings.Repeat("x", n-len(head)-3) + `"}}`
	}
	const limit = 100 << 10
	small := frame(1000)
	for name, tc := range map[string]struct {
		stream string
		frames int
	}{
		"at the limit":          {small + "\n" + frame(limit) + "\n" + small + "\n", 3},
		"at the limit at first": {frame(limit) + frame(limit), 2},
		"one over":              {small + "\n" + frame(limit+1) + "\n" + small + "\n", 1},
		"one over at first":     {frame(limit + 1), 0},
	} {
		for rname, r := range map[string]func(string) io.Reader{
			"whole": func(s string) io.Reader { return strings.NewReader(s) },
			"half":  func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) },
		} {
			got, err := readFramesLimit(newFrameReader(r(tc.stream), limit))
			if len(got) != tc.frames {
				t.Errorf("%s, %s: %d frames, want %d (err %v)", name, rname, len(got), tc.frames, err)
			}
			var tooLarge *tooLargeError
			switch {
			case strings.HasPrefix(name, "one over") && (!errors.As(err, &tooLarge) || tooLarge.read != limit+1):
				t.Errorf("%s, %s: err %v, want a *tooLargeError after %d bytes", name, rname, err, limit+1)
			case !strings.HasPrefix(name, "one over") && err != io.EOF:
				t.Errorf("%s, %s: err %v, want io.EOF", name, rname, err)
			}
		}
	}
}

func readFramesLimit(f *frameReader) ([]string, error) {
	var out []string
	for {
		b, err := f.Next()
		if err != nil {
			return out, err
		}
		out = append(out, string(b))
	}
}

// readAtMost reads a body of up to limit bytes, and stops an endless one
// after limit+1 bytes.
func TestReadAtMost(t *testing.T) {
	const limit = 200<<10 + 3
	body := strings.Repeat("y", limit)
	got, err := readAtMost(iotest.HalfReader(strings.NewReader(body)), limit, tooLargePage)
	if err != nil || string(got) != body {
		t.Fatalf("readAtMost of %d bytes = %d bytes, %v", limit, len(got), err)
	}
	e := &endless{prefix: `{"items":[`, fill: ' '}
	got, err = readAtMost(e, limit, tooLargePage)
	var tooLarge *tooLargeError
	if !errors.As(err, &tooLarge) || tooLarge.what != tooLargePage || tooLarge.read != limit+1 || got != nil {
		t.Fatalf("readAtMost of an endless body = %d bytes, %v; want a *tooLargeError about the page after %d bytes", len(got), err, limit+1)
	}
	if e.read != limit+1 {
		t.Errorf("read %d bytes of the endless body, want %d", e.read, limit+1)
	}
	boom := errors.New("connection reset")
	if _, err := readAtMost(io.MultiReader(strings.NewReader("{"), iotest.ErrReader(boom)), limit, tooLargePage); !errors.Is(err, boom) {
		t.Errorf("readAtMost = %v, want %v", err, boom)
	}
}
