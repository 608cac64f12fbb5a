package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	yaml "go.yaml.in/yaml/v3"

	"github.com/relayd/relayd/pkg/event"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestFixtures pins the exact error text for every fixture in testdata.
// Every fixture must be listed, so a new one cannot go untested.
func TestFixtures(t *testing.T) {
	tests := map[string]string{
		"good-minimal.yaml": "",
		"good-full.yaml":    "",

		"bad-unknown-key-top.yaml": `bad-unknown-key-top.yaml:6: sourcez: unknown key (did you mean "sources"?)
bad-unknown-key-top.yaml: sources: at least one source is required`,

		"bad-unknown-key-nested.yaml": `bad-unknown-key-nested.yaml:12: sources[1].namespace: unknown key (did you mean "namespaces"?)
bad-unknown-key-nested.yaml:13: sources[1].selector: unknown key (valid keys: name, apiVersion, kind, resource, namespaces, labelSelector, fieldSelector, eventTypes, payload, keepManagedFields, keepLastAppliedConfiguration, allowSecretData, drop, ignoreChanges, changedPaths, initial, filter, filterOnError, heartbeatInterval)`,

		"bad-wrong-type.yaml": `bad-wrong-type.yaml:3: nats.url: expected a string, got a list
bad-wrong-type.yaml:4: nats.maxInFlight: expected an integer, got "lots"
bad-wrong-type.yaml:7: nats.stream.create: expected true or false, got "sometimes"
bad-wrong-type.yaml:8: nats.stream.replicas: expected an integer, got 1.5
bad-wrong-type.yaml:13: sources[0].namespaces: expected a list, got "default"
bad-wrong-type.yaml:14: sources[1]: expected a mapping, got "just-a-string"`,

		"bad-duration.yaml": `bad-duration.yaml:7: watch.timeout: invalid duration "5 minutes" (use Go syntax such as "30s", "5m" or "1h30m")
bad-duration.yaml:9: watch.relistBackoff.initial: invalid duration "10" (use Go syntax such as "30s", "5m" or "1h30m")`,

		"bad-missing-cluster.yaml": `bad-missing-cluster.yaml: cluster: required`,

		"bad-missing-sources.yaml": `bad-missing-sources.yaml: sources: at least one source is required`,

		"bad-both-kind-and-resource.yaml": `bad-both-kind-and-resource.yaml:7: sources[0]: set either apiVersion+kind or resource, not both`,

		"bad-neither-kind-nor-resource.yaml": `bad-neither-kind-nor-resource.yaml:7: sources[0]: set either apiVersion+kind or resource
bad-neither-kind-nor-resource.yaml:9: sources[1].apiVersion: required with kind`,

		"bad-duplicate-source-names.yaml": `bad-duplicate-source-names.yaml:10: sources[1].name: duplicate source name "pods" (first at sources[0])`,

		"bad-namespace.yaml": `bad-namespace.yaml:11: sources[0].namespaces[0]: "Web" is not a valid namespace name (must be a DNS-1123 label)
bad-namespace.yaml:12: sources[0].namespaces[1]: "kube_system" is not a valid namespace name (must be a DNS-1123 label)`,

		"bad-duplicate-namespaces.yaml": `bad-duplicate-namespaces.yaml:10: sources[0].namespaces[2]: duplicate namespace "web" (first at sources[0].namespaces[0])`,

		"bad-label-selector.yaml": `bad-label-selector.yaml:10: sources[0].labelSelector: "app in (web" is not a valid label selector: unable to parse requirement: found '', expected: ',' or ')'`,

		"bad-field-selector.yaml": `bad-field-selector.yaml:10: sources[0].fieldSelector: "status.phase" is not a valid field selector: 'status.phase'; can't understand 'status.phase'`,

		"bad-event-types.yaml": `bad-event-types.yaml:10: sources[0].eventTypes[1]: "updated" is not a valid event type (must be added, modified or deleted)
bad-event-types.yaml:10: sources[0].eventTypes[2]: duplicate event type "added" (first at sources[0].eventTypes[0])`,

		"bad-payload.yaml": `bad-payload.yaml:10: sources[0].payload: "Full" is not a valid payload (must be full, metadata or reference)`,

		"good-shaping.yaml": "",

		"bad-drop.yaml": `bad-drop.yaml:11: sources[0].drop[1]: unexpected "]" at offset 6
bad-drop.yaml:12: sources[0].drop[2]: "metadata.name" cannot be dropped: apiVersion, kind, metadata and metadata.name, namespace, uid and resourceVersion identify the object
bad-drop.yaml:13: sources[0].drop[3]: [N] indexes are not supported (use [*]) at offset 10
bad-drop.yaml:14: sources[0].drop[4]: duplicate path "spec.template.spec.containers[*].env" (first at sources[0].drop[0])
bad-drop.yaml:17: sources[0].ignoreChanges[1]: unexpected "/" at offset 32 (write member names with characters other than letters, digits, '_' and '-' as ["..."])
bad-drop.yaml:18: sources[0].ignoreChanges[2]: unterminated quoted member name starting at offset 20
bad-drop.yaml:23: sources[1].drop[0]: "spec.containers[*]" ends with [*]: a path selects a member (to remove the whole list, use "spec.containers")
bad-drop.yaml:24: sources[1].drop[1]: empty path
bad-drop.yaml:25: sources[1].ignoreChanges[0]: empty member name at offset 0`,

		"bad-changed-paths.yaml": `bad-changed-paths.yaml:2: nats.index.fingerprintKeyFile: required with sources[1].changedPaths on Secrets (source "secrets"): the index bucket stores a fingerprint of each path of every Secret, which must be keyed
bad-changed-paths.yaml:11: sources[0].changedPaths[1]: "spec.template.spec.containers[*].image" has a [*] step: a changed path selects one member (select the member holding the list)
bad-changed-paths.yaml:12: sources[0].changedPaths[2]: unexpected "]" at offset 6
bad-changed-paths.yaml:14: sources[0].changedPaths[4]: duplicate path "spec" (first at sources[0].changedPaths[0])
bad-changed-paths.yaml:19: sources[1].changedPaths: fingerprints parts of the Secret (relayd reads whole Secrets and stores a hash of each path in the index bucket); remove it, or set sources[1].allowSecretData: true`,

		"bad-secret-payload.yaml": `bad-secret-payload.yaml:7: sources[0].payload: full publishes the Secret's data; use metadata or reference, or set sources[0].allowSecretData: true
bad-secret-payload.yaml:12: sources[1].payload: full publishes the Secret's data; use metadata or reference, or set sources[1].allowSecretData: true`,

		"bad-secret-last-applied.yaml": `bad-secret-last-applied.yaml:11: sources[0].keepLastAppliedConfiguration: true publishes the Secret's data (the annotation holds the whole Secret as last applied); leave it false, or set sources[0].allowSecretData: true
bad-secret-last-applied.yaml:15: sources[1].keepLastAppliedConfiguration: true publishes the Secret's data (the annotation holds the whole Secret as last applied); leave it false, or set sources[1].allowSecretData: true`,

		"bad-secret-ignore-changes.yaml": `bad-secret-ignore-changes.yaml:6: nats.index.fingerprintKeyFile: required with sources[0].ignoreChanges on Secrets (source "secrets"): the index bucket stores a fingerprint of every Secret, data included, which must be keyed
bad-secret-ignore-changes.yaml:6: nats.index.fingerprintKeyFile: required with sources[1].ignoreChanges on Secrets (source "secrets-by-resource"): the index bucket stores a fingerprint of every Secret, data included, which must be keyed
bad-secret-ignore-changes.yaml:13: sources[0].ignoreChanges: fingerprints the Secret's data (relayd reads whole Secrets and stores a hash of each in the index bucket); remove it, or set sources[0].allowSecretData: true`,

		"good-secret-fingerprint.yaml": "",

		"bad-secret-filter.yaml": `bad-secret-filter.yaml:11: sources[0].filter: evaluates the Secret's data (relayd reads whole Secrets, and whether an object is published, enters or leaves scope tells something about its values); remove it, or set sources[0].allowSecretData: true
bad-secret-filter.yaml:15: sources[1].filter: evaluates the Secret's data (relayd reads whole Secrets, and whether an object is published, enters or leaves scope tells something about its values); remove it, or set sources[1].allowSecretData: true`,

		"bad-secret-managed-fields.yaml": `bad-secret-managed-fields.yaml:11: sources[0].keepManagedFields: true publishes the name of every data key of the Secret (managedFields lists each field a writer set); leave it false, or set sources[0].allowSecretData: true
bad-secret-managed-fields.yaml:15: sources[1].keepManagedFields: true publishes the name of every data key of the Secret (managedFields lists each field a writer set); leave it false, or set sources[1].allowSecretData: true`,

		"good-secret-filter.yaml": "",

		"bad-filter.yaml": `bad-filter.yaml:10:51: sources[0].filter: invalid expression at column 39: undeclared reference to 'foo'
bad-filter.yaml:14:44: sources[1].filter: invalid expression at column 31: undeclared reference to 'nope'
bad-filter.yaml:20:31: sources[2].filter: invalid expression at line 3, column 1: Syntax error: mismatched input '<EOF>' expecting {'[', '{', '(', '.', '-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}
bad-filter.yaml:26:12: sources[3].filter: invalid expression at line 2, column 6: undeclared reference to 'bar'
bad-filter.yaml:30: sources[4].filter: invalid expression at column 28: undeclared reference to 'baz'`,

		"bad-filter-cost.yaml": `bad-filter-cost.yaml:10: sources[0].filter: refused: estimated cost 537331203 exceeds the limit 1000000 (every list, map and string of the object assumed to hold 256 entries or bytes)
bad-filter-cost.yaml:17: sources[1].filterOnError: "skip" is not a valid value (must be include or exclude)
bad-filter-cost.yaml:21: sources[2].filterOnError: has no effect without filter`,

		"good-filter.yaml": "",

		"bad-initial.yaml": `bad-initial.yaml:10: sources[0].initial: "all" is not a valid initial mode (must be snapshot or none)`,

		"bad-mode.yaml": `bad-mode.yaml:7: cloudevents.mode: "json" is not a valid mode (must be structured or binary)`,

		"bad-duplicate-window.yaml": `bad-duplicate-window.yaml:7: nats.stream.duplicateWindow: must be at least 1m, got 30s`,

		"bad-index.yaml": `bad-index.yaml:7: nats.index.bucket: "relayd.index" is not a valid bucket name (must be letters, digits, '_' and '-')
bad-index.yaml:8: nats.index.replicas: must be between 1 and 5, got 7
bad-index.yaml:9: nats.index.storage: "disk" is not a valid storage type (must be file or memory)`,

		"bad-sharding.yaml": `bad-sharding.yaml:8: sharding.leasePrefix: "Relayd" is not a valid prefix (must be a DNS-1123 label)
bad-sharding.yaml:11: sharding.retryPeriod: must be greater than 0, got -1s
bad-sharding.yaml:9: sharding.leaseDuration: must be greater than sharding.renewDeadline (10s), got 5s`,

		"bad-idle-timeout.yaml": `bad-idle-timeout.yaml:8: watch.idleTimeout: must be greater than watch.timeout (5m), got 5m`,

		"bad-many.yaml": `bad-many.yaml:2: cluster: "prod.eu" is not a valid cluster name (must be letters, digits, '_' and '-')
bad-many.yaml:3: prefix: "k8s..events" is not a valid prefix (must be dot-separated tokens of letters, digits, '_' and '-')
bad-many.yaml:5: nats.url: "http://xxxxx@nats:4222" holds credentials, or an '@' (credentials go in a file: nats.credentialsFile, nats.nkeySeedFile, nats.tokenFile or nats.userFile)
bad-many.yaml:7: nats.tokenFile: cannot be combined with nats.credentialsFile (set only one)
bad-many.yaml:5: nats.url: "http://xxxxx@nats:4222" is not TLS, so nats.credentialsFile would authenticate an unencrypted connection (use tls:// or wss://, or a nats.tls key; or set nats.allowPlaintextCredentials to accept that)
bad-many.yaml:8: nats.publishTimeout: must be greater than 0, got -1s
bad-many.yaml:9: nats.maxInFlight: must be between 1 and 65536, got 100000
bad-many.yaml:10: nats.stream.name: required
bad-many.yaml:11: nats.stream.duplicateWindow: must not exceed nats.stream.maxAge (1m), got 2m
bad-many.yaml:12: nats.stream.replicas: must be between 1 and 5, got 7
bad-many.yaml:13: nats.stream.storage: "ssd" is not a valid storage type (must be file or memory)
bad-many.yaml:15: nats.stream.maxBytes: must be -1 (unlimited) or positive, got -5
bad-many.yaml:17: checkpoint.namespace: "Relayd" is not a valid namespace name (must be a DNS-1123 label)
bad-many.yaml:18: checkpoint.name: "Relayd_Checkpoint" is not a valid ConfigMap name (must be a DNS-1123 subdomain)
bad-many.yaml:19: checkpoint.flushInterval: must be at least 100ms, got 10ms
bad-many.yaml:21: watch.timeout: must be between 30s and 1h, got 2h
bad-many.yaml:24: watch.relistBackoff.max: must be at least watch.relistBackoff.initial (10s), got 5s
bad-many.yaml:25: watch.relistBackoff.factor: must be a number of at least 1, got 0.5
bad-many.yaml:26: watch.relistBackoff.jitter: must be between 0 and 1, got 1.5
bad-many.yaml:29: shutdown.drainTimeout: must be greater than 0, got -5s
bad-many.yaml:31: sources[0].name: "Pods" is not a valid source name (must be a DNS-1123 label)
bad-many.yaml:32: sources[0].apiVersion: "core/v1" is not a valid apiVersion (the core group has no name: write "v1")
bad-many.yaml:33: sources[0].kind: "pod" is not a valid kind (must be CamelCase starting with an uppercase letter, e.g. "Pod")
bad-many.yaml:36: sources[1].resource.group: the core API group is written as "" (or left out), not "core"
bad-many.yaml:37: sources[1].resource.version: "V1" is not a valid API version (must be a DNS-1035 label, e.g. "v1" or "v1beta1")
bad-many.yaml:38: sources[1].resource.resource: "deployments/status" is a subresource, which cannot be watched
bad-many.yaml:39: sources[2].name: required
bad-many.yaml:39: sources[2].resource.resource: required`,

		"bad-empty.yaml": `bad-empty.yaml: empty configuration file`,

		"bad-two-documents.yaml": `bad-two-documents.yaml:10: a second YAML document starts here; the file must hold exactly one`,

		"bad-syntax.yaml": `bad-syntax.yaml:3: invalid YAML: did not find expected key`,

		"bad-duplicate-key.yaml": `bad-duplicate-key.yaml:6: nats.url: duplicate key (first at line 3)`,

		"bad-not-a-mapping.yaml": `bad-not-a-mapping.yaml:1: expected a mapping, got a list`,
	}

	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, ok := tests[filepath.Base(f)]; !ok {
			t.Errorf("fixture %s has no entry in the test table", f)
		}
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := Parse(data, name)
			if want == "" {
				if err != nil {
					t.Fatalf("Parse: unexpected error:\n%v", err)
				}
				if err := cfg.Validate(); err != nil {
					t.Fatalf("Validate after Parse:\n%v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse: no error, want:\n%s", want)
			}
			if cfg != nil {
				t.Errorf("Parse returned a Config with an error")
			}
			if got := err.Error(); got != want {
				t.Errorf("error mismatch\n got:\n%s\nwant:\n%s", got, want)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error is %T, want *ValidationError", err)
			}
			if n := strings.Count(want, "\n") + 1; len(ve.Problems) != n {
				t.Errorf("got %d problems, want %d", len(ve.Problems), n)
			}
			for _, p := range ve.Problems {
				if p.Source != name {
					t.Errorf("problem %q has Source %q, want %q", p.Message, p.Source, name)
				}
			}
		})
	}
}

func TestGoodMinimalDefaults(t *testing.T) {
	create := true
	cfg := parseFile(t, "testdata/good-minimal.yaml")
	jitter := 0.5
	heartbeat := Duration(time.Minute)
	want := Config{
		Cluster: "prod-eu-1",
		Prefix:  "k8s",
		NATS: NATS{
			URL:                      "nats://127.0.0.1:4222",
			Name:                     "relayd",
			PublishTimeout:           Duration(10 * time.Second),
			MaxInFlight:              256,
			MaxInFlightBytes:         48 << 20,
			MaxInFlightBytesPerWatch: 16 << 20,
			Stream: Stream{
				Name:            "K8S",
				DuplicateWindow: Duration(10 * time.Minute),
				Replicas:        1,
				Storage:         StorageFile,
				MaxAge:          Duration(DefaultMaxAge),
				MaxBytes:        -1,
			},
			Index: Index{Bucket: "relayd-index-prod-eu-1", Create: &create, Replicas: 1, Storage: StorageFile},
		},
		CloudEvents: CloudEvents{Mode: ModeStructured},
		Checkpoint: Checkpoint{
			Name:                "relayd-checkpoint",
			FlushInterval:       Duration(5 * time.Second),
			WatchesPerConfigMap: 500,
		},
		Watch: Watch{
			Timeout:     Duration(5 * time.Minute),
			IdleTimeout: Duration(5*time.Minute + 30*time.Second),
			RelistBackoff: Backoff{
				Initial: Duration(time.Second),
				Max:     Duration(5 * time.Minute),
				Factor:  2,
				Jitter:  &jitter,
			},
			PageSize:       500,
			MaxObjectBytes: 64 << 20,
		},
		Shutdown:          Shutdown{DrainTimeout: Duration(20 * time.Second)},
		Sharding:          Sharding{LeasePrefix: "relayd", LeaseDuration: Duration(15 * time.Second), RenewDeadline: Duration(10 * time.Second), RetryPeriod: Duration(2 * time.Second)},
		HeartbeatInterval: &heartbeat,
		Resync:            Resync{RequesterInboxPrefixes: []string{"_INBOX"}, MinFullInterval: Duration(5 * time.Minute)},
		Sources: []Source{{
			Name:       "pods",
			APIVersion: "v1",
			Kind:       "Pod",
			EventTypes: []EventType{EventAdded, EventModified, EventDeleted},
			Payload:    PayloadFull,
			Initial:    InitialSnapshot,
		}},
	}
	got := *cfg
	got.origin = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("defaults mismatch\n got: %+v\nwant: %+v", got, want)
	}
	if d := cfg.HeartbeatOf(&cfg.Sources[0]); d != time.Minute {
		t.Errorf("HeartbeatOf = %s, want the default 1m", d)
	}
}

// TestHeartbeatOf: a source's heartbeatInterval overrides the top-level
// one, 0 included; unset, the top-level one applies.
func TestHeartbeatOf(t *testing.T) {
	cfg, err := Parse([]byte("cluster: dev\nnats: {url: nats://127.0.0.1:4222, stream: {name: K8S}}\nheartbeatInterval: 30s\n"+
		"sources: [{name: a, apiVersion: v1, kind: Pod}, {name: b, apiVersion: v1, kind: Pod, heartbeatInterval: 0}, {name: c, apiVersion: v1, kind: Pod, heartbeatInterval: 2m}]\n"), "x")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []time.Duration{30 * time.Second, 0, 2 * time.Minute} {
		if got := cfg.HeartbeatOf(&cfg.Sources[i]); got != want {
			t.Errorf("sources[%d]: HeartbeatOf = %s, want %s", i, got, want)
		}
	}
}

func TestGoodFull(t *testing.T) {
	cfg := parseFile(t, "testdata/good-full.yaml")
	if got, want := cfg.NATS.URLs(), []string{"nats://nats-0.nats:4222", "tls://nats-1.nats:4222", "wss://nats.example.com:443"}; !reflect.DeepEqual(got, want) {
		t.Errorf("URLs() = %q, want %q", got, want)
	}
	if got := cfg.StreamSubject(); got != "acme.k8s.prod-eu-1.>" {
		t.Errorf("StreamSubject() = %q", got)
	}
	if cfg.Watch.IdleTimeout.Duration() != 11*time.Minute {
		t.Errorf("idleTimeout = %v, want the explicit 11m", cfg.Watch.IdleTimeout)
	}
	b := cfg.Watch.RelistBackoff
	if b.Jitter == nil || *b.Jitter != 0 || b.JitterFraction() != 0 {
		t.Errorf("jitter: 0 must stay 0 (no jitter), got %v", b.Jitter)
	}
	if b.Initial.Duration() != 500*time.Millisecond || b.Factor != 1.5 {
		t.Errorf("relistBackoff = %+v", b)
	}
	if s := cfg.NATS.Stream; !s.Create || s.Replicas != 3 || s.Storage != StorageMemory || s.MaxBytes != 10737418240 || s.MaxAge.Duration() != 24*time.Hour {
		t.Errorf("stream = %+v", s)
	}
	if cfg.CloudEvents.Mode != ModeBinary || cfg.Checkpoint.Namespace != "relayd-system" {
		t.Errorf("mode/namespace = %q/%q", cfg.CloudEvents.Mode, cfg.Checkpoint.Namespace)
	}
	pods, deploys, widgets := &cfg.Sources[0], &cfg.Sources[1], &cfg.Sources[2]
	if !reflect.DeepEqual(pods.EventTypes, []EventType{EventAdded, EventDeleted}) ||
		!pods.Publishes(EventAdded) || pods.Publishes(EventModified) || !pods.Publishes(EventDeleted) {
		t.Errorf("pods eventTypes = %v", pods.EventTypes)
	}
	if pods.Payload != PayloadMetadata || pods.Initial != InitialNone || !pods.KeepManagedFields || pods.AllNamespaces() {
		t.Errorf("pods = %+v", pods)
	}
	if g, v := pods.GroupVersion(); g != "" || v != "v1" {
		t.Errorf("pods GroupVersion = %q, %q", g, v)
	}
	if deploys.Resource == nil || *deploys.Resource != (Resource{Group: "apps", Version: "v1", Resource: "deployments"}) || !deploys.AllNamespaces() {
		t.Errorf("deployments = %+v", deploys)
	}
	if g, v := deploys.GroupVersion(); g != "apps" || v != "v1" {
		t.Errorf("deployments GroupVersion = %q, %q", g, v)
	}
	if g, v := widgets.GroupVersion(); g != "example.com" || v != "v1alpha1" {
		t.Errorf("widgets GroupVersion = %q, %q", g, v)
	}
}

func TestGoodShaping(t *testing.T) {
	cfg := parseFile(t, "testdata/good-shaping.yaml")
	deploys, secrets := &cfg.Sources[0], &cfg.Sources[1]
	want := event.ShapingOptions{
		Drop:          []string{"spec.template.spec.containers[*].env", `metadata.annotations["example.com/token"]`},
		IgnoreChanges: []string{"status", "spec.replicas"},
	}
	if got := deploys.Shaping(); !reflect.DeepEqual(got, want) {
		t.Errorf("deployments Shaping() = %+v\nwant %+v", got, want)
	}
	if deploys.IsSecret() || !secrets.IsSecret() || !secrets.AllowSecretData {
		t.Errorf("IsSecret / allowSecretData: %+v %+v", deploys, secrets)
	}
	want = event.ShapingOptions{Drop: []string{"data"}, KeepManagedFields: true, KeepLastApplied: true}
	if got := secrets.Shaping(); !reflect.DeepEqual(got, want) {
		t.Errorf("secrets Shaping() = %+v\nwant %+v", got, want)
	}
	for i := range cfg.Sources {
		if _, err := event.NewShaping(cfg.Sources[i].Shaping()); err != nil {
			t.Errorf("sources[%d]: NewShaping: %v", i, err)
		}
	}
	// Shaping returns copies.
	deploys.Shaping().Drop[0] = "x"
	if deploys.Drop[0] != "spec.template.spec.containers[*].env" {
		t.Error("Shaping() aliases Drop")
	}
	// Defaults: nothing dropped or ignored, last-applied removed.
	if got := (&Source{}).Shaping(); !reflect.DeepEqual(got, event.ShapingOptions{}) {
		t.Errorf("zero Source Shaping() = %+v", got)
	}
}

func TestIsSecret(t *testing.T) {
	for _, tt := range []struct {
		s    Source
		want bool
	}{
		{Source{APIVersion: "v1", Kind: "Secret"}, true},
		{Source{Resource: &Resource{Version: "v1", Resource: "secrets"}}, true},
		{Source{Resource: &Resource{Version: "v2", Resource: "secrets"}}, true},
		{Source{Resource: &Resource{Group: "example.com", Version: "v1", Resource: "secrets"}}, false},
		{Source{APIVersion: "example.com/v1", Kind: "Secret"}, false},
		{Source{APIVersion: "v1", Kind: "ConfigMap"}, false},
	} {
		if got := tt.s.IsSecret(); got != tt.want {
			t.Errorf("IsSecret(%+v) = %v", tt.s, got)
		}
	}
}

func TestValidateSecretAndPathsInGo(t *testing.T) {
	c := &Config{
		Cluster: "c",
		NATS:    NATS{URL: "nats://n:4222", Stream: Stream{Name: "S"}},
		Sources: []Source{
			{Name: "s", APIVersion: "v1", Kind: "Secret", Drop: []string{"data", "spec[1]"}, IgnoreChanges: []string{"a", "a"}},
		},
	}
	want := `nats.index.fingerprintKeyFile: required with sources[0].ignoreChanges on Secrets (source "s"): the index bucket stores a fingerprint of every Secret, data included, which must be keyed
sources[0].payload: full publishes the Secret's data; use metadata or reference, or set sources[0].allowSecretData: true
sources[0].ignoreChanges: fingerprints the Secret's data (relayd reads whole Secrets and stores a hash of each in the index bucket); remove it, or set sources[0].allowSecretData: true
sources[0].drop[1]: [N] indexes are not supported (use [*]) at offset 4
sources[0].ignoreChanges[1]: duplicate path "a" (first at sources[0].ignoreChanges[0])`
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Errorf("Validate:\n%v\nwant\n%s", err, want)
	}
	c.Sources[0] = Source{Name: "s", APIVersion: "v1", Kind: "Secret", Payload: PayloadMetadata, Drop: []string{"metadata.labels"}}
	if err := c.Validate(); err != nil {
		t.Errorf("metadata payload of Secrets: %v", err)
	}
	// By resource, keeping the last-applied annotation and fingerprinting.
	c.Sources[0] = Source{Name: "s", Resource: &Resource{Version: "v1", Resource: "secrets"}, Payload: PayloadReference,
		KeepLastAppliedConfiguration: true, IgnoreChanges: []string{"metadata.labels"}}
	want = `nats.index.fingerprintKeyFile: required with sources[0].ignoreChanges on Secrets (source "s"): the index bucket stores a fingerprint of every Secret, data included, which must be keyed
sources[0].keepLastAppliedConfiguration: true publishes the Secret's data (the annotation holds the whole Secret as last applied); leave it false, or set sources[0].allowSecretData: true
sources[0].ignoreChanges: fingerprints the Secret's data (relayd reads whole Secrets and stores a hash of each in the index bucket); remove it, or set sources[0].allowSecretData: true`
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Errorf("Validate:\n%v\nwant\n%s", err, want)
	}
	c.Sources[0].AllowSecretData = true
	c.NATS.Index.FingerprintKeyFile = "/etc/relayd-fingerprint/key"
	if err := c.Validate(); err != nil {
		t.Errorf("Secrets with allowSecretData and a fingerprint key: %v", err)
	}
	// Not Secrets: neither allowSecretData nor a key is needed.
	c.NATS.Index.FingerprintKeyFile = ""
	c.Sources[0] = Source{Name: "s", Resource: &Resource{Group: "example.com", Version: "v1", Resource: "secrets"},
		KeepLastAppliedConfiguration: true, IgnoreChanges: []string{"metadata.labels"}}
	if err := c.Validate(); err != nil {
		t.Errorf("example.com secrets: %v", err)
	}
}

func TestExampleConfig(t *testing.T) {
	const path = "../../config.example.yaml"
	t.Setenv(PodNamespaceEnv, "relayd-system")
	cfg, err := Load(path)
	if err != nil {
		t.Fatalf("Load(%s):\n%v", path, err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate:\n%v", err)
	}
	if cfg.Cluster != "dev" || cfg.NATS.URL != "nats://127.0.0.1:4222" {
		t.Errorf("cluster/url = %q/%q", cfg.Cluster, cfg.NATS.URL)
	}
	if cfg.Checkpoint.Namespace != "relayd-system" {
		t.Errorf("checkpoint.namespace = %q, want it resolved from $%s", cfg.Checkpoint.Namespace, PodNamespaceEnv)
	}
	if cfg.Watch.IdleTimeout.Duration() != 5*time.Minute+30*time.Second {
		t.Errorf("idleTimeout = %v, want the default timeout+30s", cfg.Watch.IdleTimeout)
	}
	var names []string
	for _, s := range cfg.Sources {
		names = append(names, s.Name)
	}
	if want := []string{"pods", "deployments", "widgets"}; !reflect.DeepEqual(names, want) {
		t.Errorf("sources = %v, want %v", names, want)
	}
	pods := cfg.Sources[0]
	if !reflect.DeepEqual(pods.Namespaces, []string{"default", "web"}) || pods.LabelSelector == "" || pods.Payload != PayloadMetadata {
		t.Errorf("pods = %+v", pods)
	}
	if cfg.Sources[1].Resource == nil {
		t.Errorf("deployments must use resource: %+v", cfg.Sources[1])
	}

	// The example documents every key: it sets each one explicitly.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, w, problems := decodeDocument(data)
	if problems != nil || len(w.problems) > 0 {
		t.Fatalf("walk: %v %v", problems, w.problems)
	}
	keys := allKeys(reflect.TypeOf(Config{}), "")
	keys = append(keys, "sources[1].resource.group", "sources[1].resource.version", "sources[1].resource.resource")
	// Planned keys are refused by Parse until the relay applies them: the
	// example describes them in a comment.
	planned := map[string]bool{"sources[0].filter": true, "sources[0].filterOnError": true}
	for _, key := range keys {
		if planned[key] {
			if !bytes.Contains(data, []byte("# "+key[strings.LastIndex(key, ".")+1:]+":")) {
				t.Errorf("config.example.yaml does not describe the planned key %s in a comment", key)
			}
			continue
		}
		if _, ok := w.lines[key]; !ok {
			t.Errorf("config.example.yaml does not show key %s", key)
		}
	}
}

// allKeys lists the key paths of a type, with sources[0] for lists of
// structs and without the alternative source forms' inner keys.
func allKeys(t reflect.Type, prefix string) []string {
	var keys []string
	f := fieldsOf(t)
	for _, name := range f.names {
		ft := t.Field(f.index[name]).Type
		p := joinKey(prefix, name)
		keys = append(keys, p)
		switch {
		case ft.Kind() == reflect.Struct:
			keys = append(keys, allKeys(ft, p)...)
		case ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct:
			// sources[0] uses apiVersion+kind; resource is shown in sources[1].
			keys = keys[:len(keys)-1]
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, allKeys(ft.Elem(), p+"[0]")...)
		}
	}
	return keys
}

func TestLoadErrors(t *testing.T) {
	_, err := Load("testdata/does-not-exist.yaml")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load(missing) = %v, want fs.ErrNotExist", err)
	}
	_, err = Load("testdata/bad-mode.yaml")
	if got, want := err.Error(), `testdata/bad-mode.yaml:7: cloudevents.mode: "json" is not a valid mode (must be structured or binary)`; got != want {
		t.Errorf("Load error:\n got: %s\nwant: %s", got, want)
	}
	t.Setenv(PodNamespaceEnv, "Not_Valid")
	_, err = Load("testdata/good-minimal.yaml")
	if got, want := err.Error(), `checkpoint.namespace: $POD_NAMESPACE "Not_Valid" is not a valid namespace name (must be a DNS-1123 label)`; got != want {
		t.Errorf("Load error:\n got: %s\nwant: %s", got, want)
	}
}

func TestValidationError(t *testing.T) {
	_, err := Parse([]byte("cluster: a.b\nnats: {url: 'nats://x'}\n"), "c.yaml")
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("got %T, want *ValidationError", err)
	}
	want := []Problem{
		{Source: "c.yaml", Line: 1, Path: "cluster", Message: `"a.b" is not a valid cluster name (must be letters, digits, '_' and '-')`},
		{Source: "c.yaml", Line: 2, Path: "nats.stream.name", Message: "required"},
		{Source: "c.yaml", Path: "sources", Message: "at least one source is required"},
	}
	if !reflect.DeepEqual(ve.Problems, want) {
		t.Errorf("problems:\n got: %#v\nwant: %#v", ve.Problems, want)
	}
	// Error() is errors.Join of the problems.
	if got, want := err.Error(), errors.Join(ve.Unwrap()...).Error(); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	var p Problem
	if !errors.As(err, &p) || p.Path != "cluster" {
		t.Errorf("errors.As(Problem) = %+v", p)
	}
}

func TestProblemFormat(t *testing.T) {
	for _, tt := range []struct {
		p    Problem
		want string
	}{
		{Problem{Source: "f.yaml", Line: 3, Path: "a.b", Message: "m"}, "f.yaml:3: a.b: m"},
		{Problem{Source: "f.yaml", Path: "a", Message: "m"}, "f.yaml: a: m"},
		{Problem{Line: 3, Path: "a", Message: "m"}, "line 3: a: m"},
		{Problem{Path: "a", Message: "m"}, "a: m"},
		{Problem{Source: "f.yaml", Line: 1, Message: "m"}, "f.yaml:1: m"},
		{Problem{Message: "m"}, "m"},
	} {
		if got := tt.p.Error(); got != tt.want {
			t.Errorf("%+v: got %q, want %q", tt.p, got, tt.want)
		}
	}
}

// TestValidateInGo checks a Config built in Go: unset fields are their
// defaults, problems carry no file or line, and Validate modifies nothing.
func TestValidateInGo(t *testing.T) {
	c := &Config{
		Cluster: "dev",
		NATS:    NATS{URL: "nats://localhost", Stream: Stream{Name: "K8S"}},
		Sources: []Source{{Name: "pods", APIVersion: "v1", Kind: "Pod"}},
	}
	before := *c
	before.Sources = append([]Source(nil), c.Sources...)
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if !reflect.DeepEqual(*c, before) {
		t.Errorf("Validate modified the Config")
	}
	c.Sources = append(c.Sources, Source{Name: "pods", Kind: "Pod", EventTypes: []EventType{"nope"}})
	want := `sources[1].name: duplicate source name "pods" (first at sources[0])
sources[1].apiVersion: required with kind
sources[1].eventTypes[0]: "nope" is not a valid event type (must be added, modified or deleted)`
	if err := c.Validate(); err == nil || err.Error() != want {
		t.Errorf("Validate:\n got: %v\nwant: %s", err, want)
	}

	c.ApplyDefaults()
	once := *c
	once.Sources = append([]Source(nil), c.Sources...)
	c.ApplyDefaults()
	if !reflect.DeepEqual(*c, once) {
		t.Errorf("ApplyDefaults is not idempotent")
	}
}

func TestValidateMore(t *testing.T) {
	base := "cluster: dev\nnats: {url: nats://127.0.0.1:4222, stream: {name: K8S}}\n"
	src := "sources: [{name: pods, apiVersion: v1, kind: Pod}]\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"explicit zero jitter", base + src + "watch: {relistBackoff: {jitter: 0}}\n", ""},
		{"heartbeats off", base + src + "heartbeatInterval: 0\n", ""},
		{"resync requesters", base + src + "resync: {requesterInboxPrefixes: [_INBOX_ops, ops.inbox], minFullInterval: 1s}\n", ""},
		{"resync requesters on relayd's subjects", base + src + "resync:\n  requesterInboxPrefixes: [k8s, k8s-ctl.x, '$JS', '_INBOX.>', _INBOX_ok]\n  minFullInterval: 500ms\n",
			"x:5: resync.requesterInboxPrefixes[0]: \"k8s\" overlaps relayd's own subjects k8s.> (prefix \"k8s\"): relayd's answers would land there\n" +
				"x:5: resync.requesterInboxPrefixes[1]: \"k8s-ctl.x\" overlaps relayd's own subjects k8s-ctl.> (prefix \"k8s\"): relayd's answers would land there\n" +
				"x:5: resync.requesterInboxPrefixes[2]: \"$JS\" is not a valid inbox prefix (must be dot-separated tokens of letters, digits, '_' and '-', no wildcards)\n" +
				"x:5: resync.requesterInboxPrefixes[3]: \"_INBOX.>\" is not a valid inbox prefix (must be dot-separated tokens of letters, digits, '_' and '-', no wildcards)\n" +
				"x:6: resync.minFullInterval: must be at least 1s, got 500ms"},
		{"resync requester above a dotted prefix", "cluster: dev\nprefix: acme.k8s\nnats: {url: nats://127.0.0.1:4222, stream: {name: K8S}}\n" + src + "resync: {requesterInboxPrefixes: [acme]}\n",
			"x:5: resync.requesterInboxPrefixes[0]: \"acme\" overlaps relayd's own subjects acme.k8s.> (prefix \"acme.k8s\"): relayd's answers would land there"},
		{"heartbeat interval too short", base + "heartbeatInterval: 500ms\nsources: [{name: pods, apiVersion: v1, kind: Pod}, {name: cms, apiVersion: v1, kind: ConfigMap, heartbeatInterval: 10ms}, {name: svc, apiVersion: v1, kind: Service, heartbeatInterval: 0}]\n",
			"x:3: heartbeatInterval: must be 0 (off) or at least 1s, got 500ms\n" +
				"x:4: sources[1].heartbeatInterval: must be 0 (off) or at least 1s, got 10ms"},
		{"checkpoint watches per ConfigMap", base + src + "checkpoint: {watchesPerConfigMap: 3001}\n",
			"x:4: checkpoint.watchesPerConfigMap: must be between 1 and 3000, got 3001"},
		{"in-flight bytes", "cluster: dev\nnats: {url: nats://127.0.0.1:4222, stream: {name: K8S}, maxInFlightBytes: 1000}\n" + src,
			"x:2: nats.maxInFlightBytes: must be between 1048576 (1Mi) and 1099511627776 (1Ti), got 1000\n" +
				"x:2: nats.maxInFlightBytesPerWatch: must not exceed nats.maxInFlightBytes (1000), got 16777216"},
		{"in-flight bytes per watch over the process's", "cluster: dev\nnats: {url: nats://127.0.0.1:4222, stream: {name: K8S}, maxInFlightBytesPerWatch: 67108864}\n" + src,
			"x:2: nats.maxInFlightBytesPerWatch: must not exceed nats.maxInFlightBytes (50331648), got 67108864"},
		{"in-flight bytes raised together", "cluster: dev\nnats: {url: nats://127.0.0.1:4222, stream: {name: K8S}, maxInFlightBytes: 134217728, maxInFlightBytesPerWatch: 67108864}\n" + src, ""},
		{"object bound", base + src + "watch: {maxObjectBytes: 1000}\n",
			"x:4: watch.maxObjectBytes: must be between 1048576 (1Mi) and 1099511627776 (1Ti), got 1000"},
		{"negative object bound", base + src + "watch: {maxObjectBytes: -1}\n",
			"x:4: watch.maxObjectBytes: must be between 1048576 (1Mi) and 1099511627776 (1Ti), got -1"},
		{"object bound raised", base + src + "watch: {maxObjectBytes: 268435456}\n", ""},
		{"timeout fraction", base + src + "watch: {timeout: 90500ms}\n",
			"x:4: watch.timeout: must be a whole number of seconds, got 1m30.5s"},
		{"infinite factor", base + src + "watch: {relistBackoff: {factor: .inf}}\n",
			"x:4: watch.relistBackoff.factor: must be a number of at least 1, got +Inf"},
		{"nan jitter", base + src + "watch: {relistBackoff: {jitter: .nan}}\n",
			"x:4: watch.relistBackoff.jitter: must be between 0 and 1, got NaN"},
		{"initial above default max", base + src + "watch: {relistBackoff: {initial: 10m}}\n",
			"x:4: watch.relistBackoff.max: must be at least watch.relistBackoff.initial (10m), got 5m"},
		{"url list", "cluster: dev\nnats: {url: 'nats://a:4222,, tls://b:99999 ,nats://', stream: {name: K8S}}\n" + src,
			`x:2: nats.url: "tls://b:99999" has an invalid port
x:2: nats.url: "nats://" has no host
x:2: nats.url: empty entry in the comma-separated list "nats://a:4222,, tls://b:99999 ,nats://"`},
		{"url without scheme", "cluster: dev\nnats: {url: '127.0.0.1:4222', stream: {name: K8S}}\n" + src,
			`x:2: nats.url: "127.0.0.1:4222" is not a valid server URL (must be nats://, tls://, ws:// or wss://host[:port])`},
		{"token in url", "cluster: dev\nnats: {url: 'nats://s3cr3t@h:4222', stream: {name: K8S}}\n" + src,
			`x:2: nats.url: "nats://xxxxx@h:4222" holds credentials, or an '@' (credentials go in a file: nats.credentialsFile, nats.nkeySeedFile, nats.tokenFile or nats.userFile)`},
		{"bad apiVersion and group", base + "sources:\n- {name: a, apiVersion: apps/v1/x, kind: A}\n- {name: b, resource: {group: Apps, version: v1, resource: Deployments}}\n",
			`x:4: sources[0].apiVersion: "apps/v1/x" is not a valid apiVersion (must be "v1" or "group/version", e.g. "apps/v1")
x:5: sources[1].resource.group: "Apps" is not a valid API group (must be a DNS-1123 subdomain, or "" for the core group)
x:5: sources[1].resource.resource: "Deployments" is not a valid resource name (must be the lowercase plural, e.g. "deployments")`},
		{"core resource", base + "sources: [{name: cm, resource: {version: v1, resource: configmaps}}]\n", ""},
		{"empty lists mean defaults", base + "sources: [{name: p, apiVersion: v1, kind: Pod, namespaces: [], eventTypes: []}]\n", ""},
		{"null values mean defaults", base + "prefix: ~\nwatch: ~\nsources: [{name: p, apiVersion: v1, kind: Pod, resource: ~}]\n", ""},
		{"type error suppresses validation", base + "sources: [{name: [pods], apiVersion: v1, kind: Pod}]\n",
			"x:3: sources[0].name: expected a string, got a list"},
		{"non-string key", base + src + "1: x\n",
			`x:4: 1: unknown key (valid keys: cluster, prefix, nats, cloudevents, checkpoint, watch, shutdown, sharding, heartbeatInterval, resync, sources)`},
		{"odd key", base + src + "\"a.b\": x\n",
			`x:4: ["a.b"]: unknown key (valid keys: cluster, prefix, nats, cloudevents, checkpoint, watch, shutdown, sharding, heartbeatInterval, resync, sources)`},
		{"mapping key", base + src + "? [a]\n: x\n", "x:4: mapping keys must be strings, got a list"},
		{"case suggestion", base + src + "shutdown: {draintimeout: 1s}\n", `x:4: shutdown.draintimeout: unknown key (did you mean "drainTimeout"?)`},
		{"duration wrong kind", base + src + "shutdown: {drainTimeout: [1s]}\n",
			`x:4: shutdown.drainTimeout: invalid duration: expected a string such as "30s", got a list`},
		{"top-level scalar", "hello\n", `x:1: expected a mapping, got "hello"`},
		{"null document", "~\n", "x: empty configuration file"},
		{"comments only", "# nothing\n", "x: empty configuration file"},
		{"trailing separator", base + src + "---\n", "x:4: a second YAML document starts here; the file must hold exactly one"},
		{"leading separator", "---\n" + base + src, ""},
		{"syntax error in second document", base + src + "---\na: [\n", "x:5: invalid YAML: did not find expected node content"},
		{"tab", "\tcluster: dev\n", "x: invalid YAML: found character that cannot start any token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.yaml), "x")
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

// TestAnchorsAndMerge checks that YAML anchors, aliases and merge keys
// work, and that problems inside them are found.
func TestAnchorsAndMerge(t *testing.T) {
	doc := `cluster: dev
nats: {url: nats://127.0.0.1:4222, stream: {name: K8S}}
x-common: &common
  apiVersion: v1
  payload: metadata
sources:
  - <<: *common
    name: pods
    kind: Pod
  - <<: [{kind: Service, payload: reference}, *common]
    name: services
    namespaces: &ns [a, b]
  - name: cms
    apiVersion: v1
    kind: ConfigMap
    namespaces: *ns
`
	_, err := Parse([]byte(doc), "x")
	if want := `x:3: x-common: unknown key (valid keys: cluster, prefix, nats, cloudevents, checkpoint, watch, shutdown, sharding, heartbeatInterval, resync, sources)`; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %s", err, want)
	}
	doc = strings.Replace(doc, "x-common: &common\n  apiVersion: v1\n  payload: metadata\n", "", 1)
	doc = strings.Replace(doc, "sources:\n", "sources:\n  - &common {name: base, apiVersion: v1, kind: Secret, payload: metadata}\n", 1)
	cfg, err := Parse([]byte(doc), "x")
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.Sources
	if s[1].Name != "pods" || s[1].APIVersion != "v1" || s[1].Kind != "Pod" || s[1].Payload != PayloadMetadata {
		t.Errorf("pods = %+v", s[1])
	}
	// The first mapping of a merge list wins; explicit keys win over all.
	if s[2].Kind != "Service" || s[2].Payload != PayloadReference || s[2].APIVersion != "v1" || s[2].Name != "services" {
		t.Errorf("services = %+v", s[2])
	}
	if !reflect.DeepEqual(s[3].Namespaces, []string{"a", "b"}) {
		t.Errorf("cms namespaces = %v", s[3].Namespaces)
	}

	for _, tt := range []struct{ name, doc, want string }{
		{"self merge", "cluster: &c {<<: *c}\n", "x:1: cluster: expected a string, got a mapping"},
		{"merge cycle", "nats: &n {<<: *n}\n", "x:1: nats: alias *n refers to a node that contains it"},
		{"merge of a scalar", "nats: {<<: 3}\n", `x:1: nats: the merge key "<<" needs a mapping or a list of mappings, got 3`},
		{"problem inside merge", "a: &a {url: 1, bogus: 2}\n", `x:1: a: unknown key (valid keys: cluster, prefix, nats, cloudevents, checkpoint, watch, shutdown, sharding, heartbeatInterval, resync, sources)`},
		{"unknown key via merge", "nats: {<<: {bogus: 1}}\n", `x:1: nats.bogus: unknown key (valid keys: url, credentialsFile, nkeySeedFile, tokenFile, userFile, passwordFile, allowPlaintextCredentials, tls, jsDomain, inboxPrefix, name, publishTimeout, maxInFlight, maxInFlightBytes, maxInFlightBytesPerWatch, stream, index)`},
		{"alias to ancestor", "sources: &s [*s]\n", "x:1: sources[0]: expected a mapping, got a list"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.doc), "x")
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Problems[0].Error() != tt.want {
				t.Errorf("\n got: %v\nwant first: %s", err, tt.want)
			}
		})
	}
}

// TestAliasBomb checks that a document multiplying itself through merge
// keys is rejected quickly instead of being expanded.
func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("x0: &x0 {cluster: x}\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "x%d: &x%d {<<: [%s]}\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*x%d,", i-1), 9), ","))
	}
	b.WriteString("<<: *x9\n")
	start := time.Now()
	_, err := Parse([]byte(b.String()), "x")
	if err == nil || !strings.Contains(err.Error(), "\nx: document contains excessive aliasing (too many alias or merge key expansions)") {
		t.Errorf("got %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestResolveDefaults(t *testing.T) {
	file := func(content string, err error) func(string) ([]byte, error) {
		return func(name string) ([]byte, error) {
			if name != ServiceAccountNamespaceFile {
				t.Errorf("read %q, want %q", name, ServiceAccountNamespaceFile)
			}
			return []byte(content), err
		}
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k != PodNamespaceEnv {
				t.Errorf("getenv %q, want %q", k, PodNamespaceEnv)
			}
			return v
		}
	}
	for _, tt := range []struct {
		name     string
		set      string
		env      func(string) string
		readFile func(string) ([]byte, error)
		want     string
		wantErr  string
	}{
		{name: "explicit wins", set: "mine", env: env("pod"), readFile: file("sa", nil), want: "mine"},
		{name: "env", env: env("pod-ns"), readFile: file("sa", nil), want: "pod-ns"},
		{name: "service account file", env: env(""), readFile: file("sa-ns\n", nil), want: "sa-ns"},
		{name: "no file", env: env(""), readFile: file("", fs.ErrNotExist), want: "default"},
		{name: "empty file", env: env(""), readFile: file("  \n", nil), want: "default"},
		{name: "nil functions", want: "default"},
		{name: "bad env", env: env("Bad"), wantErr: `checkpoint.namespace: $POD_NAMESPACE "Bad" is not a valid namespace name (must be a DNS-1123 label)`},
		{name: "bad file", env: env(""), readFile: file("a b", nil), wantErr: `checkpoint.namespace: /var/run/secrets/kubernetes.io/serviceaccount/namespace holds "a b", which is not a valid namespace name (must be a DNS-1123 label)`},
		{name: "read error", env: env(""), readFile: file("", fs.ErrPermission), wantErr: `checkpoint.namespace: not set and reading /var/run/secrets/kubernetes.io/serviceaccount/namespace failed: permission denied`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &Config{Checkpoint: Checkpoint{Namespace: tt.set}}
			err := c.ResolveDefaults(tt.env, tt.readFile)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v, want %s", err, tt.wantErr)
				}
				if c.Checkpoint.Namespace != "" {
					t.Errorf("namespace set to %q on error", c.Checkpoint.Namespace)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Checkpoint.Namespace != tt.want {
				t.Errorf("namespace = %q, want %q", c.Checkpoint.Namespace, tt.want)
			}
		})
	}
}

func TestDuration(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
		str  string
		err  string
	}{
		{in: "5m", want: 5 * time.Minute, str: "5m"},
		{in: "1h", want: time.Hour, str: "1h"},
		{in: "1h30m", want: 90 * time.Minute, str: "1h30m"},
		{in: "1h0m5s", want: time.Hour + 5*time.Second, str: "1h0m5s"},
		{in: "250ms", want: 250 * time.Millisecond, str: "250ms"},
		{in: "0", want: 0, str: "0s"},
		{in: "-3s", want: -3 * time.Second, str: "-3s"},
		{in: "'90s'", want: 90 * time.Second, str: "1m30s"},
		{in: "5 minutes", err: `invalid duration "5 minutes" (use Go syntax such as "30s", "5m" or "1h30m")`},
		{in: "300", err: `invalid duration "300" (use Go syntax such as "30s", "5m" or "1h30m")`},
		{in: "{a: 1}", err: `invalid duration: expected a string such as "30s", got a mapping`},
	} {
		var d Duration
		err := yaml.Unmarshal([]byte(tt.in), &d)
		if tt.err != "" {
			if err == nil || err.Error() != tt.err {
				t.Errorf("%q: err = %v, want %s", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || d.Duration() != tt.want || d.String() != tt.str {
			t.Errorf("%q: got %v (%q), %v; want %v (%q)", tt.in, time.Duration(d), d.String(), err, tt.want, tt.str)
		}
		out, err := yaml.Marshal(d)
		if err != nil || strings.TrimSpace(string(out)) != tt.str {
			t.Errorf("%q: Marshal = %q, %v", tt.in, out, err)
		}
	}
}

func TestCheckFiles(t *testing.T) {
	var buf bytes.Buffer
	ok := CheckFiles(&buf, "testdata/good-minimal.yaml", "testdata/bad-neither-kind-nor-resource.yaml", "testdata/nope.yaml", "../../config.example.yaml")
	if ok {
		t.Error("CheckFiles = true with failing files")
	}
	want := `Checking testdata/good-minimal.yaml
  SUCCESS
Checking testdata/bad-neither-kind-nor-resource.yaml
  FAILED:
    testdata/bad-neither-kind-nor-resource.yaml:7: sources[0]: set either apiVersion+kind or resource
    testdata/bad-neither-kind-nor-resource.yaml:9: sources[1].apiVersion: required with kind
Checking testdata/nope.yaml
  FAILED:
    open testdata/nope.yaml: no such file or directory
Checking ../../config.example.yaml
  SUCCESS
`
	if got := buf.String(); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
	buf.Reset()
	// Its credentials go over nats:// too, accepted by
	// allowPlaintextCredentials: a warning.
	if !CheckFiles(&buf, "testdata/good-full.yaml") || buf.String() != "Checking testdata/good-full.yaml\n  SUCCESS\n"+
		`  WARNING: testdata/good-full.yaml:8: nats.allowPlaintextCredentials: "nats://nats-0.nats:4222" is not TLS, so nats.credentialsFile would authenticate an unencrypted connection`+"\n" {
		t.Errorf("CheckFiles(good) printed %q", buf.String())
	}
}

func TestAccessors(t *testing.T) {
	n := NATS{URL: " nats://a:4222 ,, tls://b "}
	if got := n.URLs(); !reflect.DeepEqual(got, []string{"nats://a:4222", "tls://b"}) {
		t.Errorf("URLs = %q", got)
	}
	var s Source
	for _, e := range AllEventTypes() {
		if !s.Publishes(e) {
			t.Errorf("empty EventTypes must publish %s", e)
		}
	}
	if s.Publishes("other") {
		t.Error("Publishes(other) = true")
	}
	var b Backoff
	if b.JitterFraction() != DefaultRelistBackoffJitter {
		t.Errorf("JitterFraction of unset = %v", b.JitterFraction())
	}
	c := Config{Cluster: "c"}
	if got := c.StreamSubject(); got != "k8s.c.>" {
		t.Errorf("StreamSubject = %q", got)
	}
}

func TestEditDistance(t *testing.T) {
	for _, tt := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "abc", 0}, {"nmae", "name", 1}, {"sourcez", "sources", 1},
		{"namespace", "namespaces", 1}, {"kitten", "sitting", 3}, {"", "abc", 3},
	} {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

func parseFile(t *testing.T, path string) *Config {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(data, path)
	if err != nil {
		t.Fatalf("Parse(%s):\n%v", path, err)
	}
	return cfg
}

func TestNATSSecurityKeys(t *testing.T) {
	base := "cluster: dev\nsources: [{name: pods, apiVersion: v1, kind: Pod}]\nnats:\n  url: tls://n:4222\n  stream: {name: K8S}\n"
	tests := []struct {
		name, nats, want string
	}{
		{"every key, one auth", "  nkeySeedFile: /s/seed\n  tls: {caFile: /s/ca, certFile: /s/crt, keyFile: /s/key, serverName: nats.example.com}\n  jsDomain: hub\n  inboxPrefix: _INBOX_relayd\n", ""},
		{"user and password", "  userFile: /s/u\n  passwordFile: /s/p\n", ""},
		{"creds and nkey", "  credentialsFile: /s/c\n  nkeySeedFile: /s/n\n",
			"x:7: nats.nkeySeedFile: cannot be combined with nats.credentialsFile (set only one)"},
		{"token and user", "  tokenFile: /s/t\n  userFile: /s/u\n  passwordFile: /s/p\n",
			"x:7: nats.userFile: cannot be combined with nats.tokenFile (set only one)"},
		{"nkey and password only", "  nkeySeedFile: /s/n\n  passwordFile: /s/p\n",
			"x:7: nats.passwordFile: cannot be combined with nats.nkeySeedFile (set only one)\nx:3: nats.userFile: required with nats.passwordFile"},
		{"user without password", "  userFile: /s/u\n", "x:3: nats.passwordFile: required with nats.userFile"},
		{"cert without key", "  tls: {certFile: /s/crt}\n", "x:6: nats.tls.keyFile: required with nats.tls.certFile"},
		{"key without cert", "  tls: {keyFile: /s/key}\n", "x:6: nats.tls.certFile: required with nats.tls.keyFile"},
		{"bad server name", "  tls: {serverName: 'a b'}\n", `x:6: nats.tls.serverName: "a b" is not a valid host name`},
		{"bad domain", "  jsDomain: a.b\n", `x:6: nats.jsDomain: "a.b" is not a valid JetStream domain (must be letters, digits, '_' and '-')`},
		{"bad inbox prefix", "  inboxPrefix: '_INBOX.>'\n", `x:6: nats.inboxPrefix: "_INBOX.>" is not a valid inbox prefix (must be dot-separated tokens of letters, digits, '_' and '-', no wildcards)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(base+tt.nats), "x")
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

// Credentials in a URL never reach an error message, even when the URL does
// not parse or is part of a list with an empty entry.
func TestURLCredentialsAreRedacted(t *testing.T) {
	for _, url := range []string{
		"nats://relayd:hunter2@h:4222,,nats://x",
		"nats://relayd:hunter2@h:%zz",
		"nats://hunter2@h:99999",
		"ftp://relayd:hunter2@h",
		"relayd:hunter2@h:4222",
	} {
		_, err := Parse([]byte("cluster: dev\nsources: [{name: p, apiVersion: v1, kind: Pod}]\nnats: {url: '"+url+"', stream: {name: K8S}}\n"), "x")
		if err == nil {
			t.Fatalf("%s: no error", url)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the secret: %v", url, err)
		}
		if !strings.Contains(err.Error(), "xxxxx") {
			t.Errorf("%s: the error does not show where the secret was: %v", url, err)
		}
	}
	// Everything up to the last '@' is hidden but the scheme that starts
	// the text, whatever the shape: an '@' in a path hides the host.
	for in, want := range map[string]string{
		"nats://h:4222":                "nats://h:4222",
		"nats://u:p@h:4222/x@y":        "nats://xxxxx@y",
		"tok@h":                        "xxxxx@h",
		" tls://a:b@c@h ":              " tls://xxxxx@h ",
		"wss://h/path?user=a@b":        "wss://xxxxx@b",
		"nats://h:1,nats://u:p@h:2":    "nats://xxxxx@h:2",
		"nats//u:p@h":                  "xxxxx@h",
		"NATS://u:p/q@h":               "NATS://xxxxx@h",
		"nats://a,b":                   "nats://a,b",
		"nats://u:p,nats://q@h:1,tls:": "nats://xxxxx@h:1,tls:",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// Every config shown in the README and docs/ (a ```yaml block that starts
// with "cluster:") loads.
func TestConfigsInTheDocsLoad(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, doc := range append(files, "../../README.md") {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for i, block := range strings.Split(string(b), "```yaml\n")[1:] {
			block, _, _ = strings.Cut(block, "```")
			if !strings.HasPrefix(block, "cluster:") {
				continue
			}
			n++
			path := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(path, []byte(block), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := Load(path); err != nil {
				t.Errorf("%s, yaml block %d: %v", doc, i+1, err)
			}
		}
	}
	if n == 0 {
		t.Error("no config example found in README.md or docs/")
	}
}

func TestCheckpointShards(t *testing.T) {
	for _, c := range []struct {
		yaml string
		want int
	}{
		{"sources: [{name: a, apiVersion: v1, kind: Pod}]\n", 1},
		{"checkpoint: {watchesPerConfigMap: 2}\nsources: [{name: a, apiVersion: v1, kind: Pod, namespaces: [n1, n2]}, {name: b, apiVersion: v1, kind: Service}]\n", 2},
		{"checkpoint: {watchesPerConfigMap: 2}\nsources: [{name: a, apiVersion: v1, kind: Pod, namespaces: [n1, n2, n3, n4]}]\n", 2},
	} {
		cfg, err := Parse([]byte("cluster: dev\nnats: {url: nats://127.0.0.1:4222, stream: {name: K8S}}\n"+c.yaml), "x")
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.CheckpointShards(); got != c.want {
			t.Errorf("%s: CheckpointShards = %d (watches %d), want %d", c.yaml, got, cfg.Watches(), c.want)
		}
	}
}
