package stream

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// addSubject adds subject to the subjects of the stream name, changing
// nothing else of it: it reads the stream's configuration as the server's
// own JSON (STREAM.INFO) and sends that back with only "subjects" changed
// (STREAM.UPDATE). Going through jetstream.StreamConfig instead would send
// back only the settings nats.go models, and reset any other one a newer
// server has. It returns false, without an update, when one of the stream's
// subjects captures subject already (another relayd added it meanwhile).
func addSubject(ctx context.Context, js jetstream.JetStream, name, subject string) (bool, error) {
	cfg, err := apiRequest(ctx, js, "STREAM.INFO."+name, nil)
	if err != nil {
		return false, err
	}
	var subjects []string
	if raw, ok := cfg["subjects"]; ok {
		if err := json.Unmarshal(raw, &subjects); err != nil {
			return false, fmt.Errorf("the subjects of its configuration: %w", err)
		}
	}
	if slices.ContainsFunc(subjects, func(s string) bool { return Captures(s, subject) }) {
		return false, nil
	}
	if cfg["subjects"], err = json.Marshal(append(subjects, subject)); err != nil {
		return false, err
	}
	body, err := json.Marshal(cfg)
	if err != nil {
		return false, err
	}
	if _, err := apiRequest(ctx, js, "STREAM.UPDATE."+name, body); err != nil {
		return false, err
	}
	return true, nil
}

// apiRequest sends a JetStream API request (subj without the API prefix,
// e.g. "STREAM.INFO.K8S") on the connection of js, under its API prefix (so
// in its domain), and returns the "config" object of the response key by
// key, each value as the server wrote it. An error response is returned as
// a *jetstream.APIError.
func apiRequest(ctx context.Context, js jetstream.JetStream, subj string, body []byte) (map[string]json.RawMessage, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, js.Options().DefaultTimeout)
		defer cancel()
	}
	subj = apiPrefix(js.Options()) + subj
	msg, err := js.Conn().RequestWithContext(ctx, subj, body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", subj, err)
	}
	var resp struct {
		Error  *jetstream.APIError        `json:"error"`
		Config map[string]json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("%s: response: %w", subj, err)
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	if resp.Config == nil {
		return nil, fmt.Errorf("%s: %w: no config", subj, jetstream.ErrInvalidJetStreamResponse)
	}
	return resp.Config, nil
}

// apiPrefix is the subject prefix of the JetStream API requests made with
// o, as nats.go builds it: "$JS.<domain>.API." in a domain, the API prefix
// (with a trailing dot) when one is set, "$JS.API." otherwise.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}
