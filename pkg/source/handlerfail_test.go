package source

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// TestItemTheHandlerRefusedIsReadAgain: when the handler fails on an item
// (relay: its context ended while submitting it), Run returns and the next
// Run resumes from the last item the handler took, so that the refused one
// is delivered again instead of skipped. (Found by the chaos suite: relayd
// resumed from SIGSTOP, the watch's idle timer had fired, the submit of the
// change read right then failed, and the watch resumed after it.)
func TestItemTheHandlerRefusedIsReadAgain(t *testing.T) {
	cm7 := `{"type":"MODIFIED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b","namespace":"ns","uid":"u2","resourceVersion":"7"}}}`
	srv := &scripted{bodies: []string{cm6 + "\n" + cm7 + "\n"}}
	wt, _ := newWatcher(t, srv, Options{Backoff: wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Minute}})
	refuse := errors.New("submit: context canceled")
	var items []string
	refused := false
	err := wt.Run(t.Context(), Start{ResourceVersion: "5"}, func(_ context.Context, it *Item) error {
		if it.ResourceVersion == "7" && !refused {
			refused = true
			return refuse
		}
		items = append(items, it.ResourceVersion)
		return nil
	})
	if !errors.Is(err, refuse) {
		t.Fatalf("Run returned %v, want the handler's error", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	_ = wt.Run(ctx, Start{}, func(_ context.Context, it *Item) error {
		items = append(items, it.ResourceVersion)
		return nil
	})
	reqs := srv.requests()
	if len(reqs) < 2 || reqs[0] != "5" || reqs[1] != "6" {
		t.Fatalf("watch requests from %v, want 5 then 6 (the last item the handler took)", reqs)
	}
	if len(items) < 3 || items[0] != "6" || items[1] != "6" || items[2] != "7" {
		t.Errorf("items %v, want 6, then 6 and 7 again from the resumed watch", items)
	}
}
