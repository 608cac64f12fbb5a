package record

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/relayd/relayd/internal/chaos/history"
	"github.com/relayd/relayd/pkg/event"
)

// ReadStream reads every message of the stream, in order, and decodes it.
// A message that does not decode is an error: relayd never publishes one.
func ReadStream(ctx context.Context, js jetstream.JetStream, stream string) ([]history.Event, error) {
	evs, _, err := ReadStreamWindow(ctx, js, stream)
	return evs, err
}

// ReadStreamWindow is ReadStream, and also returns the stream's duplicate
// window. Every event carries the Nats-Msg-Id it was stored with and the
// time JetStream stored it.
func ReadStreamWindow(ctx context.Context, js jetstream.JetStream, stream string) ([]history.Event, time.Duration, error) {
	return ReadStreamShaped(ctx, js, stream, nil)
}

// ReadStreamShaped is ReadStreamWindow, and also probes the object
// messages of the sources in shaping (Probe).
func ReadStreamShaped(ctx context.Context, js jetstream.JetStream, stream string, shaping map[string]history.Shaping) ([]history.Event, time.Duration, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, 0, fmt.Errorf("reader: stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("reader: stream %s: %w", stream, err)
	}
	var out []history.Event
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		rm, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, 0, fmt.Errorf("reader: message %d: %w", seq, err)
		}
		e, err := Decode(seq, rm.Header, rm.Data)
		if err != nil {
			return nil, 0, fmt.Errorf("reader: message %d on %s: %w", seq, rm.Subject, err)
		}
		if e.Kind == event.HeartbeatToken {
			continue
		}
		if sh, ok := shaping[e.Source]; ok && sh.Probed() && e.Kind == "object" {
			if e.Content, err = Probe(sh, rm.Header, rm.Data); err != nil {
				return nil, 0, fmt.Errorf("reader: message %d on %s: %w", seq, rm.Subject, err)
			}
		}
		e.MsgID = rm.Header.Get(event.HeaderMsgID)
		e.Stored = rm.Time
		out = append(out, e)
	}
	return out, info.Config.Duplicates, nil
}

// Decode turns one stored message into a history event.
func Decode(seq uint64, header map[string][]string, data []byte) (history.Event, error) {
	env, err := event.DecodeMessage(header, data)
	if err != nil {
		return history.Event{}, err
	}
	e := history.Event{Seq: seq, Source: env.RelaydSource, ID: env.ID, Epoch: env.RelaydEpoch, Origin: env.RelaydOrigin}
	dot := strings.LastIndex(env.Type, ".")
	switch {
	case strings.HasSuffix(env.Type[:max(dot, 0)], ".object"):
		e.Kind, e.Type = "object", env.Type[dot+1:]
		e.UID, e.Namespace, e.Name, e.Unknown, e.Unencodable = env.K8sUID, env.K8sNamespace, env.K8sName, env.RelaydFinalUnknown, env.RelaydUnencodable
		if e.Scope, err = scopeOf(header, data); err != nil {
			return e, err
		}
		if e.RV, err = history.ParseRV(env.K8sResourceVersion); err != nil {
			return e, err
		}
	case strings.HasSuffix(env.Type, ".sync.started"), strings.HasSuffix(env.Type, ".sync.completed"):
		e.Kind = "sync." + env.Type[dot+1:]
		var d struct {
			Reason string `json:"reason"`
			From   string `json:"fromResourceVersion"`
			To     string `json:"toResourceVersion"`
			Full   bool   `json:"full"`
		}
		if err := json.Unmarshal(env.Data, &d); err != nil {
			return e, fmt.Errorf("sync marker data: %w", err)
		}
		e.Reason, e.Full = d.Reason, d.Full
		if e.From, err = history.ParseRV(d.From); err != nil {
			return e, err
		}
		if e.To, err = history.ParseRV(d.To); err != nil {
			return e, err
		}
	case strings.HasSuffix(env.Type, ".source."+event.HeartbeatToken):
		e.Kind = event.HeartbeatToken // not part of the history: ReadStreamShaped skips it
	default:
		return e, fmt.Errorf("unknown event type %q", env.Type)
	}
	return e, nil
}

// scopeOf reads the relaydscope extension of a message: the ce-relaydscope
// header in binary mode, the member of the structured document otherwise
// (read here rather than through the envelope, so that the checker does
// not take relayd's decoder's word for it).
func scopeOf(header map[string][]string, data []byte) (string, error) {
	ct := ""
	for k, vs := range header {
		switch {
		case len(vs) == 0:
		case strings.EqualFold(k, event.HeaderPrefix+"relaydscope"):
			return vs[0], nil
		case strings.EqualFold(k, event.HeaderContentType):
			ct, _, _ = strings.Cut(vs[0], ";")
		}
	}
	if !strings.EqualFold(strings.TrimSpace(ct), event.ContentTypeCloudEvents) {
		return "", nil
	}
	var d struct {
		Scope string `json:"relaydscope"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return "", fmt.Errorf("relaydscope: %w", err)
	}
	return d.Scope, nil
}

// FinalList lists every kind in namespace with a consistent read
// (resourceVersion ""), and returns the objects and the list's
// resourceVersion (the largest over the kinds).
func FinalList(ctx context.Context, dyn dynamic.Interface, namespace string, kinds []Kind) ([]history.Object, int64, error) {
	var out []history.Object
	var rv int64
	for _, k := range kinds {
		l, err := dyn.Resource(k.GVR).Namespace(k.ns(namespace)).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, 0, fmt.Errorf("final list of %s: %w", k.GVR.Resource, err)
		}
		lrv, err := history.ParseRV(l.GetResourceVersion())
		if err != nil {
			return nil, 0, err
		}
		rv = max(rv, lrv)
		for _, o := range l.Items {
			orv, err := history.ParseRV(o.GetResourceVersion())
			if err != nil {
				return nil, 0, err
			}
			out = append(out, history.Object{Source: k.Source, UID: string(o.GetUID()), Namespace: o.GetNamespace(), Name: o.GetName(), RV: orv})
		}
	}
	return out, rv, nil
}
