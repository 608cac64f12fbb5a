package source

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/relayd/relayd/pkg/event"
)

// A requested relist that a 410 cuts short (a branch a real apiserver
// cannot be made to take on cue) is listed again under its request: the
// markers keep reason requested and the request id, and no expired relist
// is made of it. The request itself ends the running watch at once.
func TestRequestedRelistSurvivesA410(t *testing.T) {
	var calls atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("sendInitialEvents") != "true" {
			http.Error(w, "unexpected request", http.StatusBadRequest)
			return
		}
		n := calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"type":"ADDED","object":%s}`+"\n", cmJSON)
		if n == 2 { // the requested list: expired before its end
			fmt.Fprint(w, `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old","reason":"Expired","code":410}}`+"\n")
			return
		}
		fmt.Fprintf(w, `{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"resourceVersion":"%d","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n", 5+n)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the watch stays open
	})
	wt, m := newWatcher(t, h, Options{Backoff: wait.Backoff{Duration: 10 * time.Millisecond, Factor: 2, Steps: 1 << 30, Cap: time.Second}})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var (
		mu      sync.Mutex
		markers []event.SyncEvent
	)
	err := wt.Run(ctx, Start{Snapshot: true}, func(_ context.Context, it *Item) error {
		if it.Kind != ItemSyncStarted && it.Kind != ItemSyncCompleted {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		markers = append(markers, it.Sync)
		switch {
		case it.Kind == ItemSyncCompleted && it.Sync.Reason == event.RelistInitial:
			go wt.Request("r1", true) // from another goroutine, as pkg/resync does
		case it.Kind == ItemSyncCompleted && it.Sync.RequestID == "r1":
			cancel()
		}
		return nil
	})
	if ctx.Err() == nil || t.Context().Err() != nil {
		t.Fatalf("Run returned %v before the requested relist completed", err)
	}
	var got []string
	for _, s := range markers {
		got = append(got, fmt.Sprintf("%v/%s/%s/%v", s.Completed, s.Reason, s.RequestID, s.Full))
	}
	want := []string{"false/initial//false", "true/initial//false", "false/requested/r1/true", "false/requested/r1/true", "true/requested/r1/true"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("markers (completed/reason/requestId/full):\n got %v\nwant %v", got, want)
	}
	if c := calls.Load(); c != 3 {
		t.Errorf("%d list requests, want 3 (initial, requested, requested again after the 410)", c)
	}
	for reason, want := range map[event.RelistReason]float64{event.RelistRequested: 2, event.RelistExpired: 0} {
		if v := testutil.ToFloat64(m.Relists.WithLabelValues("s", string(reason))); v != want {
			t.Errorf("relists{%s} = %v, want %v", reason, v, want)
		}
	}
}
