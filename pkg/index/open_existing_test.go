package index

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/testenv"
)

// relayd never changes a bucket it finds, even with nats.index.create: the
// stream of a bucket made elsewhere, with every setting the server takes
// away from its default (created and read back through the raw JetStream
// API, the server's JSON), is the same key by key after Open, and its
// differences from a bucket relayd creates are warnings.
func TestOpenChangesNothingOfAnExistingBucket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n := testenv.NATST(t, testenv.NATSOptions{})
	nc, err := nats.Connect(n.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	bucket := func(v string) string { return "relayd-index-" + v }
	buckets := testenv.StreamsAwayFromDefaults("ORIGIN", func(v string) (string, []string) {
		return "KV_" + bucket(v), []string{"$KV." + bucket(v) + ".>"}
	})
	befores, defaults, err := testenv.CreateRawStreams(ctx, nc, "$JS.API.", "ORIGIN", buckets)
	if err != nil {
		t.Fatal(err)
	}
	if missing := testenv.UncoveredStreamSettings(befores, defaults); len(missing) > 0 {
		t.Fatalf("settings of the server's StreamConfig no bucket holds away from its default: %q", missing)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range buckets {
		t.Run(s.Variant, func(t *testing.T) {
			b, err := Open(ctx, js, BucketOptions{Name: bucket(s.Variant), Create: true, Replicas: 1, Storage: jetstream.FileStorage})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if w := b.Warnings(); len(w) == 0 || !strings.Contains(w[0], "history is 5, relayd creates it with 1") {
				t.Errorf("warnings %q, want the history of 5 first", w)
			}
			after, err := testenv.JSRequest(ctx, nc, "$JS.API.STREAM.INFO."+s.Name, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := testenv.DiffConfigs(befores[i], after); len(diff) > 0 {
				t.Errorf("Open changed the bucket's stream:\n%s", strings.Join(diff, "\n"))
			}
		})
	}
}
