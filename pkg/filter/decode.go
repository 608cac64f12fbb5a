package filter

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// unmarshalNumbers is json.Unmarshal keeping numbers as json.Number.
func unmarshalNumbers(data []byte, v *any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("invalid JSON: data after the value")
	}
	return nil
}
