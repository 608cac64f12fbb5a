package source

import (
	"io"
	"strings"
	"testing"
)

// stepReader hands out its frames one Read each, then blocks the test's
// view of the reader: before every Read it records whether the frame
// reader waits in its idle buffer (a quiet watch's state).
type stepReader struct {
	f      *frameReader
	frames []string
	idle   []bool
}

func (s *stepReader) Read(p []byte) (int, error) {
	s.idle = append(s.idle, s.f.waiting() && len(p) <= idleBufSize)
	if len(s.frames) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.frames[0])
	if s.frames[0] = s.frames[0][n:]; s.frames[0] == "" {
		s.frames = s.frames[1:]
	}
	return n, nil
}

// TestFrameReaderWaitsInItsIdleBuffer: between frames (nothing buffered)
// the reader reads into its small idle buffer, whatever the size of the
// frame before (a bookmark, a 9 KB pod, a frame larger than the pooled
// buffer); a larger frame is read in a pooled or grown buffer, given back
// once returned (docs/PERFORMANCE.md, "Memory per watch").
func TestFrameReaderWaitsInItsIdleBuffer(t *testing.T) {
	frames := []string{
		`{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"1"}}}` + "\n",
		`{"type":"ADDED","object":{"data":"` + strings.Repeat("p", 9000) + `"}}` + "\n",
		`{"type":"ADDED","object":{"data":"` + strings.Repeat("b", 40000) + `"}}` + "\n",
		`{"type":"MODIFIED","object":{"metadata":{"resourceVersion":"2"}}}` + "\n",
	}
	s := &stepReader{frames: append([]string(nil), frames...)}
	s.f = newFrameReader(s, DefaultMaxObjectBytes)
	for i, want := range frames {
		idleBefore := len(s.idle)
		got, err := s.f.Next()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if string(got)+"\n" != want {
			t.Fatalf("frame %d: %d bytes, want %d", i, len(got), len(want)-1)
		}
		// The first Read of each frame starts from nothing buffered.
		if !s.idle[idleBefore] {
			t.Errorf("frame %d: read with nothing buffered not in the idle buffer (len %d)", i, len(s.f.buf))
		}
	}
	if _, err := s.f.Next(); err != io.EOF {
		t.Fatalf("end: %v, want EOF", err)
	}
	if !s.idle[len(s.idle)-1] {
		t.Errorf("waiting for the stream after the last frame not in the idle buffer (len %d)", len(s.f.buf))
	}
	s.f.Close()
}
