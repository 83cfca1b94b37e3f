package yamlenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Load reads the YAML file at path (none when empty) into cfg, a pointer
// to a struct, then the variables of env ("K=V" pairs) that start with
// prefix and an underscore. A variable of that prefix that names no
// setting is refused unless it is one of notSettings (variables the
// program reads for other purposes). Load returns the names of the
// variables it applied. Every error names the key as the user wrote it
// (file and line, or the variable) in plain words.
func Load(cfg any, path, prefix string, env []string, notSettings ...string) ([]string, error) {
	v := reflect.ValueOf(cfg).Elem()
	if path != "" {
		if err := loadFile(v, path); err != nil {
			return nil, err
		}
	}
	fields := map[string]reflect.Value{}
	envFields(v, prefix, fields)
	var applied []string
	var errs []error
	for _, kv := range env {
		k, s, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, prefix+"_") || slices.Contains(notSettings, k) {
			continue
		}
		fv, ok := fields[k]
		if !ok {
			// The prefix is not part of the guess: every candidate shares it.
			var known []string
			for _, n := range append(slices.Collect(maps.Keys(fields)), notSettings...) {
				known = append(known, strings.TrimPrefix(n, prefix+"_"))
			}
			msg := k + " is not a setting"
			if s := closest(strings.TrimPrefix(k, prefix+"_"), known); s != "" {
				msg += ": did you mean " + prefix + "_" + s + "?"
			} else {
				msg += fmt.Sprintf(": a setting's variable is its key in capitals, e.g. %s_REDIS_ADDRS for redis.addrs", prefix)
			}
			errs = append(errs, errors.New(msg))
			continue
		}
		if err := setFromString(fv, s); err != nil {
			errs = append(errs, fmt.Errorf("%s=%s: %w", k, s, err))
			continue
		}
		applied = append(applied, k)
	}
	slices.Sort(applied)
	return slices.Compact(applied), errors.Join(errs...)
}

func loadFile(v reflect.Value, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	c := checker{file: path}
	if len(doc.Content) > 0 {
		c.check(doc.Content[0], v.Type(), "")
	}
	if err := errors.Join(c.errs...); err != nil {
		return err
	}
	// The check above has seen every key and value; the decoder's own
	// refusal is a backstop for what it does not know.
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(v.Addr().Interface()); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	return nil
}

// envFields maps each setting's variable name to its field: the YAML path
// in capitals, dots as underscores.
func envFields(v reflect.Value, prefix string, out map[string]reflect.Value) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		fv := v.Field(i)
		if opts == "inline" {
			envFields(fv, prefix, out)
			continue
		}
		if tag == "" || tag == "-" {
			continue
		}
		name := prefix + "_" + strings.ToUpper(tag)
		if f.Type.Kind() == reflect.Struct && f.Type != durationType {
			envFields(fv, name, out)
			continue
		}
		out[name] = fv
	}
}

var durationType = reflect.TypeFor[time.Duration]()

// errBareNumber is a duration without its unit.
func errBareNumber(s string) error {
	return fmt.Errorf("not a duration: add a unit, e.g. %ss", s)
}

func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err == nil {
		return d, nil
	}
	if _, e := strconv.ParseFloat(s, 64); e == nil {
		return 0, errBareNumber(s)
	}
	return 0, errors.New("not a duration: write it like 30s, 5m or 1h30m")
}

func setFromString(fv reflect.Value, s string) error {
	switch fv.Interface().(type) {
	case time.Duration:
		d, err := parseDuration(s)
		if err != nil {
			return err
		}
		fv.SetInt(int64(d))
		return nil
	case []string:
		var out []string
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		fv.Set(reflect.ValueOf(out))
		return nil
	case map[string]time.Duration:
		m := map[string]time.Duration{}
		for _, p := range strings.Split(s, ",") {
			k, d, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok {
				return errors.New("want type=duration pairs separated by commas, e.g. tracker=2m,meter=15m")
			}
			dur, err := parseDuration(d)
			if err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
			m[k] = dur
		}
		fv.Set(reflect.ValueOf(m))
		return nil
	}
	switch fv.Kind() {
	case reflect.String:
		fv.SetString(s)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return errors.New("not a whole number")
		}
		fv.SetInt(n)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return errors.New("not true or false")
		}
		fv.SetBool(b)
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return errors.New("not a number")
		}
		fv.SetFloat(f)
	default:
		return fmt.Errorf("cannot be set from the environment: set it in the config file")
	}
	return nil
}
