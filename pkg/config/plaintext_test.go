package config

import (
	"strconv"
	"strings"
	"testing"
)

// Credentials of every kind are refused on a connection that is not TLS,
// naming nats.url, the URLs and the key, unless
// nats.allowPlaintextCredentials accepts them: then they are a warning,
// at the key's line. A URL is TLS when it is tls:// or wss://, and every
// URL is when a nats.tls key is set.
func TestCredentialsNeedTLS(t *testing.T) {
	const head = "cluster: dev\nsources: [{name: p, apiVersion: v1, kind: Pod}]\nnats:\n  stream: {name: K8S}\n"
	const fix = " (use tls:// or wss://, or a nats.tls key; or set nats.allowPlaintextCredentials to accept that)"
	creds := map[string]string{
		"nats.credentialsFile":                "  credentialsFile: /s/relayd.creds\n",
		"nats.nkeySeedFile":                   "  nkeySeedFile: /s/seed\n",
		"nats.tokenFile":                      "  tokenFile: /s/token\n",
		"nats.userFile and nats.passwordFile": "  userFile: /s/user\n  passwordFile: /s/password\n",
	}
	for key, auth := range creds {
		for _, tc := range []struct {
			name, nats string
			plain      string // the URLs refused, as shown; "" for none
		}{
			{"nats://", "  url: nats://h:4222\n", `"nats://h:4222" is`},
			{"ws://", "  url: ws://h:8080\n", `"ws://h:8080" is`},
			{"loopback", "  url: nats://127.0.0.1:4222\n", `"nats://127.0.0.1:4222" is`},
			{"tls://", "  url: tls://h:4222\n", ""},
			{"wss://", "  url: wss://h:443\n", ""},
			{"upper-case TLS://", "  url: TLS://h:4222\n", ""},
			{"nats:// with a CA", "  url: nats://h:4222\n  tls: {caFile: /s/ca.crt}\n", ""},
			{"nats:// with a server name", "  url: nats://h:4222\n  tls: {serverName: h.example}\n", ""},
			{"list with plain entries", "  url: tls://a:4222, nats://b:4222,ws://c:80\n", `"nats://b:4222", "ws://c:80" are`},
		} {
			t.Run(key+"/"+tc.name, func(t *testing.T) {
				doc := head + tc.nats + auth
				_, err := Parse([]byte(doc), "x")
				want := ""
				if tc.plain != "" {
					want = "x:5: nats.url: " + tc.plain + " not TLS, so " + key + " would authenticate an unencrypted connection" + fix
				}
				if got := errString(err); got != want {
					t.Errorf("\n got: %s\nwant: %s", got, want)
				}

				cfg, err := Parse([]byte(doc+"  allowPlaintextCredentials: true\n"), "x")
				if err != nil {
					t.Fatalf("opted out: %v", err)
				}
				var warnings []string
				for _, w := range cfg.Warnings() {
					warnings = append(warnings, w.Error())
				}
				want = ""
				if tc.plain != "" {
					line := strings.Count(doc, "\n") + 1
					want = "x:" + strconv.Itoa(line) + ": nats.allowPlaintextCredentials: " + tc.plain + " not TLS, so " + key + " would authenticate an unencrypted connection"
				}
				if got := strings.Join(warnings, "\n"); got != want {
					t.Errorf("warnings\n got: %s\nwant: %s", got, want)
				}
			})
		}
	}

	// Without credentials nothing is refused or warned about.
	for _, opt := range []string{"", "  allowPlaintextCredentials: true\n"} {
		cfg, err := Parse([]byte(head+"  url: nats://h:4222\n"+opt), "x")
		if err != nil || len(cfg.Warnings()) != 0 {
			t.Errorf("no credentials, %q: %v, warnings %v", opt, err, cfg.Warnings())
		}
	}
}

// ValidateConnection checks a nats block built in Go (as `relayd tail`
// builds it from its flags) as Validate checks the file's.
func TestValidateConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    NATS
		want string
	}{
		{"plain, no credentials", NATS{URL: "nats://127.0.0.1:4222"}, ""},
		{"creds over tls", NATS{URL: "tls://h:4222", CredentialsFile: "/c"}, ""},
		{"creds over nats", NATS{URL: "nats://h:4222", CredentialsFile: "/c"},
			`nats.url: "nats://h:4222" is not TLS, so nats.credentialsFile would authenticate an unencrypted connection (use tls:// or wss://, or a nats.tls key; or set nats.allowPlaintextCredentials to accept that)`},
		{"creds over nats, accepted", NATS{URL: "nats://h:4222", CredentialsFile: "/c", AllowPlaintextCredentials: true}, ""},
		{"token in the URL", NATS{URL: "nats://s3cr3t@h:4222"},
			`nats.url: "nats://xxxxx@h:4222" holds credentials, or an '@' (credentials go in a file: nats.credentialsFile, nats.nkeySeedFile, nats.tokenFile or nats.userFile)`},
		{"no URL", NATS{}, "nats.url: required"},
		{"two kinds", NATS{URL: "tls://h", TokenFile: "/t", NkeySeedFile: "/n"}, "nats.tokenFile: cannot be combined with nats.nkeySeedFile (set only one)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errString(tc.n.ValidateConnection()); got != tc.want {
				t.Errorf("\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
