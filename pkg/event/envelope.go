package event

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Envelope is a decoded relayd CloudEvent: the attributes and extensions of
// an object event or a control event, and the raw data.
type Envelope struct {
	SpecVersion     string    `json:"specversion"`
	ID              string    `json:"id"`
	Source          string    `json:"source"`
	Type            string    `json:"type"`
	Subject         string    `json:"subject"`
	Time            time.Time `json:"time"`
	DataContentType string    `json:"datacontenttype"`

	K8sCluster         string `json:"k8scluster"`
	K8sAPIVersion      string `json:"k8sapiversion"`
	K8sKind            string `json:"k8skind"`
	K8sResource        string `json:"k8sresource"`
	K8sNamespace       string `json:"k8snamespace"`
	K8sName            string `json:"k8sname"`
	K8sUID             string `json:"k8suid"`
	K8sResourceVersion string `json:"k8sresourceversion"`
	// K8sManager, K8sOperation and K8sSubresource name who made the change
	// (object events other than deletes; see Author): the field manager,
	// Apply or Update, and the subresource ("" when none). When several
	// managedFields entries share the newest time, each is a list joined
	// by ',' (items percent-encode their own '%' and ','), item i of each
	// list describing the same entry.
	K8sManager     string `json:"k8smanager"`
	K8sOperation   string `json:"k8soperation"`
	K8sSubresource string `json:"k8ssubresource"`

	RelaydSource   string `json:"relaydsource"`
	RelaydOrigin   string `json:"relaydorigin"`
	RelaydEpoch    uint64 `json:"relaydepoch"`
	RelaydPayload  string `json:"relaydpayload"`
	RelaydOversize bool   `json:"relaydoversize"`
	// RelaydUnencodable is true on an event sent without data because even
	// its reference exceeded the NATS max payload (RelaydPayload "none").
	RelaydUnencodable  bool `json:"relaydunencodable"`
	RelaydFinalUnknown bool `json:"relaydfinalunknown"`
	// RelaydDropped is the relayddropped extension: the canonical paths
	// removed from the data, joined by "," (see Change.Dropped); "" when
	// nothing was removed. Split it with strings.Split: canonical paths
	// never contain ','.
	RelaydDropped string `json:"relayddropped"`
	// RelaydChanged is the relaydchanged extension of a modified event of
	// a source with changedPaths: the canonical paths whose content
	// differs from the version published before, joined by ","; ""
	// when none did. RelaydChangedUnknown (relaydchangedunknown) lists
	// the paths for which relayd does not know (docs/CONSUMING.md, "What
	// changed").
	RelaydChanged        string `json:"relaydchanged"`
	RelaydChangedUnknown string `json:"relaydchangedunknown"`
	// RelaydScope is the relaydscope extension: "entered" on an added
	// event of an object that started to match the source's filter,
	// "left" on a deleted event of one that stopped matching; "" otherwise
	// (docs/CONSUMING.md, "Filters: entering and leaving scope").
	RelaydScope string `json:"relaydscope"`
	// RelaydTruncated is the relaydtruncated extension: the extensions,
	// joined by ",", that name only part of what they would because they
	// exceeded their caps (MaxAuthorEntries, MaxExtensionBytes) or, on an
	// event without data, the max payload; "" when none did
	// (docs/CONSUMING.md, "Truncated extensions").
	RelaydTruncated string `json:"relaydtruncated"`

	Data json.RawMessage `json:"data"`
}

// DecodeStructured decodes a structured-mode event body
// (application/cloudevents+json) with encoding/json. It is meant for tests
// and the tail command, not the hot path. It fails on invalid JSON, on a
// specversion other than "1.0" and on a missing id, source or type.
func DecodeStructured(data []byte) (Envelope, error) {
	var v struct {
		Envelope
		Legacy bool `json:"relaydfinalstateunknown"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return Envelope{}, fmt.Errorf("decode CloudEvent: %w", err)
	}
	env := v.Envelope
	env.RelaydFinalUnknown = env.RelaydFinalUnknown || v.Legacy
	if err := env.check(); err != nil {
		return Envelope{}, err
	}
	return env, nil
}

// LegacyFinalUnknown is the name earlier relayd versions gave the
// relaydfinalunknown extension (23 characters, over the 20 that CloudEvents
// recommends). The decoders read either, so that messages already in a
// stream keep their meaning.
const LegacyFinalUnknown = "relaydfinalstateunknown"

func (env *Envelope) check() error {
	switch {
	case env.SpecVersion != SpecVersion:
		return fmt.Errorf("decode CloudEvent: specversion %q, want %q", env.SpecVersion, SpecVersion)
	case env.ID == "":
		return errors.New("decode CloudEvent: missing id")
	case env.Source == "":
		return errors.New("decode CloudEvent: missing source")
	case env.Type == "":
		return errors.New("decode CloudEvent: missing type")
	}
	return nil
}

// DecodeMessage decodes an event in either content mode from a NATS
// message's header and body: structured when Content-Type is
// application/cloudevents+json, binary (ce-* headers, percent-decoded)
// otherwise. Header names are matched case-insensitively. In binary mode
// Data aliases data. Like DecodeStructured it is not for the hot path.
func DecodeMessage(header map[string][]string, data []byte) (Envelope, error) {
	ct := headerGet(header, HeaderContentType)
	if mt, _, _ := strings.Cut(ct, ";"); strings.EqualFold(strings.TrimSpace(mt), ContentTypeCloudEvents) {
		return DecodeStructured(data)
	}
	env := Envelope{DataContentType: ct, Data: data}
	for k, vs := range header {
		if len(k) <= len(HeaderPrefix) || !strings.EqualFold(k[:len(HeaderPrefix)], HeaderPrefix) || len(vs) == 0 {
			continue
		}
		name := strings.ToLower(k[len(HeaderPrefix):])
		v, err := decodeHeaderValue(vs[0])
		if err != nil {
			return Envelope{}, fmt.Errorf("decode CloudEvent: header %s: %w", k, err)
		}
		if err := env.setAttr(name, v); err != nil {
			return Envelope{}, fmt.Errorf("decode CloudEvent: header %s: %w", k, err)
		}
	}
	if err := env.check(); err != nil {
		return Envelope{}, err
	}
	return env, nil
}

func (env *Envelope) setAttr(name, v string) error {
	var err error
	switch name {
	case "specversion":
		env.SpecVersion = v
	case "id":
		env.ID = v
	case "source":
		env.Source = v
	case "type":
		env.Type = v
	case "subject":
		env.Subject = v
	case "time":
		env.Time, err = time.Parse(time.RFC3339Nano, v)
	case "datacontenttype":
		env.DataContentType = v
	case "k8scluster":
		env.K8sCluster = v
	case "k8sapiversion":
		env.K8sAPIVersion = v
	case "k8skind":
		env.K8sKind = v
	case "k8sresource":
		env.K8sResource = v
	case "k8snamespace":
		env.K8sNamespace = v
	case "k8sname":
		env.K8sName = v
	case "k8suid":
		env.K8sUID = v
	case "k8sresourceversion":
		env.K8sResourceVersion = v
	case "k8smanager":
		env.K8sManager = v
	case "k8soperation":
		env.K8sOperation = v
	case "k8ssubresource":
		env.K8sSubresource = v
	case "relaydsource":
		env.RelaydSource = v
	case "relaydorigin":
		env.RelaydOrigin = v
	case "relaydepoch":
		env.RelaydEpoch, err = strconv.ParseUint(v, 10, 64)
	case "relaydpayload":
		env.RelaydPayload = v
	case "relaydoversize":
		env.RelaydOversize, err = strconv.ParseBool(v)
	case "relaydunencodable":
		env.RelaydUnencodable, err = strconv.ParseBool(v)
	case "relaydfinalunknown", LegacyFinalUnknown:
		env.RelaydFinalUnknown, err = strconv.ParseBool(v)
	case "relayddropped":
		env.RelaydDropped = v
	case "relaydchanged":
		env.RelaydChanged = v
	case "relaydchangedunknown":
		env.RelaydChangedUnknown = v
	case "relaydscope":
		env.RelaydScope = v
	case "relaydtruncated":
		env.RelaydTruncated = v
	}
	return err
}

func headerGet(h map[string][]string, key string) string {
	if vs := h[key]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range h {
		if strings.EqualFold(k, key) && len(vs) > 0 {
			return vs[0]
		}
	}
	return ""
}

// decodeHeaderValue inverts the percent-encoding of ce-* header values.
func decodeHeaderValue(v string) (string, error) {
	if strings.IndexByte(v, '%') < 0 {
		return v, nil
	}
	b := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			b = append(b, v[i])
			continue
		}
		if i+2 >= len(v) || !isHex(v[i+1]) || !isHex(v[i+2]) {
			return "", fmt.Errorf("malformed percent-encoding at offset %d", i)
		}
		b = append(b, unhex(v[i+1])<<4|unhex(v[i+2]))
		i += 2
	}
	return string(b), nil
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
