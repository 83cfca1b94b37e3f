package yamlenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Load reads the YAML file at path (none when empty) into cfg, a pointer
// to a struct, then the variables of env ("K=V" pairs) that start with
// prefix and an underscore.
func Load(cfg any, path, prefix string, env []string) error {
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(cfg); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("config %s: %w", path, err)
		}
	}
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, prefix+"_") {
			vars[k] = v
		}
	}
	return overlayEnv(reflect.ValueOf(cfg).Elem(), prefix, vars)
}

func overlayEnv(v reflect.Value, prefix string, vars map[string]string) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		fv := v.Field(i)
		if opts == "inline" {
			if err := overlayEnv(fv, prefix, vars); err != nil {
				return err
			}
			continue
		}
		if tag == "" || tag == "-" {
			continue
		}
		name := prefix + "_" + strings.ToUpper(tag)
		if f.Type.Kind() == reflect.Struct {
			if err := overlayEnv(fv, name, vars); err != nil {
				return err
			}
			continue
		}
		s, ok := vars[name]
		if !ok {
			continue
		}
		if err := setFromString(fv, s); err != nil {
			return fmt.Errorf("config: %s=%q: %w", name, s, err)
		}
	}
	return nil
}

func setFromString(fv reflect.Value, s string) error {
	switch fv.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
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
			dur, err := time.ParseDuration(d)
			if err != nil {
				return err
			}
			m[k] = dur
		}
		fv.Set(reflect.ValueOf(m))
		return nil
	}
	switch fv.Kind() {
	case reflect.String:
		fv.SetString(s)
	case reflect.Int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return err
		}
		fv.SetInt(int64(n))
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		fv.SetBool(b)
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return err
		}
		fv.SetFloat(f)
	default:
		return fmt.Errorf("unsupported type %s", fv.Type())
	}
	return nil
}
