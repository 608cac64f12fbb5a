package tail

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testutil"
)

// No credential in a URL, whatever its shape, reaches Run's error: a
// *ConnectError shows the URL redacted, and nats.go's error without the
// parts of the URL it may echo.
func TestHostileURLsNeverReachTheConnectError(t *testing.T) {
	for _, h := range testutil.HostileURLs() {
		t.Run(h.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			var out bytes.Buffer
			err := Run(ctx, Options{URL: h.URL, Out: &out, Count: 1})
			var ce *ConnectError
			if !errors.As(err, &ce) {
				t.Fatalf("Run: %v, want a *ConnectError", err)
			}
			if msg := err.Error(); strings.Contains(msg, testutil.URLSecret) || !strings.Contains(msg, "xxxxx") {
				t.Errorf("error %q", msg)
			}
			if u := ce.RedactedURL(); strings.Contains(u, testutil.URLSecret) {
				t.Errorf("RedactedURL %q", u)
			}
		})
	}
}
