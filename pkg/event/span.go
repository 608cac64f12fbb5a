package event

// Exported pieces of the scanner, for packages that read values out of an
// object's JSON bytes without decoding them (pkg/filter's lazy CEL value).

// SkipValue validates the JSON value starting at data[i] (no leading
// whitespace) and returns the offset just past it.
func SkipValue(data []byte, i int) (int, error) {
	return skipValue(data, i, 0)
}

// ScanString validates the JSON string starting at data[i] == '"' and
// returns the offset just past its closing quote, and whether its contents
// (data[i+1:end-1]) decode to themselves (no escape, valid UTF-8).
func ScanString(data []byte, i int) (end int, plain bool, err error) {
	end, flags, err := scanString(data, i)
	if err != nil {
		return 0, false, err
	}
	return end, stringIsPlain(data[i+1:end-1], flags), nil
}

// AppendUnquoted appends the decoded contents s of a JSON string (the text
// between the quotes, validated by ScanString) to dst, decoding as
// encoding/json does (invalid UTF-8 and unpaired surrogates become U+FFFD).
func AppendUnquoted(dst, s []byte) []byte {
	return appendUnquoted(dst, s)
}
