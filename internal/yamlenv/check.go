package yamlenv

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// checker walks a YAML document beside the struct it fills, collecting
// each unknown key and each value of the wrong kind as "file:line: key:
// what is wrong", the way the user wrote it.
type checker struct {
	file string
	root reflect.Type
	errs []error
}

func (c *checker) bad(n *yaml.Node, format string, a ...any) {
	c.errs = append(c.errs, fmt.Errorf("%s:%d: %s", c.file, n.Line, fmt.Sprintf(format, a...)))
}

func (c *checker) check(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if c.root == nil {
		c.root = t
	}
	if n.Tag == "!!null" {
		return // an empty value keeps the default
	}
	switch {
	case t == durationType:
		if n.Kind != yaml.ScalarNode {
			c.bad(n, "%s: want a duration such as 30s, got %s", path, kindWords(n))
		} else if _, err := parseDuration(n.Value); err != nil {
			c.bad(n, "%s: %s is %s", path, n.Value, err)
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			c.bad(n, "%s: want a section of keys (one key: value per line below it), got %s", nameOr(path), kindWords(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			ft, ok := fieldType(t, k.Value)
			if !ok {
				c.bad(k, "%s", c.unknown(t, path, k.Value))
				continue
			}
			c.check(v, ft, p)
		}
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			c.bad(n, "%s: want key: value pairs, got %s", path, kindWords(n))
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			c.check(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value))
		}
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			c.bad(n, "%s: want a list, e.g. [a, b], got %s", path, kindWords(n))
			return
		}
		for i, e := range n.Content {
			c.check(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
		}
	default:
		c.scalar(n, t, path)
	}
}

func (c *checker) scalar(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.ScalarNode {
		c.bad(n, "%s: want %s, got %s", path, typeWords(t), kindWords(n))
		return
	}
	var ok bool
	switch t.Kind() {
	case reflect.String:
		ok = true
	case reflect.Bool:
		ok = n.Tag == "!!bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		ok = n.Tag == "!!int"
	case reflect.Float32, reflect.Float64:
		ok = n.Tag == "!!int" || n.Tag == "!!float"
	default:
		ok = true // the decoder has the last word
	}
	if !ok {
		c.bad(n, "%s: want %s, got %s", path, typeWords(t), kindWords(n))
	}
}

// unknown says that key is not one of section t's keys (at path) and
// which key was likely meant.
func (c *checker) unknown(t reflect.Type, path, key string) string {
	msg := join(path, key) + " is not a setting"
	if s := closest(key, fieldNames(t)); s != "" {
		return msg + ": did you mean " + join(path, s) + "?"
	}
	// The right key in the wrong section.
	if p := findKey(c.root, "", key); p != "" {
		return msg + ": did you mean " + p + "?"
	}
	if path == "" {
		return msg + " (the sections are " + strings.Join(fieldNames(t), ", ") + ")"
	}
	return msg + " (" + path + " has " + strings.Join(fieldNames(t), ", ") + ")"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func nameOr(path string) string {
	if path == "" {
		return "the file"
	}
	return path
}

// fieldType is the type of the field of struct t whose YAML key is key.
func fieldType(t reflect.Type, key string) (reflect.Type, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			if ft, ok := fieldType(f.Type, key); ok {
				return ft, true
			}
			continue
		}
		if tag == key && tag != "" && tag != "-" {
			return f.Type, true
		}
	}
	return nil, false
}

// fieldNames are the YAML keys of struct t, in their order.
func fieldNames(t reflect.Type) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			out = append(out, fieldNames(f.Type)...)
		} else if tag != "" && tag != "-" {
			out = append(out, tag)
		}
	}
	return out
}

// findKey is the path of the first key named key in another section of
// t, or "".
func findKey(t reflect.Type, path, key string) string {
	for _, name := range fieldNames(t) {
		ft, _ := fieldType(t, name)
		if name == key && path != "" {
			return join(path, name)
		}
		if ft.Kind() == reflect.Struct && ft != durationType {
			if p := findKey(ft, join(path, name), key); p != "" {
				return p
			}
		}
	}
	return ""
}

// kindWords says what a YAML value is, in plain words.
func kindWords(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a section of keys"
	}
	switch n.Tag {
	case "!!int", "!!float":
		return "the number " + n.Value
	case "!!bool":
		return n.Value
	}
	return fmt.Sprintf("the text %q", n.Value)
}

// typeWords says what a field of type t takes, in plain words.
func typeWords(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "text"
	}
	return "a single value"
}

// closest is the candidate nearest to s, if it is near enough to be a
// typo of it: at most a third of s's letters apart (transpositions count
// as one), and at least one.
func closest(s string, candidates []string) string {
	best, bestD := "", max(1, len(s)/3)+1
	for _, c := range slices.Sorted(slices.Values(candidates)) {
		if d := distance(strings.ToLower(s), strings.ToLower(c)); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// Closest is the candidate nearest to s if it is near enough to be a typo
// of it, else "": the suggestion of a "did you mean" beyond config keys.
func Closest(s string, candidates []string) string { return closest(s, candidates) }

// distance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and adjacent transpositions.
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
