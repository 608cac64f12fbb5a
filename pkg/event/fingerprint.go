package event

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"os"
)

// MinFingerprintKeyLen is the shortest key NewFingerprintKey accepts, in
// bytes.
const MinFingerprintKeyLen = 16

// FingerprintKey is the secret that keys fingerprints: with one, a
// fingerprint is HMAC-SHA256(key, the bytes Object.Fingerprint hashes),
// truncated to its first 64 bits, instead of their xxhash64. A fingerprint
// covers what the payload may leave out (dropped members, the last-applied
// annotation, everything but metadata in a metadata payload) and is stored
// in the index bucket; unkeyed, whoever reads the bucket and knows the rest
// of the object can test guesses of those members offline. Keyed, the
// stored value reveals nothing without the key, and a change cannot be
// crafted to keep it.
//
// A FingerprintKey is immutable and safe for concurrent use; the hashing
// state is in a Fingerprinter.
type FingerprintKey struct {
	secret []byte
	id     string
}

// keyIDLabel is what the key identifier is the HMAC of. Fingerprinted bytes
// always start with '{', so no fingerprint input equals it.
const keyIDLabel = "relayd fingerprint key id"

// ReadFingerprintKey reads the key from the file at path (NewFingerprintKey
// of its contents); nil, and no error, when path is "".
func ReadFingerprintKey(path string) (*FingerprintKey, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := NewFingerprintKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// NewFingerprintKey returns the key held in secret (the contents of a key
// file), with surrounding whitespace (a trailing newline) trimmed. It must
// be at least MinFingerprintKeyLen bytes.
func NewFingerprintKey(secret []byte) (*FingerprintKey, error) {
	s := bytes.TrimSpace(secret)
	if len(s) < MinFingerprintKeyLen {
		return nil, fmt.Errorf("the key is %d bytes (surrounding whitespace trimmed); it must be at least %d, e.g. the output of `openssl rand -hex 32`", len(s), MinFingerprintKeyLen)
	}
	k := &FingerprintKey{secret: bytes.Clone(s)}
	m := hmac.New(sha256.New, k.secret)
	m.Write([]byte(keyIDLabel))
	k.id = hex.EncodeToString(m.Sum(nil)[:8])
	return k, nil
}

// ID identifies the key without revealing it: 16 lower-case hex digits,
// the first 64 bits of HMAC-SHA256(key, "relayd fingerprint key id"). The
// index bucket stores it with every keyed fingerprint, so that a
// fingerprint made under another key (or none) is recognised. "" for a nil
// key.
func (k *FingerprintKey) ID() string {
	if k == nil {
		return ""
	}
	return k.id
}

// Fingerprinter computes fingerprints, keyed or not. It keeps its hashing
// state between calls, so that a keyed fingerprint allocates nothing: one
// per goroutine (relayd has one per watch); it is not safe for concurrent
// use.
type Fingerprinter struct {
	key *FingerprintKey
	mac hash.Hash // nil without a key
	sum [sha256.Size]byte
}

// NewFingerprinter returns a Fingerprinter for key; a nil key makes the
// unkeyed fingerprint, Object.Fingerprint.
func NewFingerprinter(key *FingerprintKey) *Fingerprinter {
	f := &Fingerprinter{key: key}
	if key != nil {
		f.mac = hmac.New(sha256.New, key.secret)
	}
	return f
}

// KeyID is the ID of the key (FingerprintKey.ID); "" when unkeyed.
func (f *Fingerprinter) KeyID() string { return f.key.ID() }

// openBrace is the first byte every fingerprint hashes (a package variable,
// so that passing it to the hash allocates nothing).
var openBrace = []byte{'{'}

// Fingerprint returns the fingerprint of o: the bytes Object.Fingerprint
// hashes (the object minus the IgnoreChanges members, apiVersion, kind and
// metadata.resourceVersion, generation and managedFields), hashed with the
// key when there is one, else o.Fingerprint. The spans are those recorded by
// the parse (see Object.Fingerprint). An Object without byte spans has
// fingerprint 0.
func (f *Fingerprinter) Fingerprint(o *Object) uint64 {
	if f.mac == nil {
		return o.Fingerprint(o.sh)
	}
	if !o.parsed() {
		return 0
	}
	var c cutter
	c.init(o, o.start+1, o.end, fingerprintMask)
	f.mac.Reset()
	_, _ = f.mac.Write(openBrace)
	for {
		a, b, ok := c.next(o)
		if !ok {
			break
		}
		_, _ = f.mac.Write(o.Raw[a:b])
	}
	return binary.BigEndian.Uint64(f.mac.Sum(f.sum[:0]))
}
