package source

import (
	"fmt"
	"io"
)

// DefaultMaxObjectBytes is the default of Options.MaxObjectBytes
// (watch.maxObjectBytes): far above any object an apiserver stores (etcd
// refuses requests over 1.5 MiB by default), so it only stops input that
// no legal object explains.
const DefaultMaxObjectBytes = 64 << 20

// listPageSlack is what a LIST page may hold besides its items (kind,
// apiVersion, metadata with the continue token, the commas): a page of one
// item is read up to MaxObjectBytes plus this.
const listPageSlack = 64 << 10

// What a *tooLargeError is about.
const (
	tooLargeFrame = "watch frame"
	tooLargeItem  = "LIST item"
	tooLargePage  = "LIST page"
)

// tooLargeError is input from the apiserver over its bound: a watch frame
// or a LIST item over Options.MaxObjectBytes, or a LIST page over what a
// page may hold. Reading stopped there; read is how much of it was read.
type tooLargeError struct {
	what      string
	read, max int64
}

func (e *tooLargeError) Error() string {
	return fmt.Sprintf("%s larger than watch.maxObjectBytes allows (%d bytes): stopped reading it after %d bytes", e.what, e.max, e.read)
}

// readAtMost reads r to its end, into a buffer that grows to at most
// limit+1 bytes: more than limit bytes is a *tooLargeError about what,
// and nothing past limit+1 is read.
func readAtMost(r io.Reader, limit int64, what string) ([]byte, error) {
	buf := make([]byte, 0, min(64<<10, limit+1))
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) > limit {
				return nil, &tooLargeError{what: what, read: int64(len(buf)), max: limit}
			}
			grown := make([]byte, len(buf), min(2*int64(cap(buf)), limit+1))
			copy(grown, buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case err == io.EOF:
			return buf, nil
		case err != nil:
			return nil, err
		}
	}
}
