// Package tail prints relayd's events as they arrive on NATS, one readable
// line each: the operator's view of what relayd publishes.
//
// Run connects with Options.URL and Options.NATSOptions, which carry
// everything else about the connection (TLS, authentication, inbox prefix:
// `relayd tail -c` passes those of the config's nats block, from
// pkg/natsconn), and reaches JetStream through Options.JetStream (the
// configured JetStream domain). A failed first connection is a
// *ConnectError, whose message never shows the credentials a URL may hold.
package tail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/pkg/config"
	"github.com/relayd/relayd/pkg/event"
)

// Options configures Run.
type Options struct {
	// URL is the NATS server URL, or a comma-separated list of them.
	URL string
	// Subject is the subject filter, e.g. "k8s.>"; default ">".
	Subject string
	// Stream, when set, replays the stream from its first message (an
	// ordered consumer) before following new ones; otherwise only events
	// published from now on are shown (a plain subscription).
	Stream string
	// Count stops after this many events (0 = until ctx ends).
	Count int
	// Out receives one line per event. Required.
	Out io.Writer
	// NATSOptions are extra connection options (TLS, authentication, inbox
	// prefix), applied after Run's own (client name, reconnect forever).
	NATSOptions []nats.Option
	// JetStream returns the JetStream API used to replay Stream, e.g. in a
	// JetStream domain (natsconn.JetStream); default jetstream.New.
	JetStream func(*nats.Conn) (jetstream.JetStream, error)
}

// ConnectError is Run's error when the first connection to NATS fails.
type ConnectError struct {
	URL string // as given in Options.URL
	Err error  // from nats.Connect
}

// Error names the URL as RedactedURL does.
func (e *ConnectError) Error() string {
	return fmt.Sprintf("tail: connect to %s: %v", e.RedactedURL(), e.Err)
}

// RedactedURL is URL with the user information (a token, or a user and
// password) of each of its comma-separated URLs replaced by "xxxxx".
func (e *ConnectError) RedactedURL() string {
	urls := strings.Split(e.URL, ",")
	for i, u := range urls {
		urls[i] = config.RedactURL(strings.TrimSpace(u))
	}
	return strings.Join(urls, ",")
}

func (e *ConnectError) Unwrap() error { return e.Err }

// Run prints events until ctx ends or Count events were printed.
func Run(ctx context.Context, o Options) error {
	if o.Out == nil {
		return errors.New("tail: Options.Out is required")
	}
	if o.Subject == "" {
		o.Subject = ">"
	}
	nc, err := nats.Connect(o.URL, append([]nats.Option{nats.Name("relayd-tail"), nats.MaxReconnects(-1)}, o.NATSOptions...)...)
	if err != nil {
		return &ConnectError{URL: o.URL, Err: err}
	}
	defer nc.Close()
	msgs := make(chan *nats.Msg, 1024)
	if o.Stream != "" {
		newJS := o.JetStream
		if newJS == nil {
			newJS = func(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.New(nc) }
		}
		js, err := newJS(nc)
		if err != nil {
			return fmt.Errorf("tail: JetStream: %w", err)
		}
		cons, err := js.OrderedConsumer(ctx, o.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{o.Subject}})
		if err != nil {
			return fmt.Errorf("tail: stream %s: %w", o.Stream, err)
		}
		cc, err := cons.Consume(func(m jetstream.Msg) {
			msgs <- &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}
		})
		if err != nil {
			return err
		}
		defer cc.Stop()
	} else {
		sub, err := nc.ChanSubscribe(o.Subject, msgs)
		if err != nil {
			return fmt.Errorf("tail: subscribe %s: %w", o.Subject, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := nc.Flush(); err != nil {
			return err
		}
	}
	n := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			fmt.Fprintln(o.Out, Format(m.Subject, m.Header, m.Data))
			n++
			if o.Count > 0 && n >= o.Count {
				return nil
			}
		}
	}
}

// Format renders one message: time, type, kind, namespace/name,
// resourceVersion, origin (and the sync details for control events).
func Format(subject string, header nats.Header, data []byte) string {
	env, err := event.DecodeMessage(header, data)
	if err != nil {
		return fmt.Sprintf("%-30s  undecodable message on %s: %v", time.Now().UTC().Format(time.RFC3339Nano), subject, err)
	}
	ts := env.Time.UTC().Format("15:04:05.000")
	typ := env.Type
	if i := strings.LastIndex(typ, ".object."); i >= 0 {
		typ = typ[i+len(".object."):]
	} else if i := strings.LastIndex(typ, ".source."); i >= 0 {
		typ = typ[i+len(".source."):]
	}
	if strings.HasPrefix(typ, "sync.") {
		var d struct {
			Namespace string          `json:"namespace"`
			Reason    string          `json:"reason"`
			From      string          `json:"fromResourceVersion"`
			To        string          `json:"toResourceVersion"`
			Counts    json.RawMessage `json:"counts"`
		}
		_ = json.Unmarshal(env.Data, &d)
		line := fmt.Sprintf("%s  %-15s source=%s namespace=%s epoch=%d reason=%s from=%q", ts, typ,
			env.RelaydSource, orDash(d.Namespace), env.RelaydEpoch, d.Reason, d.From)
		if d.To != "" {
			line += fmt.Sprintf(" to=%q counts=%s", d.To, d.Counts)
		}
		return line
	}
	name := env.K8sName
	if env.K8sNamespace != "" {
		name = env.K8sNamespace + "/" + name
	}
	line := fmt.Sprintf("%s  %-15s %-22s %-40s rv=%-8s origin=%s", ts, typ, env.K8sKind, name, env.K8sResourceVersion, env.RelaydOrigin)
	if env.RelaydOversize {
		line += " (oversize: sent as reference)"
	}
	if env.RelaydFinalStateUnknown {
		line += " (final state unknown)"
	}
	return line
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
