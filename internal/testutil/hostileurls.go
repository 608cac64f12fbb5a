package testutil

// URLSecret is what the hostile URLs hide: every part of a credential in
// them (the user name included) contains it, so a message that shows any
// fragment of one, cut at whatever character, shows it.
const URLSecret = "sEcReT"

// HostileURL is a NATS URL (or a list of them) with credentials in a
// shape that naive redaction misses.
type HostileURL struct {
	Name string
	URL  string
}

// HostileURLs are the NATS URLs whose credentials must never reach an
// error, a log line or the terminal: each holds URLSecret in its user
// information, and each server is 127.0.0.1:1 (nothing listens; a client
// fails at once) or a host that does not resolve.
func HostileURLs() []HostileURL {
	return []HostileURL{
		{"plain user and password", "nats://sEcReTuser:sEcReTpass@127.0.0.1:1"},
		{"token", "nats://sEcReTtoken@127.0.0.1:1"},
		{"slash in the password", "nats://sEcReTuser:sEcReTpa/sEcReTss@127.0.0.1:1"},
		{"missing colon", "nats//sEcReTuser:sEcReTpass@127.0.0.1:1"},
		{"missing slash", "nats:/sEcReTuser:sEcReTpass@127.0.0.1:1"},
		{"no scheme", "sEcReTuser:sEcReTpass@127.0.0.1:1"},
		{"at sign in the password", "nats://sEcReTuser:sEcReTp@sEcReTss@127.0.0.1:1"},
		{"colons in the password", "tls://sEcReTuser:sEcReTp:sEcReTs:@127.0.0.1:1"},
		{"scheme separator in the password", "nats://sEcReTuser:sEcReTp://sEcReTss@127.0.0.1:1"},
		{"bad percent escape", "nats://sEcReTuser:sEcReTp%zzsEcReT@127.0.0.1:1"},
		{"percent-encoded at sign", "nats://sEcReTuser:sEcReTp%40sEcReTss@127.0.0.1:1"},
		{"space in the password", "nats://sEcReTuser:sEcReTp sEcReTss@127.0.0.1:1"},
		{"question mark in the password", "nats://sEcReTuser:sEcReTp?sEcReTss@127.0.0.1:1"},
		{"hash in the password", "wss://sEcReTuser:sEcReTp#sEcReTss@127.0.0.1:1"},
		{"comma in the password", "nats://sEcReTuser:sEcReTp,sEcReTss@127.0.0.1:1"},
		{"comma and scheme in the password", "nats://sEcReTuser:sEcReTp,nats://sEcReTss@127.0.0.1:1"},
		{"list, second with credentials", "nats://127.0.0.1:1,nats://sEcReTuser:sEcReTpass@127.0.0.1:2"},
		{"list, both with credentials", "nats://sEcReTa:sEcReTp1@127.0.0.1:1, tls://sEcReTtoken@127.0.0.1:2"},
		{"list with an empty entry", "nats://sEcReTuser:sEcReTpass@127.0.0.1:1,,nats://127.0.0.1:2"},
		{"upper-case scheme", "NATS://sEcReTuser:sEcReTpass@127.0.0.1:1"},
		{"at sign in the path", "ws://sEcReTuser:sEcReTpass@127.0.0.1:1/p@th"},
		{"nothing after the at sign", "nats://sEcReTuser:sEcReTpass@"},
		{"invalid port", "nats://sEcReTuser:sEcReTpass@127.0.0.1:99999"},
		{"surrounding space", "  nats://sEcReTuser:sEcReTpass@127.0.0.1:1  "},
		{"unknown scheme", "ftp://sEcReTuser:sEcReTpass@127.0.0.1:1"},
	}
}
