package event

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
)

// testKey is a fingerprint key for tests.
var testKey = mustKey("0123456789abcdef0123456789abcdef")

func mustKey(s string) *FingerprintKey {
	k, err := NewFingerprintKey([]byte(s))
	if err != nil {
		panic(err)
	}
	return k
}

// hmac64 is the keyed fingerprint of the fingerprinted bytes b, computed
// from its definition: the first 64 bits of HMAC-SHA256(key, b), big-endian.
func hmac64(key string, b []byte) uint64 {
	m := hmac.New(sha256.New, []byte(key))
	m.Write(b)
	return binary.BigEndian.Uint64(m.Sum(nil))
}

func TestNewFingerprintKey(t *testing.T) {
	for _, in := range []string{"", "\n", "0123456789abcde", "  0123456789abcde\n"} {
		_, err := NewFingerprintKey([]byte(in))
		want := "the key is 15 bytes (surrounding whitespace trimmed); it must be at least 16, e.g. the output of `openssl rand -hex 32`"
		if in == "" || in == "\n" {
			want = strings.Replace(want, "15 bytes", "0 bytes", 1)
		}
		if err == nil || err.Error() != want {
			t.Errorf("NewFingerprintKey(%q) = %v, want %s", in, err, want)
		}
	}
	// Surrounding whitespace (a key file's trailing newline) is not part of
	// the key; the ID is pinned: it is stored in the index bucket.
	k := mustKey("\t0123456789abcdef0123456789abcdef \n")
	if k.ID() != testKey.ID() {
		t.Errorf("ID with whitespace %s, without %s", k.ID(), testKey.ID())
	}
	const wantID = "dcd201a6c8c10f67"
	if got := testKey.ID(); got != wantID {
		t.Errorf("ID() = %s, want %s: the ID of a key must never change", got, wantID)
	}
	if got := hmac64("0123456789abcdef0123456789abcdef", []byte(keyIDLabel)); got != binary.BigEndian.Uint64(mustHex(t, testKey.ID())) {
		t.Errorf("ID() = %s, want the first 64 bits of HMAC-SHA256(key, %q) = %016x", testKey.ID(), keyIDLabel, got)
	}
	if other := mustKey("0123456789abcdef0123456789abcdeF"); other.ID() == testKey.ID() {
		t.Error("two keys have the same ID")
	}
	var none *FingerprintKey
	if none.ID() != "" || NewFingerprinter(nil).KeyID() != "" {
		t.Error("a nil key has an ID")
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 8 {
		t.Fatalf("%q is not 16 hex digits", s)
	}
	return b
}

// The keyed fingerprint hashes the same bytes as the unkeyed one, with the
// key: it changes with the key, is stable for a key, and leaves out the
// same members.
func TestKeyedFingerprint(t *testing.T) {
	s := mustShaping(t, ShapingOptions{IgnoreChanges: []string{"metadata.annotations"}, Drop: []string{"data"}})
	base := `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"ns","uid":"u","resourceVersion":"1","annotations":{"rotated":"1"}},"data":{"password":"aHVudGVyMg=="},"type":"Opaque"}`
	parse := func(raw string) *Object {
		t.Helper()
		o, err := ParseObjectShaped([]byte(raw), s)
		if err != nil {
			t.Fatal(err)
		}
		return &o
	}
	o := parse(base)
	f := NewFingerprinter(testKey)
	want := hmac64("0123456789abcdef0123456789abcdef", fingerprintBytes(o))
	if got := f.Fingerprint(o); got != want {
		t.Errorf("keyed Fingerprint = %#x, want HMAC-SHA256 of the fingerprinted bytes %#x", got, want)
	}
	if got := string(fingerprintBytes(o)); got != `{"metadata":{"name":"s","namespace":"ns","uid":"u"},"data":{"password":"aHVudGVyMg=="},"type":"Opaque"}` {
		t.Errorf("fingerprinted bytes %s", got)
	}
	// Stable: again, and with another Fingerprinter of an equal key.
	if f.Fingerprint(o) != want || NewFingerprinter(mustKey("0123456789abcdef0123456789abcdef\n")).Fingerprint(o) != want {
		t.Error("the keyed fingerprint is not stable for a key")
	}
	// Another key, or none: another fingerprint; none is the unkeyed one.
	if NewFingerprinter(mustKey("another key, 16+ bytes")).Fingerprint(o) == want {
		t.Error("the fingerprint does not change with the key")
	}
	if got := NewFingerprinter(nil).Fingerprint(o); got != o.Fingerprint(s) || got == want {
		t.Errorf("unkeyed Fingerprinter = %#x, want Object.Fingerprint %#x", got, o.Fingerprint(s))
	}
	// The same members count: ignored ones do not, dropped ones do.
	if f.Fingerprint(parse(strings.Replace(base, `"rotated":"1"`, `"rotated":"2"`, 1))) != want {
		t.Error("a change in an ignored member changes the keyed fingerprint")
	}
	if f.Fingerprint(parse(strings.Replace(base, `aHVudGVyMg==`, `aHVudGVyMw==`, 1))) == want {
		t.Error("a change in a dropped member does not change the keyed fingerprint")
	}
	var empty Object
	if f.Fingerprint(&empty) != 0 {
		t.Error("an Object without spans has a keyed fingerprint")
	}
	// No allocation per fingerprint.
	if n := testing.AllocsPerRun(100, func() { _ = f.Fingerprint(o) }); n != 0 {
		t.Errorf("keyed Fingerprint allocates %v times", n)
	}
}
