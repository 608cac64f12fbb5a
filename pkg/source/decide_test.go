package source

// Table tests, without servers, of the decisions Run and watch make: which
// request comes next, what an attempt's error leads to, how long to wait,
// what a watch returns when its stream fails or ends, and what a BOOKMARK
// or ERROR frame means.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/relayd/relayd/internal/retry"
	"github.com/relayd/relayd/pkg/event"
)

var (
	cmGR           = schema.GroupResource{Resource: "configmaps"}
	errExpired     = apierrors.NewResourceExpired("too old resource version: 5 (9)")
	errGone        = &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonGone, Message: "gone"}}
	errForbidden   = apierrors.NewForbidden(cmGR, "", errors.New("no"))
	errUnauth      = apierrors.NewUnauthorized("who")
	errNotFound    = apierrors.NewNotFound(cmGR, "")
	errBadRequest  = apierrors.NewBadRequest("sendInitialEvents is not supported")
	errInvalid     = apierrors.NewInvalid(schema.GroupKind{Kind: "ListOptions"}, "", field.ErrorList{field.Forbidden(field.NewPath("sendInitialEvents"), "off")})
	errNotAccepted = &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 406, Reason: metav1.StatusReasonNotAcceptable, Message: "only application/json"}}
)

func TestDecideNext(t *testing.T) {
	for _, c := range []struct {
		rv                string
		listing, noStream bool
		want              nextRequest
	}{
		{"", false, false, nextCurrentRV},
		{"", false, true, nextCurrentRV},
		{"7", false, false, nextWatch},
		{"7", false, true, nextWatch},
		{"", true, false, nextStreamList},
		{"7", true, false, nextStreamList},
		{"", true, true, nextListPages},
		{"7", true, true, nextListPages},
	} {
		if got := decideNext(c.rv, c.listing, c.noStream); got != c.want {
			t.Errorf("decideNext(%q, listing %v, noStream %v) = %v, want %v", c.rv, c.listing, c.noStream, got, c.want)
		}
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		name         string
		err          error
		metadataOnly bool
		want         outcome
		reason       string
	}{
		{"server ended the watch", nil, false, outcomeResume, ReasonTimeout},
		{"streaming list refused", fmt.Errorf("%w: %v", errStreamingUnsupported, errBadRequest), false, outcomeNoStream, ""},
		{"410 Expired", errExpired, false, outcomeRelist, ReasonExpired},
		{"410 Gone", errGone, false, outcomeRelist, ReasonExpired},
		{"handler", handlerError{errors.New("publish: timeout")}, false, outcomeHandler, ""},
		{"handler, a permanent-looking error", handlerError{errForbidden}, false, outcomeHandler, ""},
		{"406, metadata only", errNotAccepted, true, outcomeWholeObjects, ""},
		{"406, whole objects", errNotAccepted, false, outcomeRetry, ReasonError},
		{"403", errForbidden, false, outcomePermanent, ReasonForbidden},
		{"401", errUnauth, false, outcomePermanent, ReasonForbidden},
		{"404", errNotFound, true, outcomePermanent, ReasonNotFound},
		{"idle", errIdle, false, outcomeRetry, ReasonIdle},
		{"connection closed", &url.Error{Op: "Get", URL: "https://x", Err: io.EOF}, false, outcomeRetry, ReasonClosed},
		{"cut frame", io.ErrUnexpectedEOF, false, outcomeRetry, ReasonClosed},
		{"bad frame", errors.New("bad watch frame: invalid character"), false, outcomeRetry, ReasonError},
		{"500", apierrors.NewInternalError(errors.New("etcd")), false, outcomeRetry, ReasonError},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, reason := outcomeOf(c.err, c.metadataOnly)
			if out != c.want || reason != c.reason {
				t.Errorf("outcomeOf(%v, metadataOnly %v) = %v, %q; want %v, %q", c.err, c.metadataOnly, out, reason, c.want, c.reason)
			}
		})
	}
}

// TestPause follows one watcher's waits on a fake clock: each step is the
// time the clock moves (the last wait, then the attempt), the restart
// reason, and the wait pause returns.
func TestPause(t *testing.T) {
	policy := wait.Backoff{Duration: time.Second, Factor: 2, Steps: 1 << 30, Cap: time.Minute}
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC))
	backoff := retry.NewDelays(policy, clk)
	for i, c := range []struct {
		name   string
		ran    time.Duration // since the last wait ended
		reason string
		want   time.Duration
	}{
		{"410 after a short first run", time.Second, ReasonExpired, time.Second},
		{"repeated failure", time.Second, ReasonClosed, 2 * time.Second},
		{"server ended the watch", time.Second, ReasonTimeout, 0},
		{"410 storm", time.Second, ReasonExpired, 4 * time.Second},
		{"a minute is not long", time.Minute, ReasonError, 8 * time.Second},
		{"failure after a healthy run", 2 * time.Minute, ReasonIdle, time.Second},
		{"grows again", time.Second, ReasonError, 2 * time.Second},
		{"410 after a healthy run", 2 * time.Minute, ReasonExpired, 0},
		{"after it, the second delay", 0, ReasonError, 2 * time.Second},
		{"growing", time.Second, ReasonError, 4 * time.Second},
		{"growing", time.Second, ReasonError, 8 * time.Second},
		{"growing", time.Second, ReasonError, 16 * time.Second},
		{"growing", time.Second, ReasonError, 32 * time.Second},
		{"capped", time.Second, ReasonError, time.Minute},
		{"capped", time.Second, ReasonError, time.Minute},
		{"healthy minute after the cap", time.Minute + time.Second, ReasonError, time.Second},
	} {
		clk.SetTime(clk.Now().Add(c.ran))
		got := pause(backoff, c.reason)
		if got != c.want {
			t.Errorf("step %d (%s): pause = %v, want %v", i, c.name, got, c.want)
		}
		clk.SetTime(clk.Now().Add(got))
	}
}

func TestRefusesMetadata(t *testing.T) {
	for _, c := range []struct {
		err          error
		metadataOnly bool
		want         bool
	}{
		{errNotAccepted, true, true},
		{errNotAccepted, false, false},
		{fmt.Errorf("list: %w", errNotAccepted), true, true},
		{errBadRequest, true, false},
		{errForbidden, true, false},
	} {
		if got := refusesMetadata(c.err, c.metadataOnly); got != c.want {
			t.Errorf("refusesMetadata(%v, %v) = %v, want %v", c.err, c.metadataOnly, got, c.want)
		}
	}
}

func TestWatchStartErr(t *testing.T) {
	other := errors.New("dial tcp: connection refused")
	for _, c := range []struct {
		name       string
		cause, err error
		streamList bool
		want       error // compared with errors.Is
	}{
		{"idle timer fired", errIdle, context.Canceled, true, errIdle},
		{"streaming list: 400", nil, errBadRequest, true, errStreamingUnsupported},
		{"streaming list: 422", nil, errInvalid, true, errStreamingUnsupported},
		{"streaming list: 403", nil, errForbidden, true, errForbidden},
		{"watch: 400", nil, errBadRequest, false, errBadRequest},
		{"watch: 410", nil, errGone, false, errGone},
		{"watch: connection", nil, other, false, other},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := watchStartErr(c.cause, c.err, c.streamList)
			if !errors.Is(got, c.want) {
				t.Errorf("watchStartErr = %v, want %v", got, c.want)
			}
			if errors.Is(c.want, errStreamingUnsupported) && !strings.Contains(got.Error(), c.err.Error()) {
				t.Errorf("watchStartErr = %q, want it to say %q", got, c.err)
			}
		})
	}
}

func TestWatchEndErr(t *testing.T) {
	reset := errors.New("read: connection reset by peer")
	for _, c := range []struct {
		name       string
		cause, err error
		streamList bool
		want       error
	}{
		{"idle timer fired", errIdle, context.Canceled, false, errIdle},
		{"server ended the watch", nil, io.EOF, false, nil},
		{"server ended the streaming list early", nil, io.EOF, true, io.ErrUnexpectedEOF},
		{"cut inside a frame", nil, io.ErrUnexpectedEOF, false, io.ErrUnexpectedEOF},
		{"connection reset", nil, reset, true, reset},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := watchEndErr(c.cause, c.err, c.streamList); got != c.want {
				t.Errorf("watchEndErr = %v, want %v", got, c.want)
			}
		})
	}
}

func TestClassifyBookmark(t *testing.T) {
	end := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}`)
	plain := []byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"9"}}`)
	for _, c := range []struct {
		name       string
		streamList bool
		obj        []byte
		rv         string
		want       bookmarkKind
	}{
		{"end of the initial events", true, end, "9", bookmarkListEnd},
		{"end of the initial events without a resourceVersion", true, end, "", bookmarkListEnd},
		{"bookmark inside the initial events", true, plain, "9", bookmarkIgnored},
		{"progress", false, plain, "9", bookmarkProgress},
		{"late initial-events-end annotation", false, end, "9", bookmarkProgress},
		{"progress without a resourceVersion", false, plain, "", bookmarkIgnored},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := classifyBookmark(c.streamList, c.obj, c.rv); got != c.want {
				t.Errorf("classifyBookmark = %v, want %v", got, c.want)
			}
		})
	}
}

func TestErrorFrameErr(t *testing.T) {
	status := func(code int, reason, msg string) string {
		return fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"reason":%q,"code":%d}`, msg, reason, code)
	}
	for _, c := range []struct {
		name       string
		obj        string
		streamList bool
		check      func(error) bool
		says       string
	}{
		{"410 in a watch", status(410, "Expired", "too old"), false, apierrors.IsResourceExpired, "too old"},
		{"410 in a streaming list", status(410, "Expired", "too old"), true, apierrors.IsResourceExpired, "too old"},
		{"400 in a streaming list", status(400, "BadRequest", "no"), true, isUnsupported, "no"},
		{"422 in a streaming list", status(422, "Invalid", "no"), true, isUnsupported, "no"},
		{"RequestWatchProgress in a streaming list", status(500, "InternalError", "RequestWatchProgress is off"), true, isUnsupported, "RequestWatchProgress"},
		{"400 in a watch", status(400, "BadRequest", "no"), false, apierrors.IsBadRequest, "no"},
		{"500 in a watch", status(500, "InternalError", "RequestWatchProgress is off"), false, apierrors.IsInternalError, "RequestWatchProgress"},
		{"no message", `{"kind":"Status","code":500}`, false, apierrors.IsInternalError, `ERROR watch frame without a message (code 500, reason ""): {"kind":"Status","code":500}`},
		{"not a Status", `{"kind":"ConfigMap"}`, false, isStatus, `(code 0, reason ""): {"kind":"ConfigMap"}`},
		{"not JSON", `[1,`, false, func(err error) bool { return !isStatus(err) }, "bad ERROR frame"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := errorFrameErr([]byte(c.obj), c.streamList)
			if err == nil || !c.check(err) || !strings.Contains(err.Error(), c.says) {
				t.Errorf("errorFrameErr(%s) = %v, want one that says %q", c.obj, err, c.says)
			}
			if !c.streamList && isUnsupported(err) {
				t.Errorf("errorFrameErr(%s) = %v outside a streaming list", c.obj, err)
			}
		})
	}
}

func isUnsupported(err error) bool { return errors.Is(err, errStreamingUnsupported) }

func isStatus(err error) bool {
	var s apierrors.APIStatus
	return errors.As(err, &s)
}

// The watch request's parameters, read from its URL: no request is made.
func TestWatchRequest(t *testing.T) {
	client, err := rest.RESTClientFor(&rest.Config{
		Host: "https://apiserver.invalid", APIPath: "/api",
		ContentConfig: rest.ContentConfig{GroupVersion: &schema.GroupVersion{Version: "v1"},
			NegotiatedSerializer: scheme.Codecs.WithoutConversion(), ContentType: "application/json"},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Options{Client: client, Logger: zap.NewNop(), Metrics: m, Source: "s", Namespace: "ns",
		LabelSelector: "app=a", Timeout: 90 * time.Second,
		Resource: event.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}})
	if err != nil {
		t.Fatal(err)
	}
	w.rv = "42"
	for _, c := range []struct {
		streamList bool
		want       string
	}{
		{false, "allowWatchBookmarks=true&labelSelector=app%3Da&resourceVersion=42&timeoutSeconds=90&watch=true"},
		{true, "allowWatchBookmarks=true&labelSelector=app%3Da&resourceVersion=&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&timeoutSeconds=90&watch=true"},
	} {
		u := w.watchRequest(c.streamList).URL()
		if u.Path != "/api/v1/namespaces/ns/configmaps" || u.RawQuery != c.want {
			t.Errorf("streamList %v: %s?%s, want /api/v1/namespaces/ns/configmaps?%s", c.streamList, u.Path, u.RawQuery, c.want)
		}
	}
}
