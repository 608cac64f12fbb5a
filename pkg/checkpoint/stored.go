package checkpoint

// Stored returns key's position as its checkpoint ConfigMap holds it (as
// this store last read or wrote it: where a restart resumes), and whether
// there is one. Unlike Get, progress not yet written is not in it. It
// reads only memory (the heartbeats', pkg/heartbeat).
func (s *Store) Stored(key string) (Position, bool) {
	s.mu.Lock()
	raw := ""
	if st, ok := s.keys[key]; ok {
		raw = st.storedRaw
	}
	s.mu.Unlock()
	if raw == "" {
		return Position{}, false
	}
	p, err := decode(raw)
	return p, err == nil
}
