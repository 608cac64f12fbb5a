// Package tail prints relayd's events as they arrive on NATS, one readable
// line each (or one CloudEvent as JSON per line, for jq): the operator's view
// of what relayd publishes, filtered by source, namespace or kind.
//
// Run connects with Options.URL and Options.NATSOptions, which carry
// everything else about the connection (TLS, authentication, inbox prefix:
// `relayd tail -c` passes those of the config's nats block, from
// pkg/natsconn), and reaches JetStream through Options.JetStream (the
// configured JetStream domain). A failed first connection is a
// *ConnectError, whose message never shows the credentials a URL may hold
// (config.RedactURL, config.RedactError).
//
// Resolve (settings.go) combines tail's flags, the nats CLI's environment
// (NATS_URL, NATS_CREDS, NATS_CONTEXT) and the config file into the
// settings Run connects with (Settings.Options), and Settings.Explain
// words Run's errors; docs/CONFIGURATION.md, "relayd tail".
package tail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
	// Since starts the replay of Stream at the first message JetStream
	// stored at or after it (zero: the stream's first message). Until
	// ends Run before the first message stored after it, or, once the
	// clock has passed it, when nothing of the stream is left to read
	// (zero: follow new messages until ctx ends).
	Since, Until time.Time
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
	// JSON prints each event as one structured-mode CloudEvent per line
	// (JSONLine) instead of Format's readable line.
	JSON bool
	// Filter selects the events printed (and counted by Count).
	Filter Filter
}

// Filter selects events by their extensions; an empty field matches all.
type Filter struct {
	// Source is the relaydsource (the source's name in relayd's config).
	Source string
	// Namespace is the k8snamespace. The sync markers of a watch of all
	// namespaces match every namespace: a gap there concerns them all.
	Namespace string
	// Kind is the k8skind, compared case-insensitively ("configmap"
	// matches ConfigMap). Sync markers match every kind: they belong to
	// sources, and say where a gap is.
	Kind string
}

// Match reports whether the filter selects env.
func (f Filter) Match(env *event.Envelope) bool {
	marker := env.K8sUID == ""
	switch {
	case f.Source != "" && env.RelaydSource != f.Source:
		return false
	case f.Namespace != "" && env.K8sNamespace != f.Namespace && !(marker && env.K8sNamespace == ""):
		return false
	case f.Kind != "" && !marker && !strings.EqualFold(env.K8sKind, f.Kind):
		return false
	}
	return true
}

// ConnectError is Run's error when the first connection to NATS fails.
type ConnectError struct {
	URL string // as given in Options.URL
	Err error  // from nats.Connect
}

// Error names the URL as RedactedURL does, and nats.go's error as
// config.RedactError shows it.
func (e *ConnectError) Error() string {
	return fmt.Sprintf("tail: connect to %s: %s", e.RedactedURL(), config.RedactError(e.Err, e.URL))
}

// RedactedURL is URL as config.RedactURL shows it: without anything that
// may be credentials.
func (e *ConnectError) RedactedURL() string {
	return config.RedactURL(strings.TrimSpace(e.URL))
}

func (e *ConnectError) Unwrap() error { return e.Err }

// Run prints events until ctx ends or Count events were printed.
func Run(ctx context.Context, o Options) error {
	if o.Out == nil {
		return errors.New("Options.Out is required")
	}
	if o.Subject == "" {
		o.Subject = ">"
	}
	nc, err := nats.Connect(o.URL, append([]nats.Option{nats.Name("relayd-tail"), nats.MaxReconnects(-1)}, o.NATSOptions...)...)
	if err != nil {
		return &ConnectError{URL: o.URL, Err: err}
	}
	defer nc.Close()
	msgs := make(chan delivered, 1024)
	stop := make(chan struct{}) // closed when Run returns (first): no callback blocks on msgs then
	push := func(d delivered) {
		select {
		case msgs <- d:
		case <-stop:
		}
	}
	cons, unsubscribe, err := subscribe(ctx, nc, o, push)
	if err != nil {
		return err
	}
	defer unsubscribe()
	defer close(stop)
	var untilPassed <-chan time.Time // ticks once the clock is past Until
	if !o.Until.IsZero() && cons != nil {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		untilPassed = t.C
	}
	n := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-untilPassed:
			if done, err := replayed(ctx, cons, o.Until, len(msgs)); done || err != nil {
				return err
			}
		case d := <-msgs:
			if !o.Until.IsZero() && d.stored.After(o.Until) {
				return nil
			}
			if !o.print(d.Msg) {
				continue
			}
			n++
			if o.Count > 0 && n >= o.Count {
				return nil
			}
		}
	}
}

// subscribe starts delivering o's messages to push: the replay of
// o.Stream (an ordered consumer, from o.Since when set), or a plain
// subscription to what is published from now on. unsubscribe stops it.
func subscribe(ctx context.Context, nc *nats.Conn, o Options, push func(delivered)) (cons jetstream.Consumer, unsubscribe func(), err error) {
	if o.Stream == "" {
		sub, err := nc.Subscribe(o.Subject, func(m *nats.Msg) { push(delivered{Msg: m}) })
		if err != nil {
			return nil, nil, fmt.Errorf("subscribe %s: %w", o.Subject, err)
		}
		unsubscribe = func() { _ = sub.Unsubscribe() }
		if err := nc.Flush(); err != nil {
			unsubscribe()
			return nil, nil, err
		}
		return nil, unsubscribe, nil
	}
	newJS := o.JetStream
	if newJS == nil {
		newJS = func(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.New(nc) }
	}
	js, err := newJS(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("JetStream: %w", err)
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{o.Subject}}
	if !o.Since.IsZero() {
		since := o.Since
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	if cons, err = js.OrderedConsumer(ctx, o.Stream, cfg); err != nil {
		return nil, nil, fmt.Errorf("stream %s: %w", o.Stream, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		d := delivered{Msg: &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}}
		if md, err := m.Metadata(); err == nil {
			d.stored, d.pending = md.Timestamp, md.NumPending
		}
		push(d)
	})
	if err != nil {
		return nil, nil, err
	}
	return cons, cc.Stop, nil
}

// print writes m to o.Out, as a line or as JSON, unless o.Filter leaves it
// out (false). An undecodable message is shown whatever the filter: it
// cannot be applied.
func (o *Options) print(m *nats.Msg) bool {
	env, err := event.DecodeMessage(m.Header, m.Data)
	switch {
	case err != nil:
		fmt.Fprintln(o.Out, undecodable(m.Subject, err))
	case !o.Filter.Match(&env):
		return false
	case o.JSON:
		b, err := JSONLine(m.Header, m.Data)
		if err != nil {
			fmt.Fprintln(o.Out, undecodable(m.Subject, err))
		} else {
			fmt.Fprintf(o.Out, "%s\n", b)
		}
	default:
		fmt.Fprintln(o.Out, format(&env))
	}
	return true
}

// delivered is a message and, from a stream, when JetStream stored it and
// how many messages of the consumer were left after it.
type delivered struct {
	*nats.Msg
	stored  time.Time
	pending uint64
}

// replayed reports whether a replay bounded by until is over: the clock is
// past until and cons has nothing left to deliver (queued: messages
// received and not yet printed).
func replayed(ctx context.Context, cons jetstream.Consumer, until time.Time, queued int) (bool, error) {
	if time.Now().Before(until) || queued > 0 {
		return false, nil
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, fmt.Errorf("consumer info: %w", err)
	}
	return info.NumPending == 0, nil
}

// Format renders one message: time, type, kind, namespace/name,
// resourceVersion, origin (and the sync details for control events). A
// value with a control character or invalid UTF-8 (a custom resource's name
// may hold an escape sequence) is shown quoted and escaped, never raw.
func Format(subject string, header nats.Header, data []byte) string {
	env, err := event.DecodeMessage(header, data)
	if err != nil {
		return undecodable(subject, err)
	}
	return format(&env)
}

func undecodable(subject string, err error) string {
	return fmt.Sprintf("%-30s  undecodable message on %s: %s", time.Now().UTC().Format(time.RFC3339Nano), safe(subject), safe(err.Error()))
}

func format(env *event.Envelope) string {
	ts := env.Time.UTC().Format("15:04:05.000")
	typ := env.Type
	if i := strings.LastIndex(typ, ".object."); i >= 0 {
		typ = typ[i+len(".object."):]
	} else if i := strings.LastIndex(typ, ".source."); i >= 0 {
		typ = typ[i+len(".source."):]
	}
	typ = safe(typ)
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
			safe(env.RelaydSource), safe(orDash(d.Namespace)), env.RelaydEpoch, safe(d.Reason), d.From)
		if d.To != "" {
			line += fmt.Sprintf(" to=%q counts=%s", d.To, safe(string(d.Counts)))
		}
		return line
	}
	name := env.K8sName
	if env.K8sNamespace != "" {
		name = env.K8sNamespace + "/" + name
	}
	line := fmt.Sprintf("%s  %-15s %-22s %-40s rv=%-8s origin=%s", ts, typ, safe(env.K8sKind), safe(name), safe(env.K8sResourceVersion), safe(env.RelaydOrigin))
	switch {
	case env.RelaydUnencodable:
		line += " (unencodable: sent without data)"
	case env.RelaydOversize:
		line += " (oversize: sent as reference)"
	}
	if env.RelaydFinalUnknown {
		line += " (final state unknown)"
	}
	if env.RelaydScope != "" {
		line += " (" + safe(env.RelaydScope) + " the filter)"
	}
	return line
}

// safe returns s as is when every rune is printable, else quoted with Go
// escapes (\x1b, \u009b, \xff for an invalid byte): a terminal never gets
// a raw control character or escape sequence from a published value.
func safe(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) && r != ' ' {
			return strconv.Quote(s)
		}
	}
	return s
}

// JSONLine renders a message as one structured-mode CloudEvent on one line,
// for jq: a structured message's body, compacted; a binary message's ce-*
// attributes and body assembled into the same form (relaydepoch a number,
// relaydoversize and relaydfinalunknown booleans, as in structured mode).
// Besides what JSON escapes itself, DEL, the C1 control characters and
// invalid UTF-8 are escaped (\u007f, \u009b, \ufffd), so the line is safe on
// a terminal.
func JSONLine(header nats.Header, data []byte) ([]byte, error) {
	env, err := event.DecodeMessage(header, data)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if ct, _, _ := strings.Cut(header.Get(event.HeaderContentType), ";"); strings.EqualFold(strings.TrimSpace(ct), event.ContentTypeCloudEvents) {
		if err := json.Compact(&b, data); err != nil {
			return nil, err
		}
	} else {
		j, err := json.Marshal(structuredOf(&env))
		if err != nil {
			return nil, fmt.Errorf("binary-mode message: %w", err)
		}
		b.Write(j)
	}
	return escapeForTerminal(b.Bytes()), nil
}

// structured is a binary-mode event in structured form: relayd's attributes
// in its order, absent ones left out.
type structured struct {
	SpecVersion        string          `json:"specversion"`
	ID                 string          `json:"id"`
	Source             string          `json:"source"`
	Type               string          `json:"type"`
	Subject            string          `json:"subject,omitempty"`
	Time               string          `json:"time,omitempty"`
	DataContentType    string          `json:"datacontenttype,omitempty"`
	K8sCluster         string          `json:"k8scluster,omitempty"`
	K8sAPIVersion      string          `json:"k8sapiversion,omitempty"`
	K8sKind            string          `json:"k8skind,omitempty"`
	K8sResource        string          `json:"k8sresource,omitempty"`
	K8sNamespace       string          `json:"k8snamespace,omitempty"`
	K8sName            string          `json:"k8sname,omitempty"`
	K8sUID             string          `json:"k8suid,omitempty"`
	K8sResourceVersion string          `json:"k8sresourceversion,omitempty"`
	RelaydSource       string          `json:"relaydsource,omitempty"`
	RelaydOrigin       string          `json:"relaydorigin,omitempty"`
	RelaydEpoch        uint64          `json:"relaydepoch"`
	RelaydPayload      string          `json:"relaydpayload,omitempty"`
	RelaydOversize     bool            `json:"relaydoversize,omitempty"`
	RelaydUnencodable  bool            `json:"relaydunencodable,omitempty"`
	RelaydFinalUnknown bool            `json:"relaydfinalunknown,omitempty"`
	RelaydDropped      string          `json:"relayddropped,omitempty"`
	RelaydScope        string          `json:"relaydscope,omitempty"`
	Data               json.RawMessage `json:"data,omitempty"`
}

func structuredOf(env *event.Envelope) structured {
	s := structured{
		SpecVersion: env.SpecVersion, ID: env.ID, Source: env.Source, Type: env.Type, Subject: env.Subject,
		DataContentType: env.DataContentType, K8sCluster: env.K8sCluster, K8sAPIVersion: env.K8sAPIVersion,
		K8sKind: env.K8sKind, K8sResource: env.K8sResource, K8sNamespace: env.K8sNamespace, K8sName: env.K8sName,
		K8sUID: env.K8sUID, K8sResourceVersion: env.K8sResourceVersion, RelaydSource: env.RelaydSource,
		RelaydOrigin: env.RelaydOrigin, RelaydEpoch: env.RelaydEpoch, RelaydPayload: env.RelaydPayload,
		RelaydOversize: env.RelaydOversize, RelaydUnencodable: env.RelaydUnencodable, RelaydFinalUnknown: env.RelaydFinalUnknown, RelaydDropped: env.RelaydDropped,
		RelaydScope: env.RelaydScope, Data: env.Data,
	}
	if !env.Time.IsZero() {
		s.Time = env.Time.UTC().Format(event.TimeLayout)
	}
	return s
}

// escapeForTerminal escapes, in valid JSON, the characters JSON lets appear
// raw inside strings that a terminal may act on: DEL and the C1 controls
// (\u0080-\u009f, e.g. CSI), and bytes that are not UTF-8 (\ufffd). In
// valid JSON they can only occur inside strings, where these escapes mean
// the same character.
func escapeForTerminal(b []byte) []byte {
	clean := true
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == 0x7f || r >= 0x80 && r <= 0x9f || r == utf8.RuneError && n == 1 {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			out = append(out, `\ufffd`...)
		case r == 0x7f || r >= 0x80 && r <= 0x9f:
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
