package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
)

// auditPolicy logs every list and watch request at level Metadata (who,
// what, the request URI and the response code), except the apiserver's own
// (its informers), once the response is complete or has started (a watch).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  users: ["system:apiserver"]
- level: Metadata
  verbs: ["list", "watch"]
- level: None
`

// AuditEvent is one entry of the apiserver's audit log (Options.AuditLog),
// the fields of audit.k8s.io/v1 Event the tests read.
type AuditEvent struct {
	Stage      string `json:"stage"` // ResponseStarted (a watch that was answered) or ResponseComplete
	Verb       string `json:"verb"`  // list, watch
	RequestURI string `json:"requestURI"`
	UserAgent  string `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource  string `json:"resource"`
		Namespace string `json:"namespace"`
		APIGroup  string `json:"apiGroup"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// Query is the request URI's query parameters.
func (a AuditEvent) Query() url.Values {
	u, err := url.ParseRequestURI(a.RequestURI)
	if err != nil {
		return url.Values{}
	}
	return u.Query()
}

// Code is the response's HTTP status code (0 when the entry has none).
func (a AuditEvent) Code() int {
	if a.ResponseStatus == nil {
		return 0
	}
	return a.ResponseStatus.Code
}

// Resource is objectRef's resource and namespace ("" when absent).
func (a AuditEvent) Resource() (resource, namespace string) {
	if a.ObjectRef == nil {
		return "", ""
	}
	return a.ObjectRef.Resource, a.ObjectRef.Namespace
}

func (e *Env) auditFiles() (policy, log string) {
	return filepath.Join(e.dir, "audit-policy.yaml"), filepath.Join(e.dir, "audit.log")
}

func (e *Env) writeAuditPolicy() error {
	policy, _ := e.auditFiles()
	return os.WriteFile(policy, []byte(auditPolicy), 0o600)
}

func (e *Env) auditArgs() []string {
	policy, log := e.auditFiles()
	// The log backend's default mode is blocking: an event is in the file
	// before the apiserver answers the next request of the same client.
	return []string{"--audit-policy-file=" + policy, "--audit-log-path=" + log, "--audit-log-format=json"}
}

// AuditEvents reads the audit log so far (every apiserver run of e). It is
// an error when e was started without Options.AuditLog.
func (e *Env) AuditEvents() ([]AuditEvent, error) {
	if !e.opts.AuditLog {
		return nil, fmt.Errorf("testenv: the %s env was started without Options.AuditLog", e.version)
	}
	_, log := e.auditFiles()
	f, err := os.Open(log)
	if err != nil {
		return nil, fmt.Errorf("testenv: audit log: %w", err)
	}
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		var a AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			return nil, fmt.Errorf("testenv: audit log %s line %d: %w", log, n, err)
		}
		out = append(out, a)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("testenv: audit log %s: %w", log, err)
	}
	return out, nil
}
