package source

import (
	"bytes"
	"io"
	"strconv"
	"sync"
)

// frameReader splits the apiserver's JSON watch stream into frames, one
// JSON object each. It only finds where a frame ends (nesting, strings and
// their escapes); event.ParseWatchEvent validates the frame. It replaces
// json.Decoder, whose byte-at-a-time scanner (run twice per frame: once to
// read the value, once more to copy it into a json.RawMessage) took about
// 60% of relayd's CPU per event in the CPU profile of `make bench`
// (docs/PERFORMANCE.md).
//
// A frame may be at most limit bytes long: the buffer never grows past
// limit+1 bytes, so a frame without an end (a broken or hostile server)
// costs that much memory, not all there is, and is a *tooLargeError.
//
// A reader with nothing buffered holds no buffer of its own: it waits for
// the stream in a small one (idle, inside the reader) and takes a larger
// one from a pool shared by every reader only when a frame does not fit,
// giving it back as soon as every byte read was returned. A quiet watch
// (most of a source's per-namespace watches) then holds idleBufSize
// bytes of buffer (docs/PERFORMANCE.md, "Memory per watch").
type frameReader struct {
	r          io.Reader
	limit      int
	buf        []byte
	start, end int // buf[start:end] is read and not yet returned
	// The scan of the frame starting at buf[start]: pos is the next byte to
	// look at, depth the open objects and arrays, inStr inside a string.
	pos   int
	depth int
	inStr bool
	err   error // from r; returned once the buffered bytes are used up
	idle  [idleBufSize]byte
}

// idleBufSize is the buffer a reader waits in: a bookmark or a small
// change fits; anything larger moves to a pooled buffer.
const idleBufSize = 512

// pooledBufSize is the size of the pooled buffers. A busy watch reads
// its stream in as few reads as it can: every read of an HTTP/2 response
// body that consumes 4 KiB or more makes Go's transport send (and flush,
// a system call) a WINDOW_UPDATE; with 16 KiB buffers those writes took
// 14% of relayd's CPU at full speed (docs/PERFORMANCE.md, "Goals not
// met"). Only a reader in the middle of a read holds one; a quiet watch
// waits in its idle buffer. A reader whose frame is larger grows its own,
// up to limit+1, and drops it once done.
const pooledBufSize = 64 << 10

var framePool = sync.Pool{New: func() any { b := make([]byte, pooledBufSize); return &b }}

// newFrameReader reads frames of at most limit bytes from r.
func newFrameReader(r io.Reader, limit int) *frameReader {
	f := &frameReader{r: r, limit: limit}
	f.buf = f.idleBuf()
	return f
}

// idleBuf is the reader's own small buffer, at most limit+1 bytes.
func (f *frameReader) idleBuf() []byte { return f.idle[:min(idleBufSize, f.limit+1)] }

// Close gives the reader's pooled buffer back; the last frame returned is
// invalid from then on.
func (f *frameReader) Close() { f.release() }

// release gives a pooled buffer back (a grown one is dropped) and waits in
// the idle one again; only called with nothing buffered.
func (f *frameReader) release() {
	f.putBack()
	f.buf = f.idleBuf()
	f.start, f.end, f.pos = 0, 0, 0
}

// Next returns the next frame, valid until the next call. At the end of
// the stream it returns io.EOF between frames and io.ErrUnexpectedEOF
// inside one; a frame longer than limit is a *tooLargeError.
func (f *frameReader) Next() ([]byte, error) {
	for {
		for f.start < f.end && isJSONSpace(f.buf[f.start]) {
			f.start++
		}
		if f.start < f.end {
			break
		}
		if err := f.fill(); err != nil {
			return nil, err
		}
	}
	if c := f.buf[f.start]; c != '{' && c != '[' {
		return nil, &frameSyntaxError{c}
	}
	f.pos, f.depth, f.inStr = f.start, 0, false
	for {
		end, ok := f.scan()
		if !ok {
			end = f.end // the frame so far
		}
		if n := end - f.start; n > f.limit {
			return nil, &tooLargeError{what: tooLargeFrame, read: int64(n), max: int64(f.limit)}
		}
		if ok {
			frame := f.buf[f.start:end:end]
			f.start = end
			return frame, nil
		}
		if err := f.fill(); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// NextLine is Next for a stream of one frame per line, as the apiserver
// writes it (each frame then a newline, in one write): the line the next
// frame starts on (at most limit bytes, without the whitespace around it)
// is the frame if valid accepts it, found with bytes.IndexByte instead of
// Next's scan, and parsed is true. valid must accept exactly one JSON
// value and nothing else (event.ParseWatchEvent's check, which the watcher
// makes of every frame anyway), so that a line it accepts is the frame
// Next would return. Otherwise (a line that is not one JSON value, a line
// too long, a frame without a newline after it) it is Next, and parsed is
// false. It never waits for more of the stream than Next would: while no
// newline is buffered, the buffered part of the frame is scanned as Next
// does, so a complete frame is returned without its newline.
func (f *frameReader) NextLine(valid func([]byte) bool) (frame []byte, parsed bool, err error) {
	if line, ok := f.line(valid); ok {
		return line, true, nil
	}
	frame, err = f.Next()
	return frame, false, err
}

// line returns the next frame if it is the line it starts, as NextLine.
func (f *frameReader) line(valid func([]byte) bool) ([]byte, bool) {
	for {
		for f.start < f.end && isJSONSpace(f.buf[f.start]) {
			f.start++
		}
		if f.start < f.end {
			break
		}
		if f.fill() != nil {
			return nil, false
		}
	}
	if c := f.buf[f.start]; c != '{' && c != '[' {
		return nil, false
	}
	f.pos, f.depth, f.inStr = f.start, 0, false
	searched := 0 // bytes after f.start known to hold no newline
	for {
		end := min(f.end, f.start+f.limit+1) // a frame of limit bytes and its newline
		if j := bytes.IndexByte(f.buf[f.start+searched:end], '\n'); j >= 0 {
			nl := f.start + searched + j
			line := f.buf[f.start:nl:nl] // starts with '{' or '['
			for isJSONSpace(line[len(line)-1]) {
				line = line[:len(line)-1]
			}
			if !valid(line) {
				return nil, false
			}
			f.start = nl + 1
			return line, true
		}
		if end-f.start > f.limit {
			return nil, false
		}
		// No newline yet: a frame complete without one is Next's, now.
		if _, done := f.scan(); done {
			return nil, false
		}
		searched = end - f.start
		if f.fill() != nil {
			return nil, false
		}
	}
}

// scan continues the scan of the current frame over the buffered bytes and
// returns the offset just past its end, if it is there.
func (f *frameReader) scan() (int, bool) {
	b := f.buf[:f.end]
	i := f.pos
	for i < len(b) {
		if f.inStr {
			j := bytes.IndexByte(b[i:], '"')
			if j < 0 {
				i = len(b)
				break
			}
			i += j
			// An odd number of backslashes before it escapes the quote.
			// They are all inside this frame's string, so still buffered.
			n := 0
			for k := i - 1; k >= f.start && b[k] == '\\'; k-- {
				n++
			}
			i++
			if n%2 == 0 {
				f.inStr = false
			}
			continue
		}
		switch b[i] {
		case '"':
			f.inStr = true
		case '{', '[':
			f.depth++
		case '}', ']':
			f.depth--
			if f.depth == 0 {
				f.pos = i + 1
				return i + 1, true
			}
		}
		i++
	}
	f.pos = i
	return 0, false
}

// fill reads more of the stream into buf, moving the unread bytes to its
// front and growing it, up to limit+1 bytes, when it is full. Next stops
// at a frame of more than limit bytes, so a full buffer of limit+1 bytes is
// never filled.
func (f *frameReader) fill() error {
	if f.err != nil {
		return f.err
	}
	if f.start == f.end {
		// Nothing buffered (between frames): wait in the idle buffer.
		f.release()
	} else if f.start > 0 {
		n := copy(f.buf, f.buf[f.start:f.end])
		f.pos -= f.start
		f.start, f.end = 0, n
	}
	if f.end == len(f.buf) {
		f.grow()
	}
	for {
		n, err := f.r.Read(f.buf[f.end:])
		f.end += n
		if err != nil {
			f.err = err
		}
		if n > 0 {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// grow moves the buffered bytes to a larger buffer: from the idle one to a
// pooled one, then doubling, up to limit+1 bytes (grow is called with a
// full buffer only, so shorter than that: see fill).
func (f *frameReader) grow() {
	var grown []byte
	if f.waiting() {
		grown = (*framePool.Get().(*[]byte))[:min(pooledBufSize, f.limit+1)]
	} else {
		// Not append, which may round the capacity past limit+1.
		grown = make([]byte, min(2*len(f.buf), f.limit+1))
	}
	copy(grown, f.buf[:f.end])
	f.putBack()
	f.buf = grown
}

// waiting reports whether the reader is in its idle buffer.
func (f *frameReader) waiting() bool { return &f.buf[:1][0] == &f.idle[0] }

// putBack gives buf to the pool if it came from there.
func (f *frameReader) putBack() {
	if !f.waiting() && cap(f.buf) == pooledBufSize {
		b := f.buf[:pooledBufSize]
		framePool.Put(&b)
	}
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

// frameSyntaxError is a stream that does not start a JSON object where a
// frame should begin (e.g. an HTML error page from a proxy); the message is
// encoding/json's.
type frameSyntaxError struct{ c byte }

func (e *frameSyntaxError) Error() string {
	q := strconv.QuoteRune(rune(e.c))
	if e.c >= 0x80 || e.c < 0x20 {
		q = "byte " + strconv.Quote(string([]byte{e.c}))
	}
	return "invalid character " + q + " looking for beginning of value"
}
