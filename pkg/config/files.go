package config

import (
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
)

// FileSettings returns the settings of c that name a file (the string keys
// whose name ends in "File", e.g. nats.credentialsFile, nats.tls.caFile,
// nats.index.fingerprintKeyFile) and are set, as key path -> path.
func (c *Config) FileSettings() map[string]string {
	out := map[string]string{}
	fileKeys(reflect.ValueOf(c).Elem(), "", out)
	return out
}

func fileKeys(v reflect.Value, path string, out map[string]string) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		key := joinKey(path, name)
		fv := v.Field(i)
		switch {
		case fv.Kind() == reflect.String && strings.HasSuffix(name, "File") && fv.String() != "":
			out[key] = fv.String()
		case fv.Kind() == reflect.Struct:
			fileKeys(fv, key, out)
		case fv.Kind() == reflect.Pointer && fv.Type().Elem().Kind() == reflect.Struct && !fv.IsNil():
			fileKeys(fv.Elem(), key, out)
		}
	}
}

// relativeFiles are the warnings about file settings given as relative
// paths: relayd resolves them against its working directory, which in a
// pod is the image's (/ for relayd's image), rarely what was meant.
func (c *Config) relativeFiles() []Problem {
	var ws []Problem
	files := c.FileSettings()
	for _, key := range slices.Sorted(maps.Keys(files)) {
		if p := files[key]; !filepath.IsAbs(p) {
			ws = append(ws, Problem{Path: key, Message: fmt.Sprintf(
				"%q is a relative path, read from relayd's working directory (in a pod, the image's); use an absolute path such as the mount path of its Secret", p)})
		}
	}
	return ws
}
