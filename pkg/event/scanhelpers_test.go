package event

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"testing"
)

func TestAfterMember(t *testing.T) {
	tests := []struct {
		data    string
		i       int
		next    int
		last    bool
		wantErr string
	}{
		{`1}`, 1, 1, true, ""},
		{"1 \t\r\n}", 1, 5, true, ""},
		{`1,"b"`, 1, 2, false, ""},
		{`1 , "b"`, 1, 4, false, ""},
		{"1,\n\t\"b\"", 1, 4, false, ""},
		{`1`, 1, 0, false, "truncated JSON at offset 1"},
		{`1  `, 1, 0, false, "truncated JSON at offset 3"},
		{`1,`, 1, 0, false, "truncated JSON at offset 2"},
		{`1, `, 1, 0, false, "truncated JSON at offset 3"},
		{`1 "b"`, 1, 0, false, `invalid JSON at offset 2: invalid character '"' after object key:value pair`},
		{`1]`, 1, 0, false, `invalid JSON at offset 1: invalid character ']' after object key:value pair`},
	}
	for _, tt := range tests {
		next, last, err := afterMember([]byte(tt.data), tt.i)
		if tt.wantErr != "" {
			var se *SyntaxError
			if err == nil || err.Error() != tt.wantErr || !errors.As(err, &se) {
				t.Errorf("afterMember(%q, %d): error %v, want *SyntaxError %q", tt.data, tt.i, err, tt.wantErr)
			}
			continue
		}
		if err != nil || next != tt.next || last != tt.last {
			t.Errorf("afterMember(%q, %d) = %d, %v, %v; want %d, %v", tt.data, tt.i, next, last, err, tt.next, tt.last)
		}
	}
}

func TestErrDuplicateKey(t *testing.T) {
	tests := []struct {
		key  int
		want string
	}{
		{fAPIVersion, "duplicate key apiVersion"},
		{fKind, "duplicate key kind"},
		{fNamespace, "duplicate key metadata.namespace"},
		{fName, "duplicate key metadata.name"},
		{fUID, "duplicate key metadata.uid"},
		{fResourceVersion, "duplicate key metadata.resourceVersion"},
		{keyMetadata, "duplicate key metadata"},
		{keyManagedFields, "duplicate key metadata.managedFields"},
	}
	for _, tt := range tests {
		if got := errDuplicateKey(tt.key).Error(); got != tt.want {
			t.Errorf("errDuplicateKey(%d) = %q, want %q", tt.key, got, tt.want)
		}
	}
}

func TestFrameEnd(t *testing.T) {
	tests := []struct {
		frame                string
		haveType, haveObject bool
		want                 string // "" for no error
	}{
		{`{}`, true, true, ""},
		{"{} \n", true, true, ""},
		{`{} x`, true, true, "invalid JSON at offset 3: invalid character 'x' after top-level value"},
		{`{}{}`, false, false, "invalid JSON at offset 2: invalid character '{' after top-level value"},
		{`{}`, false, true, "watch frame has no type"},
		{`{}`, false, false, "watch frame has no type"},
		{`{}`, true, false, "watch frame has no object"},
	}
	for _, tt := range tests {
		err := frameEnd([]byte(tt.frame), 1, tt.haveType, tt.haveObject)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("frameEnd(%q, %v, %v) = %q, want %q", tt.frame, tt.haveType, tt.haveObject, got, tt.want)
		}
	}
}

func TestPathUnicodeEscape(t *testing.T) {
	tests := []struct {
		s       string
		i       int
		r       rune
		n       int
		wantErr string
	}{
		{`\u0041`, 0, 'A', 6, ""},
		{`x\u00e9y`, 1, 'é', 6, ""},
		{`\uFFFF`, 0, 0xffff, 6, ""},
		{`\ud83d\ude00`, 0, '😀', 12, ""},
		{`\uD83D\uDE00rest`, 0, '😀', 12, ""},
		{`\u004`, 0, 0, 0, `invalid \u escape at offset 0 (want four hex digits)`},
		{`a\u00g1`, 1, 0, 0, `invalid \u escape at offset 1 (want four hex digits)`},
		{`\ud83d`, 0, 0, 0, `invalid \u escape at offset 0 (unpaired surrogate)`},
		{`\ud83dxx`, 0, 0, 0, `invalid \u escape at offset 0 (unpaired surrogate)`},
		{`\ud83d\u0041`, 0, 0, 0, `invalid \u escape at offset 0 (unpaired surrogate)`},
		{`\ude00\ud83d`, 0, 0, 0, `invalid \u escape at offset 0 (unpaired surrogate)`},
		{`\ud83d\ude0`, 0, 0, 0, `invalid \u escape at offset 0 (unpaired surrogate)`},
	}
	for _, tt := range tests {
		r, n, err := pathUnicodeEscape(tt.s, tt.i)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("pathUnicodeEscape(%q, %d): error %v, want %q", tt.s, tt.i, err, tt.wantErr)
			}
			continue
		}
		if err != nil || r != tt.r || n != tt.n {
			t.Errorf("pathUnicodeEscape(%q, %d) = %q, %d, %v; want %q, %d", tt.s, tt.i, r, n, err, tt.r, tt.n)
		}
	}
}

func TestAppendPathEscape(t *testing.T) {
	tests := []struct {
		s       string // the quoted name's '[' is at 0, the escape at 3
		out     string
		next    int
		wantErr string
	}{
		{`["a\"b"]`, `"`, 5, ""},
		{`["a\\b"]`, `\`, 5, ""},
		{`["a\/b"]`, `/`, 5, ""},
		{`["a\bb"]`, "\b", 5, ""},
		{`["a\fb"]`, "\f", 5, ""},
		{`["a\nb"]`, "\n", 5, ""},
		{`["a\rb"]`, "\r", 5, ""},
		{`["a\tb"]`, "\t", 5, ""},
		{`["a\u00e9b"]`, "é", 9, ""},
		{`["a\ud83d\ude00"]`, "😀", 15, ""},
		{`["a\`, "", 0, "unterminated quoted member name starting at offset 0"},
		{`["a\x"]`, "", 0, `invalid escape "\\x" at offset 3`},
		{`["a\u12"]`, "", 0, `invalid \u escape at offset 3 (want four hex digits)`},
	}
	for _, tt := range tests {
		b, next, err := appendPathEscape([]byte("pre"), tt.s, 0, 3)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("appendPathEscape(%q): error %v, want %q", tt.s, err, tt.wantErr)
			}
			continue
		}
		if err != nil || string(b) != "pre"+tt.out || next != tt.next {
			t.Errorf("appendPathEscape(%q) = %q, %d, %v; want %q, %d", tt.s, b, next, err, "pre"+tt.out, tt.next)
		}
	}
}

func TestErrAfterQuotedName(t *testing.T) {
	tests := []struct {
		s    string // the quoted name's '[' is at 1, its closing quote at 4
		want string
	}{
		{`a["x"`, `unterminated "[" at offset 1`},
		{`a["x"x`, `unexpected "x" at offset 5 (want "]" after the quoted member name)`},
		{`a["x".b`, `unexpected "." at offset 5 (want "]" after the quoted member name)`},
		{"a[\"x\"\xff", `unexpected byte 0xff at offset 5 (want "]" after the quoted member name)`},
	}
	for _, tt := range tests {
		if got := errAfterQuotedName(tt.s, 1, 5).Error(); got != tt.want {
			t.Errorf("errAfterQuotedName(%q) = %q, want %q", tt.s, got, tt.want)
		}
	}
}

// notPlain8 finds the first byte of eight that is not strPlain, wherever it
// is and whatever follows it (borrows from it may mark the bytes above).
func TestNotPlain8FindsTheFirstByteThatIsNotPlain(t *testing.T) {
	after := []byte{'a', 0x00, '"', '\\', 0x1f, 0x80, 0xff, ' '}
	for pos := 0; pos <= 8; pos++ {
		for c := 0; c < 256; c++ {
			for _, a := range after {
				var b [8]byte
				for k := range b {
					b[k] = "~ !#[]az"[k] // plain, at the edges of the ranges
					if k > pos {
						b[k] = a
					}
				}
				if pos < 8 {
					b[pos] = byte(c)
				}
				want := 8
				for k := range b {
					if !strPlain[b[k]] {
						want = k
						break
					}
				}
				m := notPlain8(binary.LittleEndian.Uint64(b[:]))
				got := 8
				if m != 0 {
					got = bits.TrailingZeros64(m) >> 3
				}
				if got != want {
					t.Fatalf("%q: first byte not plain at %d, want %d", b, got, want)
				}
			}
		}
	}
}
