package main

import (
	"fmt"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// configKey is one key of the configuration and its default, written the
// way docs/configuration.md writes it.
type configKey struct {
	path, value string
}

// configKeys walks cfg by its yaml tags, as the loader reads it: inline
// sections add no level, "-" fields are not keys, and a field without a tag
// is its lower-cased name.
func configKeys(v reflect.Value, prefix string) []configKey {
	var out []configKey
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			out = append(out, configKeys(v.Field(i), prefix)...)
			continue
		}
		if tag == "-" {
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		path := tag
		if prefix != "" {
			path = prefix + "." + tag
		}
		if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Duration]() {
			out = append(out, configKeys(v.Field(i), path)...)
			continue
		}
		out = append(out, configKey{path, docValue(v.Field(i))})
	}
	return out
}

// docValue writes a default as the manual does: durations short (5m, not
// 5m0s), lists in brackets, an empty string as "".
func docValue(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case time.Duration:
		s := x.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
		return s
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			return `""`
		}
		return v.String()
	case reflect.Slice:
		var items []string
		for i := range v.Len() {
			items = append(items, docValue(v.Index(i)))
		}
		return "[" + strings.Join(items, ", ") + "]"
	case reflect.Map:
		if v.Len() == 0 {
			return "{}"
		}
	}
	return fmt.Sprint(v.Interface())
}

// docRow is a row of a key table in docs/configuration.md: | `key` | `default` | meaning |.
var docRow = regexp.MustCompile("^\\| `([a-z0-9_.]+)` \\| `([^`]*)` \\|")

// TestConfigurationDocMatchesDefaults: docs/configuration.md names every
// key of the configuration with its default, and no key that is not one.
func TestConfigurationDocMatchesDefaults(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]string{}
	var order []string
	for _, line := range strings.Split(string(b), "\n") {
		m := docRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if _, dup := doc[m[1]]; dup {
			t.Errorf("docs/configuration.md: %s has two rows", m[1])
		}
		doc[m[1]], order = m[2], append(order, m[1])
	}
	host, _ := os.Hostname()
	keys := configKeys(reflect.ValueOf(DefaultConfig()), "")
	known := map[string]bool{}
	for _, k := range keys {
		known[k.path] = true
		want := k.value
		if k.path == "mqtt.client_id" && host != "" {
			want = strings.Replace(want, host, "<host>", 1)
		}
		got, ok := doc[k.path]
		switch {
		case !ok:
			t.Errorf("docs/configuration.md: no row for %s (default `%s`)", k.path, want)
		case got != want:
			t.Errorf("docs/configuration.md: %s default `%s`, want `%s`", k.path, got, want)
		}
	}
	for _, k := range order {
		if !known[k] {
			t.Errorf("docs/configuration.md: %s is not a key of the configuration", k)
		}
	}
	if len(keys) < 50 || !slices.ContainsFunc(keys, func(k configKey) bool { return k.path == "redis.tls.ca_file" }) {
		t.Errorf("walked %d keys, redis.tls.ca_file among them? The walk misses sections", len(keys))
	}
}
