package history

import "testing"

// unencodableRun is a run where "big" fits the max payload only without
// data: publish relays each of its changes flagged, unless skip says
// which of them relayd skipped (the behaviour trace.go forbids) or plain
// which it sent unflagged.
func unencodableRun(skip, plain map[int]bool) *syn {
	s := newSyn()
	s.h.Unencodable = []string{"cms/big"}
	ops := [][2]string{{"create", "a"}, {"create", "big"}, {"update", "big"}, {"update", "a"}, {"delete", "big"}}
	for i, op := range ops {
		ch := s.write(op[0], op[1])
		if skip[i] {
			continue
		}
		s.publish(ch, "watch")
		if ch.Name == "big" && !plain[i] {
			s.h.Stream[len(s.h.Stream)-1].Unencodable = true
		}
	}
	s.final()
	return s
}

func TestUnencodableChangesTraced(t *testing.T) {
	r := Check(&unencodableRun(nil, nil).h)
	wantOnly(t, r, map[string]int{})
	if r.Unencodable != 3 || r.UnencodableTraced != 3 {
		t.Errorf("Unencodable %d, UnencodableTraced %d, want 3 and 3: %s", r.Unencodable, r.UnencodableTraced, r.Summary())
	}
}

// The old behaviour: the change is logged, counted and skipped, the
// position moves on. It is lost, and untraced.
func TestSkippedUnencodableChangeIsCaught(t *testing.T) {
	r := Check(&unencodableRun(map[int]bool{2: true}, nil).h)
	wantOnly(t, r, map[string]int{"lost": 1, "untraced": 1})
	if r.UnencodableTraced != 2 {
		t.Errorf("UnencodableTraced %d, want 2", r.UnencodableTraced)
	}
}

func TestUnflaggedEventOfUnencodableObjectIsCaught(t *testing.T) {
	r := Check(&unencodableRun(nil, map[int]bool{4: true}).h)
	wantOnly(t, r, map[string]int{"unflagged": 1})
}

func TestMalformedUnencodableNameIsCaught(t *testing.T) {
	s := unencodableRun(nil, nil)
	s.h.Unencodable = append(s.h.Unencodable, "big")
	wantOnly(t, Check(&s.h), map[string]int{"untraced": 1})
}
