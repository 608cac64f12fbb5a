package source

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"syscall"
	"testing"
)

// A broken connection to the apiserver is counted as restart reason
// "closed"; anything else as "error".
func TestIsConnErr(t *testing.T) {
	op := func(errno syscall.Errno) error {
		return &url.Error{Op: "Get", URL: "https://127.0.0.1:6443/api", Err: &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", errno)}}
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&url.Error{Op: "Get", URL: "https://x", Err: io.EOF}, true},
		{fmt.Errorf("decode: %w", io.ErrUnexpectedEOF), true},
		{op(syscall.ECONNRESET), true},
		{op(syscall.ECONNREFUSED), true},
		{op(syscall.EPIPE), true},
		{errors.New("http2: client connection lost"), true},
		{errors.New("http2: server sent GOAWAY and closed the connection; LastStreamID=1"), true},
		{errors.New("the server could not find the requested resource"), false},
		{errors.New("invalid character 'x' looking for beginning of value"), false},
	} {
		if got := isConnErr(c.err); got != c.want {
			t.Errorf("isConnErr(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
