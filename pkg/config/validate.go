package config

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/relayd/relayd/pkg/event"
)

// Problem is one thing wrong with a configuration.
type Problem struct {
	// Source is the file name given to Parse or Load; empty for a Config
	// built in Go.
	Source string
	// Line is the 1-based line in Source of the offending key (or of the
	// nearest enclosing key when the key is absent); 0 when unknown.
	Line int
	// Column is the 1-based column in Line of the problem inside a value
	// (a filter's expression); 0 when the problem is the key's as a whole.
	Column int
	// Path is the key path, e.g. "sources[2].namespaces[0]"; empty for
	// problems with the file as a whole.
	Path string
	// Name is what the message calls the key when it is not Path (a nats
	// key set by a flag of `relayd tail`, NATS.Names); empty otherwise.
	Name string
	// Message says what is wrong, and usually what is expected.
	Message string

	// in is where in a filter expression the problem is, for annotate to
	// place it in the file; nil for other problems.
	in *exprPos
}

// Error formats p as "source:line: path: message" ("source:line:column:"
// when Column is known), with Name for path
// when set, leaving out the parts that are unknown or empty (see the
// package doc).
func (p Problem) Error() string {
	var b strings.Builder
	switch {
	case p.Source != "" && p.Line > 0 && p.Column > 0:
		fmt.Fprintf(&b, "%s:%d:%d: ", p.Source, p.Line, p.Column)
	case p.Source != "" && p.Line > 0:
		fmt.Fprintf(&b, "%s:%d: ", p.Source, p.Line)
	case p.Source != "":
		b.WriteString(p.Source + ": ")
	case p.Line > 0:
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	switch {
	case p.Name != "":
		b.WriteString(p.Name + ": ")
	case p.Path != "":
		b.WriteString(p.Path + ": ")
	}
	b.WriteString(p.Message)
	return b.String()
}

// ValidationError holds every problem found in a configuration. Parse, Load,
// Validate and ResolveDefaults return it (as a *ValidationError) for any
// problem with the configuration itself.
type ValidationError struct {
	// Problems in the order they were found: decoding problems in file
	// order, then validation problems in key order.
	Problems []Problem
}

// Error is errors.Join of the problems: one line each, formatted by
// Problem.Error ("source:line: path: message").
func (e *ValidationError) Error() string {
	if err := errors.Join(e.Unwrap()...); err != nil {
		return err.Error()
	}
	return "no problems"
}

// Unwrap returns the problems as errors, for errors.As and errors.Is.
func (e *ValidationError) Unwrap() []error {
	errs := make([]error, len(e.Problems))
	for i, p := range e.Problems {
		errs[i] = p
	}
	return errs
}

// Validate checks the whole configuration and returns nil or a
// *ValidationError with every problem found. Unset fields are checked as
// their defaults (Validate does not modify c). For a Config from Parse or
// Load, each problem carries the file name and line.
func (c *Config) Validate() error {
	if ps := c.problems(); len(ps) > 0 {
		return &ValidationError{Problems: ps}
	}
	return nil
}

// problems validates a copy of c with defaults applied.
func (c *Config) problems() []Problem {
	d := *c
	d.Sources = slices.Clone(c.Sources)
	d.ApplyDefaults()
	v := &validator{}
	v.config(&d)
	for i := range v.problems {
		c.origin.annotate(&v.problems[i])
	}
	return v.problems
}

// annotate sets the source and, when unknown, the line of p.
func (o *origin) annotate(p *Problem) {
	if o == nil {
		return
	}
	p.Source = o.source
	if p.in != nil {
		p.Line, p.Column = o.placeExpr(p.Path, *p.in)
	}
	for path := p.Path; p.Line == 0 && path != ""; path = parentPath(path) {
		p.Line = o.lines[path]
	}
}

// parentPath drops the last element of a path: "a.b[2]" -> "a.b" -> "a".
func parentPath(path string) string {
	i := strings.LastIndexAny(path, ".[")
	if i < 0 {
		return ""
	}
	return path[:i]
}

type validator struct {
	problems []Problem
	// names are the names of the nats keys (NATS.Names), for
	// ValidateConnection; nil when validating a config file.
	names KeyNames
}

func (v *validator) add(path, format string, args ...any) {
	p := Problem{Path: path, Message: fmt.Sprintf(format, args...)}
	if name := v.names.Of(path); name != path {
		p.Name = name
	}
	v.problems = append(v.problems, p)
}

func (v *validator) config(c *Config) {
	switch {
	case c.Cluster == "":
		v.add("cluster", "required")
	case !isToken(c.Cluster):
		v.add("cluster", "%q is not a valid cluster name (must be letters, digits, '_' and '-')", c.Cluster)
	}
	if !isSubjectPrefix(c.Prefix) {
		v.add("prefix", "%q is not a valid prefix (must be dot-separated tokens of letters, digits, '_' and '-')", c.Prefix)
	}
	v.nats(&c.NATS)
	v.fingerprintKey(c)
	if m := c.CloudEvents.Mode; !slices.Contains(modes, m) {
		v.add("cloudevents.mode", "%q is not a valid mode (must be %s)", m, orList(modes))
	}
	v.checkpoint(&c.Checkpoint)
	v.watch(&c.Watch)
	v.positive("shutdown.drainTimeout", c.Shutdown.DrainTimeout)
	v.heartbeat("heartbeatInterval", c.HeartbeatInterval)
	v.resync(c)
	v.sources(c.Sources)
	v.sharding(c)
}

// resync checks the resync block: the requesters' inbox prefixes must be
// valid prefixes outside relayd's own subjects (prefix, prefix-ctl).
func (v *validator) resync(c *Config) {
	r := &c.Resync
	for i, p := range r.RequesterInboxPrefixes {
		path := fmt.Sprintf("resync.requesterInboxPrefixes[%d]", i)
		if !isSubjectPrefix(p) {
			v.add(path, "%q is not a valid inbox prefix (must be dot-separated tokens of letters, digits, '_' and '-', no wildcards)", p)
			continue
		}
		if !isSubjectPrefix(c.Prefix) {
			continue // reported as prefix
		}
		for _, own := range []string{c.Prefix, c.Prefix + "-ctl"} {
			if p == own || strings.HasPrefix(p, own+".") || strings.HasPrefix(own, p+".") {
				v.add(path, "%q overlaps relayd's own subjects %s.> (prefix %q): relayd's answers would land there", p, own, c.Prefix)
				break
			}
		}
	}
	if r.MinFullInterval < Duration(MinMinFullInterval) {
		v.add("resync.minFullInterval", "must be at least %s, got %s", Duration(MinMinFullInterval), r.MinFullInterval)
	}
}

func (v *validator) sharding(c *Config) {
	sh := &c.Sharding
	if !isDNS1123Label(sh.LeasePrefix) {
		v.add("sharding.leasePrefix", "%q is not a valid prefix (must be a DNS-1123 label)", sh.LeasePrefix)
	} else {
		for i := range c.Sources {
			if name := sh.LeasePrefix + "-" + c.Sources[i].Name; isDNS1123Label(c.Sources[i].Name) && len(validation.IsDNS1123Subdomain(name)) > 0 {
				v.add("sharding.leasePrefix", "makes the Lease name %q of source %q invalid (must be a DNS-1123 subdomain)", name, c.Sources[i].Name)
			}
		}
	}
	v.positive("sharding.retryPeriod", sh.RetryPeriod)
	if sh.RenewDeadline <= sh.RetryPeriod {
		v.add("sharding.renewDeadline", "must be greater than sharding.retryPeriod (%s), got %s", sh.RetryPeriod, sh.RenewDeadline)
	}
	if sh.LeaseDuration <= sh.RenewDeadline {
		v.add("sharding.leaseDuration", "must be greater than sharding.renewDeadline (%s), got %s", sh.RenewDeadline, sh.LeaseDuration)
	}
}

func (v *validator) nats(n *NATS) {
	v.natsConnection(n)
	v.positive("nats.publishTimeout", n.PublishTimeout)
	v.intRange("nats.maxInFlight", n.MaxInFlight, 1, 65536)
	v.sizeRange("nats.maxInFlightBytes", n.MaxInFlightBytes, 1<<20, 1<<40)
	v.sizeRange("nats.maxInFlightBytesPerWatch", n.MaxInFlightBytesPerWatch, 1<<20, 1<<40)
	if n.MaxInFlightBytesPerWatch > n.MaxInFlightBytes {
		v.add("nats.maxInFlightBytesPerWatch", "must not exceed nats.maxInFlightBytes (%d), got %d", n.MaxInFlightBytes, n.MaxInFlightBytesPerWatch)
	}

	s := &n.Stream
	switch {
	case s.Name == "":
		v.add("nats.stream.name", "required")
	case !isToken(s.Name):
		v.add("nats.stream.name", "%q is not a valid stream name (must be letters, digits, '_' and '-')", s.Name)
	}
	if s.DuplicateWindow < Duration(time.Minute) {
		v.add("nats.stream.duplicateWindow", "must be at least 1m, got %s", s.DuplicateWindow)
	} else if s.MaxAge > 0 && s.DuplicateWindow > s.MaxAge {
		v.add("nats.stream.duplicateWindow", "must not exceed nats.stream.maxAge (%s), got %s", s.MaxAge, s.DuplicateWindow)
	}
	v.intRange("nats.stream.replicas", s.Replicas, 1, 5)
	if !slices.Contains(storages, s.Storage) {
		v.add("nats.stream.storage", "%q is not a valid storage type (must be %s)", s.Storage, orList(storages))
	}
	if s.MaxAge < 0 {
		v.add("nats.stream.maxAge", "must not be negative (0 takes the default, 168h), got %s", s.MaxAge)
	}
	if s.MaxBytes < -1 {
		v.add("nats.stream.maxBytes", "must be -1 (unlimited) or positive, got %d", s.MaxBytes)
	}

	ix := &n.Index
	if ix.Bucket != "" && !isToken(ix.Bucket) {
		v.add("nats.index.bucket", "%q is not a valid bucket name (must be letters, digits, '_' and '-')", ix.Bucket)
	}
	v.intRange("nats.index.replicas", ix.Replicas, 1, 5)
	if !slices.Contains(storages, ix.Storage) {
		v.add("nats.index.storage", "%q is not a valid storage type (must be %s)", ix.Storage, orList(storages))
	}
}

// authKeys are the nats keys that each select a way of authenticating, in
// the order they are reported.
var authKeys = []string{"credentialsFile", "nkeySeedFile", "tokenFile", "userFile"}

// natsAuth checks that at most one way of authenticating is set and that
// the keys that go in pairs are given together.
func (v *validator) natsAuth(n *NATS) {
	set := map[string]bool{
		"credentialsFile": n.CredentialsFile != "",
		"nkeySeedFile":    n.NkeySeedFile != "",
		"tokenFile":       n.TokenFile != "",
		"userFile":        n.UserFile != "" || n.PasswordFile != "",
	}
	first := ""
	for _, k := range authKeys {
		if !set[k] {
			continue
		}
		if first == "" {
			first = k
			continue
		}
		key := k
		if k == "userFile" && n.UserFile == "" {
			key = "passwordFile"
		}
		v.add("nats."+key, "cannot be combined with %s (set only one)", v.names.Of("nats."+first))
	}
	v.pair("nats.userFile", n.UserFile, "nats.passwordFile", n.PasswordFile)
	t := &n.TLS
	v.pair("nats.tls.certFile", t.CertFile, "nats.tls.keyFile", t.KeyFile)
	if t.ServerName != "" && strings.ContainsFunc(t.ServerName, func(r rune) bool { return r <= ' ' || r == '/' || r == 0x7f }) {
		v.add("nats.tls.serverName", "%q is not a valid host name", t.ServerName)
	}
	if n.JSDomain != "" && !isToken(n.JSDomain) {
		v.add("nats.jsDomain", "%q is not a valid JetStream domain (must be letters, digits, '_' and '-')", n.JSDomain)
	}
	if n.InboxPrefix != "" && !isSubjectPrefix(n.InboxPrefix) {
		v.add("nats.inboxPrefix", "%q is not a valid inbox prefix (must be dot-separated tokens of letters, digits, '_' and '-', no wildcards)", n.InboxPrefix)
	}
}

// pair reports a key given without its partner: each names the other.
func (v *validator) pair(keyA, a, keyB, b string) {
	switch {
	case a != "" && b == "":
		v.add(keyB, "required with %s", v.names.Of(keyA))
	case a == "" && b != "":
		v.add(keyA, "required with %s", v.names.Of(keyB))
	}
}

func (v *validator) checkpoint(c *Checkpoint) {
	if c.Namespace != "" && !isDNS1123Label(c.Namespace) {
		v.add("checkpoint.namespace", "%q is not a valid namespace name (must be a DNS-1123 label)", c.Namespace)
	}
	if len(validation.IsDNS1123Subdomain(c.Name)) > 0 {
		v.add("checkpoint.name", "%q is not a valid ConfigMap name (must be a DNS-1123 subdomain)", c.Name)
	}
	if c.FlushInterval < Duration(100*time.Millisecond) {
		v.add("checkpoint.flushInterval", "must be at least 100ms, got %s", c.FlushInterval)
	}
	if c.WatchesPerConfigMap < 1 || c.WatchesPerConfigMap > MaxWatchesPerConfigMap {
		v.add("checkpoint.watchesPerConfigMap", "must be between 1 and %d, got %d", MaxWatchesPerConfigMap, c.WatchesPerConfigMap)
	}
}

func (v *validator) watch(w *Watch) {
	switch {
	case w.Timeout < Duration(30*time.Second) || w.Timeout > Duration(time.Hour):
		v.add("watch.timeout", "must be between 30s and 1h, got %s", w.Timeout)
	case w.Timeout%Duration(time.Second) != 0:
		v.add("watch.timeout", "must be a whole number of seconds, got %s", w.Timeout)
	}
	if w.IdleTimeout <= w.Timeout {
		v.add("watch.idleTimeout", "must be greater than watch.timeout (%s), got %s", w.Timeout, w.IdleTimeout)
	}
	b := &w.RelistBackoff
	v.positive("watch.relistBackoff.initial", b.Initial)
	if b.Max < b.Initial {
		v.add("watch.relistBackoff.max", "must be at least watch.relistBackoff.initial (%s), got %s", b.Initial, b.Max)
	}
	if !finite(b.Factor) || b.Factor < 1 {
		v.add("watch.relistBackoff.factor", "must be a number of at least 1, got %v", b.Factor)
	}
	if j := b.JitterFraction(); !(j >= 0 && j <= 1) {
		v.add("watch.relistBackoff.jitter", "must be between 0 and 1, got %v", j)
	}
	v.intRange("watch.pageSize", w.PageSize, 1, 10000)
	v.sizeRange("watch.maxObjectBytes", w.MaxObjectBytes, 1<<20, 1<<40)
}

func (v *validator) sources(srcs []Source) {
	if len(srcs) == 0 {
		v.add("sources", "at least one source is required")
		return
	}
	names := map[string]int{}
	for i := range srcs {
		s := &srcs[i]
		p := "sources[" + strconv.Itoa(i) + "]"
		switch first, dup := names[s.Name]; {
		case s.Name == "":
			v.add(p+".name", "required")
		case !isDNS1123Label(s.Name):
			v.add(p+".name", "%q is not a valid source name (must be a DNS-1123 label)", s.Name)
		case dup:
			v.add(p+".name", "duplicate source name %q (first at sources[%d])", s.Name, first)
		default:
			names[s.Name] = i
		}
		v.source(p, s)
	}
}

// source checks one source, whose key path is p, reporting its problems in
// key order: what to watch, namespaces, selectors, event types, payload,
// shaping paths, initial mode, heartbeat interval.
func (v *validator) source(p string, s *Source) {
	v.target(p, s)
	if s.Resource != nil {
		v.resource(p+".resource", s.Resource)
	}
	v.namespaces(p, s.Namespaces)
	v.selectors(p, s)
	v.eventTypes(p, s.EventTypes)
	v.payload(p, s)
	v.shaping(p, s)
	v.filter(p, s)
	if in := s.Initial; !slices.Contains(initials, in) {
		v.add(p+".initial", "%q is not a valid initial mode (must be %s)", in, orList(initials))
	}
	v.heartbeat(p+".heartbeatInterval", s.HeartbeatInterval)
}

// target checks how source p names what it watches: either apiVersion+kind
// or resource, exactly one of them, and the apiVersion and kind themselves.
func (v *validator) target(p string, s *Source) {
	byKind := s.APIVersion != "" || s.Kind != ""
	switch {
	case byKind && s.Resource != nil:
		v.add(p, "set either apiVersion+kind or resource, not both")
	case !byKind && s.Resource == nil:
		v.add(p, "set either apiVersion+kind or resource")
	case byKind && s.APIVersion == "":
		v.add(p+".apiVersion", "required with kind")
	case byKind && s.Kind == "":
		v.add(p+".kind", "required with apiVersion")
	}
	if s.APIVersion != "" {
		if msg := checkAPIVersion(s.APIVersion); msg != "" {
			v.add(p+".apiVersion", "%s", msg)
		}
	}
	if s.Kind != "" && !isKind(s.Kind) {
		v.add(p+".kind", "%q is not a valid kind (must be CamelCase starting with an uppercase letter, e.g. \"Pod\")", s.Kind)
	}
}

// resource checks a source's resource block, whose key path is rp: its
// group, version and resource name.
func (v *validator) resource(rp string, r *Resource) {
	switch {
	case r.Group == "core":
		v.add(rp+".group", "the core API group is written as \"\" (or left out), not \"core\"")
	case r.Group != "" && len(validation.IsDNS1123Subdomain(r.Group)) > 0:
		v.add(rp+".group", "%q is not a valid API group (must be a DNS-1123 subdomain, or \"\" for the core group)", r.Group)
	}
	switch {
	case r.Version == "":
		v.add(rp+".version", "required")
	case len(validation.IsDNS1035Label(r.Version)) > 0:
		v.add(rp+".version", "%q is not a valid API version (must be a DNS-1035 label, e.g. \"v1\" or \"v1beta1\")", r.Version)
	}
	switch {
	case r.Resource == "":
		v.add(rp+".resource", "required")
	case strings.Contains(r.Resource, "/"):
		v.add(rp+".resource", "%q is a subresource, which cannot be watched", r.Resource)
	case !isDNS1123Label(r.Resource):
		v.add(rp+".resource", "%q is not a valid resource name (must be the lowercase plural, e.g. \"deployments\")", r.Resource)
	}
}

// namespaces checks the namespaces of source p: valid names, each listed
// once (a duplicate names the index of the first).
func (v *validator) namespaces(p string, nss []string) {
	seen := map[string]int{}
	for j, ns := range nss {
		np := p + ".namespaces[" + strconv.Itoa(j) + "]"
		if !isDNS1123Label(ns) {
			v.add(np, "%q is not a valid namespace name (must be a DNS-1123 label)", ns)
			continue
		}
		if first, dup := seen[ns]; dup {
			v.add(np, "duplicate namespace %q (first at %s.namespaces[%d])", ns, p, first)
			continue
		}
		seen[ns] = j
	}
}

// selectors checks the label and field selectors of source p with
// apimachinery's parsers, so that a malformed selector is reported at start
// rather than by every list and watch.
func (v *validator) selectors(p string, s *Source) {
	if s.LabelSelector != "" {
		if _, err := labels.Parse(s.LabelSelector); err != nil {
			v.add(p+".labelSelector", "%q is not a valid label selector: %v", s.LabelSelector, err)
		}
	}
	if s.FieldSelector != "" {
		if _, err := fields.ParseSelector(s.FieldSelector); err != nil {
			// apimachinery gives this error as text only (fmt.Errorf, or
			// fields.InvalidEscapeSequence and fields.UnescapedRune,
			// whose fields are unexported): its own prefix is cut from
			// the text, as no type carries the rest.
			msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "invalid field selector: "), "invalid selector: ")
			v.add(p+".fieldSelector", "%q is not a valid field selector: %s", s.FieldSelector, msg)
		}
	}
}

// eventTypes checks the eventTypes filter of source p: known types, each
// listed once (a duplicate names the index of the first).
func (v *validator) eventTypes(p string, types []EventType) {
	seen := map[EventType]int{}
	for j, t := range types {
		tp := p + ".eventTypes[" + strconv.Itoa(j) + "]"
		if !slices.Contains(AllEventTypes(), t) {
			v.add(tp, "%q is not a valid event type (must be %s)", t, orList(AllEventTypes()))
			continue
		}
		if first, dup := seen[t]; dup {
			v.add(tp, "duplicate event type %q (first at %s.eventTypes[%d])", t, p, first)
			continue
		}
		seen[t] = j
	}
}

// payload checks the payload mode of source p, and that a Secret source
// publishes, fingerprints or evaluates its data only when allowSecretData
// says so: payload full; the last-applied annotation, which holds the
// whole Secret as applied; managedFields, whose fieldsV1 name every data
// key; ignoreChanges and changedPaths, whose fingerprints hash the Secret
// and are stored in the index bucket; a filter, which reads whole Secrets
// and whose result (published or not, entering or leaving scope) tells
// something about the values.
func (v *validator) payload(p string, s *Source) {
	if pl := s.Payload; !slices.Contains(payloads, pl) {
		v.add(p+".payload", "%q is not a valid payload (must be %s)", pl, orList(payloads))
	} else if pl == PayloadFull && s.IsSecret() && !s.AllowSecretData {
		v.add(p+".payload", "full publishes the Secret's data; use metadata or reference, or set %s.allowSecretData: true", p)
	}
	if s.KeepLastAppliedConfiguration && s.IsSecret() && !s.AllowSecretData {
		v.add(p+".keepLastAppliedConfiguration", "true publishes the Secret's data (the annotation holds the whole Secret as last applied); leave it false, or set %s.allowSecretData: true", p)
	}
	if len(s.IgnoreChanges) > 0 && s.IsSecret() && !s.AllowSecretData {
		v.add(p+".ignoreChanges", "fingerprints the Secret's data (relayd reads whole Secrets and stores a hash of each in the index bucket); remove it, or set %s.allowSecretData: true", p)
	}
	if len(s.ChangedPaths) > 0 && s.IsSecret() && !s.AllowSecretData {
		v.add(p+".changedPaths", "fingerprints parts of the Secret (relayd reads whole Secrets and stores a hash of each path in the index bucket); remove it, or set %s.allowSecretData: true", p)
	}
	if s.KeepManagedFields && s.IsSecret() && !s.AllowSecretData {
		v.add(p+".keepManagedFields", "true publishes the name of every data key of the Secret (managedFields lists each field a writer set); leave it false, or set %s.allowSecretData: true", p)
	}
	if s.Filter != "" && s.IsSecret() && !s.AllowSecretData {
		v.add(p+".filter", "evaluates the Secret's data (relayd reads whole Secrets, and whether an object is published, enters or leaves scope tells something about its values); remove it, or set %s.allowSecretData: true", p)
	}
}

// fingerprintKey checks that the fingerprints of Secrets are keyed: a
// source of Secrets with ignoreChanges needs nats.index.fingerprintKeyFile
// (one problem per such source).
func (v *validator) fingerprintKey(c *Config) {
	if c.NATS.Index.FingerprintKeyFile != "" {
		return
	}
	for i := range c.Sources {
		if s := &c.Sources[i]; s.IsSecret() && len(s.IgnoreChanges) > 0 {
			v.add("nats.index.fingerprintKeyFile", "required with sources[%d].ignoreChanges on Secrets (source %q): the index bucket stores a fingerprint of every Secret, data included, which must be keyed", i, s.Name)
		}
		if s := &c.Sources[i]; s.IsSecret() && len(s.ChangedPaths) > 0 {
			v.add("nats.index.fingerprintKeyFile", "required with sources[%d].changedPaths on Secrets (source %q): the index bucket stores a fingerprint of each path of every Secret, which must be keyed", i, s.Name)
		}
	}
}

// shaping reports every drop, ignoreChanges and changedPaths path that event.NewShaping
// rejects, at the path of the list item.
func (v *validator) shaping(p string, s *Source) {
	_, err := event.NewShaping(s.Shaping())
	if err == nil {
		return
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		var se *event.ShapingError
		var dup *event.DuplicatePathError
		switch {
		case errors.As(e, &dup) && errors.As(e, &se):
			// The first occurrence is named by its full key path, like
			// the other duplicate problems.
			v.add(p+"."+se.List+"["+strconv.Itoa(se.Index)+"]", "duplicate path %q (first at %s.%s[%d])", dup.Path, p, dup.List, dup.First)
		case errors.As(e, &se):
			v.add(p+"."+se.List+"["+strconv.Itoa(se.Index)+"]", "%v", se.Err)
		default:
			v.add(p, "%v", e)
		}
	}
}

// orList joins the values of an enumerated type as "a, b or c".
func orList[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, x := range vs {
		s[i] = string(x)
	}
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// heartbeat checks a heartbeatInterval: unset, 0 (off) or at least
// MinHeartbeatInterval.
func (v *validator) heartbeat(path string, d *Duration) {
	if d != nil && *d != 0 && *d < Duration(MinHeartbeatInterval) {
		v.add(path, "must be 0 (off) or at least %s, got %s", Duration(MinHeartbeatInterval), *d)
	}
}

func (v *validator) positive(path string, d Duration) {
	if d <= 0 {
		v.add(path, "must be greater than 0, got %s", d)
	}
}

func (v *validator) intRange(path string, n, lo, hi int) {
	if n < lo || n > hi {
		v.add(path, "must be between %d and %d, got %d", lo, hi, n)
	}
}

// sizeRange is intRange for a Size; the message shows the bytes (and the
// quantity that a "64Mi" was).
func (v *validator) sizeRange(path string, n, lo, hi Size) {
	if n < lo || n > hi {
		got := fmt.Sprint(int64(n))
		if q := n.String(); q != got {
			got += " (" + q + ")"
		}
		v.add(path, "must be between %d (%s) and %d (%s), got %s", lo, lo, hi, hi, got)
	}
}

// checkAPIVersion returns what is wrong with an apiVersion, or "".
func checkAPIVersion(s string) string {
	group, version, hasGroup := strings.Cut(s, "/")
	if !hasGroup {
		group, version = "", s
	}
	if group == "core" {
		return fmt.Sprintf("%q is not a valid apiVersion (the core group has no name: write %q)", s, version)
	}
	if (hasGroup && (group == "" || len(validation.IsDNS1123Subdomain(group)) > 0)) ||
		len(validation.IsDNS1035Label(version)) > 0 {
		return fmt.Sprintf("%q is not a valid apiVersion (must be \"v1\" or \"group/version\", e.g. \"apps/v1\")", s)
	}
	return ""
}

// isKind reports whether s looks like a Kubernetes kind: an ASCII
// uppercase letter followed by letters and digits.
func isKind(s string) bool {
	if s == "" || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// isToken reports whether s is a non-empty NATS subject token made of
// [A-Za-z0-9_-].
func isToken(s string) bool {
	return s != "" && isPlainKey(s)
}

// isSubjectPrefix reports whether s is one or more tokens joined by dots.
func isSubjectPrefix(s string) bool {
	for t := range strings.SplitSeq(s, ".") {
		if !isToken(t) {
			return false
		}
	}
	return true
}

func isDNS1123Label(s string) bool {
	return len(validation.IsDNS1123Label(s)) == 0
}
